// The pieces of one training step, internal to the trainer library (they
// use LibTorch, which trainer.h keeps private). In order, for one rank:
//
//   NextStepBatch    the step's rows from the data cursor, and this rank's
//                    micro-batches of them
//   ForwardBackward  loss and gradients accumulated over those micro-batches,
//                    with the step's MoE routing loads (StepTotals)
//   (data parallel: the trainer sums StepTotals over the ranks, see
//   dist/step_reduce.h)
//   ReportMoeLoads,  the step's metrics from its totals; Fp8Health says
//   Fp8Report        whether FP8 scaling is still sound
//
// The optimizer and clipping are in optimizer.h, the run's position in
// train_state.h. Thread-compatible.
#ifndef TALLY_WORKER_TRAIN_STEP_H_
#define TALLY_WORKER_TRAIN_STEP_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/dist/grad_sync.h"
#include "worker/dist/step_reduce.h"
#include "worker/model/transformer.h"
#include "worker/precision/fp8.h"
#include "worker/train/trainer.h"

namespace tally::train {

struct DeviceBatch {
  model::ModelInput input;
  at::Tensor targets_N;
};

DeviceBatch ToDevice(const data::MicroBatch& b, at::Device device);

struct Losses {
  at::Tensor ce_sum;  // cross-entropy summed over the batch's target tokens, FP32
  at::Tensor logits_NV;  // the logits, one row a token (in the graph)
  at::Tensor aux;     // MoE load-balancing loss (undefined when dense)
  at::Tensor z;       // MoE router z-loss
  std::vector<model::MoeLayerStats> moe;
};

// One forward pass and its summed loss (training and evaluation alike).
Losses LossSum(const model::Transformer& m, const DeviceBatch& d, model::AttentionKernel kernel);

// Distillation: KL(teacher || student), both softened by `temperature`,
// summed over the tokens that have a target (targets_N not kIgnoreTarget),
// in FP32 whatever the logits' dtype. Differentiable in the student's
// logits; the teacher's are taken as constants.
at::Tensor DistillKlSum(const at::Tensor& student_NV, const at::Tensor& teacher_NV,
                        const at::Tensor& targets_N, double temperature);

struct StepBatch {
  std::vector<data::MicroBatch> micro;  // this rank's
  int64_t targets = 0;                  // target tokens of the whole step (every rank's)
  int64_t real_tokens = 0;              // this rank's
  int64_t padding_tokens = 0;           // this rank's
  // Query-key pairs causal attention computes over the step's documents
  // (L(L+1)/2 for a document of L tokens), every rank's: executed FLOPs.
  double attended_keys = 0;
};

// The step's `micro_per_step` micro-batches of rows from `rows`. Every rank
// walks all of them (the cursor stays global) and builds only its own: the
// i-th goes to rank i % world_size.
StepBatch NextStepBatch(const TrainConfig& c, int64_t micro_per_step,
                        const data::Dataset& train, data::RowStream* rows);

// What a step adds up: this rank's, until the ranks sum them.
struct StepTotals {
  double loss_sum = 0;      // cross-entropy over target tokens
  double aux_loss_sum = 0;  // MoE load-balancing loss, a mean over the step
  double distill_kl_sum = 0;  // KL(teacher || student) over target tokens
  int64_t real_tokens = 0;
  int64_t padding_tokens = 0;
  std::map<int64_t, dist::MoeLayerLoad> moe;  // by layer
  precision::Fp8Stats fp8;
  double sharded_grad_square_sum = 0;  // set by the sum over ranks
};

// What a step computes with.
struct StepModel {
  model::Transformer* model;
  at::Device device;
  model::AttentionKernel kernel;
  dist::GradientSync* sync;  // null with one rank
  // CUDA: the passes under sync-debug mode "error" (TrainConfig::
  // test_sync_check).
  bool sync_check = false;
  // Distillation (TrainConfig::distill): the teacher, forward only, on the
  // same micro-batches; the loss becomes alpha * KL * T^2 + (1 - alpha) *
  // cross-entropy (each a mean over the step's target tokens). Null: none.
  const model::Transformer* teacher = nullptr;
  double temperature = 1;
  double alpha = 0;
};

// Forward and backward over the batch's micro-batches: gradients accumulate
// in the parameters (the loss is a mean over every rank's target tokens of
// the step; the MoE losses a share per micro-batch), and the last backward
// arms `sync`. Losses are summed on the device and read once. nullopt when
// `stop_now` says so before a micro-batch (nothing more is computed).
std::optional<StepTotals> ForwardBackward(const TrainConfig& c, int64_t micro_per_step,
                                          const StepBatch& batch, const StepModel& m,
                                          const std::function<bool()>& stop_now);

// Sum of squares of the gradients of the expert-sharded parameters (0 when
// there are none), read in one go.
double ShardedGradSquareSum(const std::vector<model::Parameter>& params);

// Per MoE layer, its loads, dropped fraction and max-over-mean load, and the
// worst layer's.
void ReportMoeLoads(const std::map<int64_t, dist::MoeLayerLoad>& moe, StepMetrics* m);

struct Fp8Health {
  bool amax_finite = true;
  double overflow_fraction = 0;  // of the values cast
  // Sound while every amax is finite and at most 1% of the values overflow.
  bool good() const { return amax_finite && overflow_fraction <= 0.01; }
};

// The step's FP8 statistics into `m`, and whether they are sound.
Fp8Health Fp8Report(const precision::Fp8Stats& st, StepMetrics* m);

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_STEP_H_
