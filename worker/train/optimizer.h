// The trainer's optimizer and gradient clipping, internal to the trainer
// library (they use LibTorch, which trainer.h keeps private).
//
// AdamW with decoupled weight decay (Loshchilov & Hutter): FP32 moments, one
// pair per parameter, decay only where model::Parameter::weight_decay says
// (not embeddings and norms). A parameter with no gradient this step is left
// as it is, moments included.
//
// Two ways to run it: per parameter (a few ATen operations each; the CPU's
// way, which the golden losses are of), or fused: every parameter in one
// multi-tensor kernel (at::_fused_adamw_; two launches, with and without
// decay), with the gradient norm, the clipping and the decision to skip a
// non-finite step all on the device, so a step needs no value from the host
// (CUDA's way).
//
// Thread-compatible; the parameters must outlive the optimizer.
#ifndef TALLY_WORKER_TRAIN_OPTIMIZER_H_
#define TALLY_WORKER_TRAIN_OPTIMIZER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "worker/model/transformer.h"

namespace tally::train {

// OptimizerConfig's (trainer.h) fields of the same names.
struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
};

class AdamW {
 public:
  AdamW(std::vector<model::Parameter>* params, AdamWOptions options, bool fused = false);

  // One update of every parameter with a gradient, at learning rate `lr`.
  void Step(double lr);
  // Fused: the same update of every parameter with a gradient, skipped on
  // the device where `skip` (one FP32 value, nonzero: skip) says so; the
  // step count moves with it there. The host's count moves by one; once the
  // host knows the step was skipped, Unstep() takes it back.
  void StepFused(double lr, const at::Tensor& skip);
  void Unstep() { --step_; }
  bool fused() const { return fused_; }

  // Updates taken, for bias correction (a checkpoint keeps it).
  int64_t step() const { return step_; }
  void set_step(int64_t s);
  // First and second moments, by parameter index (a checkpoint keeps them).
  std::vector<at::Tensor>& m() { return m_; }
  std::vector<at::Tensor>& v() { return v_; }

 private:
  std::vector<model::Parameter>* params_;
  AdamWOptions options_;
  std::vector<at::Tensor> m_, v_;
  int64_t step_ = 0;
  bool fused_;
  at::Tensor step_device_;  // fused: the count the kernel corrects with (FP32)
};

// The L2 norm of every gradient of `params` together: the replicated
// parameters' gradients here, plus `sharded_grad_square_sum` for the
// expert-sharded ones (summed over the ranks beforehand). A NaN anywhere
// reaches the result.
double GradientNorm(const std::vector<model::Parameter>& params,
                    double sharded_grad_square_sum);

// Scales every gradient so that their norm, `grad_norm`, is at most
// `max_norm`; nothing when it already is, or when `max_norm` is 0 (no
// clipping).
void ClipGradients(std::vector<model::Parameter>* params, double grad_norm, double max_norm);

// The same two on the device, with nothing read: the norm as one FP32 value
// (multi-tensor norms, then theirs), and the clipping by a factor computed
// there (1 where the norm is at most max_norm).
at::Tensor GradientNormOnDevice(const std::vector<model::Parameter>& params,
                                double sharded_grad_square_sum);
void ClipGradientsOnDevice(std::vector<model::Parameter>* params, const at::Tensor& grad_norm,
                           double max_norm);

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_OPTIMIZER_H_
