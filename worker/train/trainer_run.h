// The trainer's run, inside: one Train() call is one Run. The class is
// here only so that its parts (the step loop in trainer.cc, set-up in
// trainer_setup.cc, checkpoints in trainer_checkpoint.cc) can live in files
// of their own; nothing outside worker/train includes this header, and
// Train() (trainer.h) is the interface.
#ifndef TALLY_WORKER_TRAIN_TRAINER_RUN_H_
#define TALLY_WORKER_TRAIN_TRAINER_RUN_H_

#include "worker/train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model_flops.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/eval_sample.h"
#include "worker/data/tokenizer.h"
#include "worker/dist/expert_parallel.h"
#include "worker/dist/grad_sync.h"
#include "worker/dist/group.h"
#include "worker/dist/step_reduce.h"
#include "worker/model/ggml_quant.h"
#include "worker/model/transformer.h"
#include "worker/precision/autocast.h"
#include "worker/precision/fp8.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checksum_file.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/model_io.h"
#include "worker/train/optimizer.h"
#include "worker/train/step.h"
#include "worker/train/train_state.h"


namespace tally::train::internal {

using Clock = std::chrono::steady_clock;

inline double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class Run {
 public:
  Run(const TrainConfig& c, TrainEvents* events, const StopFlag* stop)
      : c_(c), events_(events), stop_(stop), device_(c.device) {}

  TrainResult Go();
  int64_t step() const { return state_.step; }

 private:
  // Set-up, in Go's order. The training and validation data, and the data
  // cursor.
  std::optional<TrainResult> OpenData();
  // The model (this rank's experts under expert parallelism), its optimizer
  // and FP8 linears.
  void BuildModel();
  // With several ranks (or a rendezvous): the process group, gradient
  // buckets and expert exchange; checks that the ranks start alike.
  std::optional<TrainResult> JoinGroup();
  RunInfo Info() const;
  bool expert_parallel() const {
    return c_.parallel.expert_parallel && c_.model.moe.num_experts > 0 &&
           c_.parallel.world_size > 1;
  }

  // One step: its batch, forward and backward, the sum over ranks, the
  // update, the report, then what follows it. A result ends the run.
  std::optional<TrainResult> TrainStep(TrainEvents* report, NonFiniteGuard* guard,
                                       NonFiniteGuard* fp8_guard);
  // Data parallel: the step's totals summed over the ranks in one
  // collective (dist/step_reduce.h), with their stop votes; gradients
  // every rank agrees exist; the FP8 amax the largest any rank saw. How the
  // group ends the step; on kStopNow nothing else is summed.
  absl::StatusOr<dist::StepEnd> ReduceStep(StepTotals* t);
  // The gradient norm, the non-finite and FP8 guards, clipping, the
  // optimizer step and the MoE bias nudge, into `m`; a result when a guard
  // fails the run.
  std::optional<TrainResult> ApplyStep(const StepTotals& t, NonFiniteGuard* guard,
                                       NonFiniteGuard* fp8_guard, StepMetrics* m);
  // Once the step is applied and reported: its scheduled evaluation and
  // checkpoint (or parameter check), then a preemption or a stop keeping
  // the state.
  std::optional<TrainResult> AfterStep(dist::StepEnd end, TrainEvents* report);

  TrainResult Fail(std::string reason, bool retryable) {
    return {TrainResult::Outcome::kFailed, std::move(reason), state_.step, retryable};
  }
  TrainResult Stopped(const std::string& detail = "") const {
    return {TrainResult::Outcome::kStopped, absl::StrCat("stopped at step ", state_.step, detail),
            state_.step, false};
  }
  // A stop that keeps the state (stop.h): every rank calls it at the same
  // step boundary.
  TrainResult StopKeepingState(TrainEvents* report);
  // A preemption (stop.h): every rank calls it at the same step boundary.
  TrainResult StopPreempting();
  TrainResult Preempted(const std::string& detail) const {
    // Retryable: another attempt resumes it (tallyd requeues a preemption
    // without counting it against max_attempts).
    return {TrainResult::Outcome::kPreempted,
            absl::StrCat("preempted at step ", state_.step, detail), state_.step, true};
  }
  // Checks that the ranks' parameters agree, gathers sharded experts and
  // writes a checkpoint of this step on rank 0. Every rank calls it; a
  // failure to report otherwise.
  std::optional<TrainResult> CheckpointOnAllRanks();
  EvalMetrics Evaluate();
  // One pass over the evaluation sample with the model as it is set now.
  EvalMetrics ScoreEvalSample();
  // Evaluate() and report it. A loss that is not finite at this run's first
  // evaluation (the weights it started from overflow: init_from, a resumed
  // checkpoint) is a failure instead, never reported; after a finite one it
  // is reported like any other, and the controller's divergence rule stops
  // the job keeping its best checkpoint. Every rank sees the same summed
  // loss, so all decide alike.
  std::optional<TrainResult> EvaluateAndReport(TrainEvents* report);
  bool evaluated_finite_ = false;  // this run has reported a finite evaluation
  // "PARAM (largest |weight| X)": the parameter with the largest magnitude,
  // for a failure the weights may explain.
  std::string LargestWeight();
  bool lead() const { return c_.parallel.rank == 0; }
  // Sums `v` over the ranks (a no-op with one rank).
  void SumOverRanks(std::vector<double>* v);
  // FailedPrecondition naming the first parameter whose value differs
  // between ranks.
  absl::Status CheckParametersAgree();
  // Expert parallelism: each sharded parameter whole again, with its AdamW
  // moments (value, m, v), by parameter index, on rank 0 (in host memory);
  // empty elsewhere and without sharding. Every rank takes part.
  std::map<size_t, std::array<at::Tensor, 3>> GatherShards();
  absl::Status SaveCheckpoint(const std::map<size_t, std::array<at::Tensor, 3>>& whole);
  absl::Status LoadCheckpoint();
  // Copies model.init_from's weights into the model (a fresh run).
  absl::Status LoadInitialWeights(const InitialWeights& w);
  // training.distill: reads the teacher, checks it against the spec's
  // declared shape, the data's tokenizer and the student's vocabulary, and
  // builds it for forward passes only.
  absl::Status LoadTeacher();
  // The training data's tokenizer as checkpoints record it, and a check
  // that `theirs` (a checkpoint's record) is the same.
  nlohmann::json TokenizerJson() const;
  absl::Status CheckTokenizer(const nlohmann::json& theirs, const std::string& source) const;
  // Everything in a checkpoint's metadata and tensors that LoadCheckpoint
  // uses, checked against this run before anything is loaded. Moves the data
  // cursor to the checkpoint's epoch (to count its rows).
  absl::Status CheckCheckpoint(const nlohmann::json& meta,
                               const std::map<std::string, at::Tensor>& tensors);
  // FailedPrecondition naming the first model field in which the
  // checkpoint's fingerprint differs from this run's.
  absl::Status CheckFingerprint(const std::string& theirs) const;
  std::string Fingerprint() const;

  TrainConfig c_;  // a copy: model.init_from completes its model
  nlohmann::json init_from_json_;  // InitialWeights::provenance, kept in checkpoints
  TrainEvents* events_;
  const StopFlag* stop_;
  at::Device device_;
  // BF16 autocast in steps and evaluations: always on CUDA, with `bf16` on
  // the CPU.
  bool autocast_ = device_.is_cuda() || c_.bf16;
  model::AttentionKernel kernel_ = model::AttentionKernel::kMaskedSdpa;
  std::unique_ptr<data::Dataset> train_, val_;
  std::unique_ptr<data::RowStream> rows_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<model::Transformer> teacher_;  // training.distill; forward only
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<precision::Fp8Linears> fp8_;
  data::EvalSample eval_;  // what every evaluation scores (data/eval_sample.h)
  std::unique_ptr<dist::Group> group_;  // null with one rank
  std::unique_ptr<dist::GradientSync> sync_;  // with group_
  std::unique_ptr<dist::Group> expert_group_;    // expert parallelism
  std::unique_ptr<dist::ExpertExchange> exchange_;
  std::unique_ptr<dist::ExpertParallel> experts_;
  TrainState state_;
  int64_t micro_per_step_ = 1;
  double flops_per_token_ = 0;
};

// A resume failure that says the checkpoint file itself is bad (missing,
// cut, a flipped byte, not the recorded SHA-256, contents inconsistent in
// themselves: ReadCheckpoint's NotFound and DataLoss, CheckCheckpoint's
// InvalidArgument), as opposed to an intact one that does not fit this run
// (FailedPrecondition) or this process's trouble reading it.
bool IsCheckpointDamage(const absl::Status& s);

}  // namespace tally::train::internal

#endif  // TALLY_WORKER_TRAIN_TRAINER_RUN_H_
