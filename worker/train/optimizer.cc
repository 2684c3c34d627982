#include "worker/train/optimizer.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

namespace tally::train {

AdamW::AdamW(std::vector<model::Parameter>* params, AdamWOptions options)
    : params_(params), options_(options) {
  for (const auto& p : *params_) {
    m_.push_back(at::zeros_like(p.value));
    v_.push_back(at::zeros_like(p.value));
  }
}

void AdamW::Step(double lr) {
  at::NoGradGuard no_grad;
  const AdamWOptions& o = options_;
  ++step_;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(step_));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(step_));
  for (size_t i = 0; i < params_->size(); ++i) {
    at::Tensor p = (*params_)[i].value;
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if ((*params_)[i].weight_decay && o.weight_decay > 0) p.mul_(1.0 - lr * o.weight_decay);
    m_[i].lerp_(g, 1.0 - o.beta1);
    v_[i].mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    at::Tensor denom = (v_[i].sqrt() / std::sqrt(bc2)).add_(o.eps);
    p.addcdiv_(m_[i], denom, -lr / bc1);
  }
}

double GradientNorm(const std::vector<model::Parameter>& params,
                    double sharded_grad_square_sum) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const auto& p : params) {
    if (!p.sharded && p.value.grad().defined()) {
      norms.push_back(p.value.grad().norm().to(at::kFloat));
    }
  }
  const double replicated = norms.empty() ? 0.0 : at::stack(norms).norm().item<double>();
  // (A NaN in the sharded sum is not 0, so it reaches the norm.)
  return sharded_grad_square_sum == 0
             ? replicated
             : std::sqrt(replicated * replicated + sharded_grad_square_sum);
}

void ClipGradients(std::vector<model::Parameter>* params, double grad_norm, double max_norm) {
  if (max_norm <= 0 || !(grad_norm > max_norm)) return;
  at::NoGradGuard no_grad;
  const double scale = max_norm / (grad_norm + 1e-6);
  for (auto& p : *params) {
    if (p.value.grad().defined()) p.value.mutable_grad().mul_(scale);
  }
}

}  // namespace tally::train
