// The trainer's optimizer and gradient clipping, internal to the trainer
// library (they use LibTorch, which trainer.h keeps private).
//
// AdamW with decoupled weight decay (Loshchilov & Hutter): FP32 moments, one
// pair per parameter, decay only where model::Parameter::weight_decay says
// (not embeddings and norms). A parameter with no gradient this step is left
// as it is, moments included.
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
  AdamW(std::vector<model::Parameter>* params, AdamWOptions options);

  // One update of every parameter with a gradient, at learning rate `lr`.
  void Step(double lr);

  // Updates taken, for bias correction (a checkpoint keeps it).
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  // First and second moments, by parameter index (a checkpoint keeps them).
  std::vector<at::Tensor>& m() { return m_; }
  std::vector<at::Tensor>& v() { return v_; }

 private:
  std::vector<model::Parameter>* params_;
  AdamWOptions options_;
  std::vector<at::Tensor> m_, v_;
  int64_t step_ = 0;
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

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_OPTIMIZER_H_
