#include "worker/train/optimizer.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

namespace tally::train {

AdamW::AdamW(std::vector<model::Parameter>* params, AdamWOptions options, bool fused)
    : params_(params), options_(options), fused_(fused) {
  for (const auto& p : *params_) {
    m_.push_back(at::zeros_like(p.value));
    v_.push_back(at::zeros_like(p.value));
  }
  if (fused_ && !params_->empty()) {
    step_device_ = at::zeros({}, params_->front().value.options().dtype(at::kFloat));
  }
}

void AdamW::set_step(int64_t s) {
  step_ = s;
  if (step_device_.defined()) step_device_.fill_(static_cast<double>(s));
}

void AdamW::StepFused(double lr, const at::Tensor& skip) {
  at::NoGradGuard no_grad;
  const AdamWOptions& o = options_;
  ++step_;
  step_device_.add_(1);
  // The kernel's groups: with decay and without; only parameters with a
  // gradient this step (the host knows which).
  for (const bool decay : {true, false}) {
    std::vector<at::Tensor> p, g, m, v, steps;
    for (size_t i = 0; i < params_->size(); ++i) {
      const model::Parameter& param = (*params_)[i];
      if (!param.value.grad().defined() || (param.weight_decay && o.weight_decay > 0) != decay) {
        continue;
      }
      p.push_back(param.value);
      g.push_back(param.value.grad());
      m.push_back(m_[i]);
      v.push_back(v_[i]);
      steps.push_back(step_device_);
    }
    if (p.empty()) continue;
    at::_fused_adamw_(p, g, m, v, {}, steps, lr, o.beta1, o.beta2, decay ? o.weight_decay : 0.0,
                      o.eps, /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/{},
                      /*found_inf=*/skip);
  }
  step_device_.sub_(skip.reshape({}));
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

at::Tensor GradientNormOnDevice(const std::vector<model::Parameter>& params,
                                double sharded_grad_square_sum) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (!p.sharded && p.value.grad().defined()) grads.push_back(p.value.grad());
  }
  if (grads.empty()) {
    const at::Device device = params.empty() ? at::Device(at::kCPU) : params.front().value.device();
    return at::full({}, std::sqrt(sharded_grad_square_sum),
                    at::TensorOptions().dtype(at::kFloat).device(device));
  }
  at::Tensor norm = at::stack(at::_foreach_norm(grads)).to(at::kFloat).norm();
  if (sharded_grad_square_sum != 0) norm = (norm.square() + sharded_grad_square_sum).sqrt();
  return norm;
}

void ClipGradientsOnDevice(std::vector<model::Parameter>* params, const at::Tensor& grad_norm,
                           double max_norm) {
  if (max_norm <= 0) return;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (auto& p : *params) {
    if (p.value.grad().defined()) grads.push_back(p.value.mutable_grad());
  }
  if (grads.empty()) return;
  const at::Tensor factor =
      at::where(grad_norm.gt(max_norm), max_norm / (grad_norm + 1e-6), at::ones_like(grad_norm));
  at::_foreach_mul_(grads, factor);
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
