#include "worker/precision/scaling.h"

#include <algorithm>
#include <cmath>

namespace tally::precision {

using internal::ReadHost;

double ScaleForAmax(double amax, Fp8Format f, int margin, double previous) {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const double s = Fp8Max(f) / amax / std::pow(2.0, margin);
  return std::isfinite(s) ? s : previous;
}

TensorScaling::TensorScaling(Fp8Format format, const RecipeConfig& config)
    : format_(format), config_(config) {}

double TensorScaling::ScaleFor(const at::Tensor& x, bool record) {
  if (ScaleKnownAhead()) {  // nothing needs the amax now
    if (record) RecordAmax(x.detach().abs().max());
    return scale_;
  }
  const double amax = ReadHost(x.detach().abs().max())[0];
  if (record) {
    last_amax_ = amax;
    if (std::isfinite(amax)) step_amax_ = std::max(step_amax_, amax);
  }
  if (config_.recipe == Recipe::kCurrent || history_.empty()) {
    return ScaleForAmax(amax, format_, config_.margin, scale_);
  }
  return scale_;
}

bool TensorScaling::ScaleKnownAhead() const {
  return config_.recipe == Recipe::kDelayed && !history_.empty();
}

void TensorScaling::RecordAmax(const at::Tensor& amax) {
  at::Tensor a = amax.detach().reshape({}).to(at::kDouble);
  pending_last_ = a;
  at::Tensor finite = at::where(at::isfinite(a), a, at::zeros_like(a));
  pending_step_ = pending_step_.defined() ? at::maximum(pending_step_, finite) : finite;
}

void TensorScaling::Resolve(double last, double step) {
  last_amax_ = last;
  step_amax_ = std::max(step_amax_, step);
  pending_last_ = at::Tensor();
  pending_step_ = at::Tensor();
}

void TensorScaling::Step() {
  if (pending_last_.defined()) {  // Fp8Linears reads them all at once first
    const std::vector<double> v = ReadHost(at::stack({pending_last_, pending_step_}));
    Resolve(v[0], v[1]);
  }
  ++steps_;
  if (config_.recipe == Recipe::kCurrent) {
    step_amax_ = 0;
    return;
  }
  // A tensor that has never seen a value (a declared layer not yet called)
  // starts its history when it first does, as an undeclared one would.
  if (history_.empty() && step_amax_ == 0) return;
  history_.push_back(step_amax_);
  if (static_cast<int>(history_.size()) > config_.history_len) history_.erase(history_.begin());
  const double amax = config_.history_max
                          ? *std::max_element(history_.begin(), history_.end())
                          : history_.back();
  scale_ = ScaleForAmax(amax, format_, config_.margin, scale_);
  step_amax_ = 0;
}

at::Tensor TensorScaling::State() const {
  std::vector<double> v(config_.history_len + 3, 0.0);
  // Oldest first, right-aligned, with the count so a short history is exact.
  for (size_t i = 0; i < history_.size(); ++i) v[i] = history_[i];
  v[config_.history_len] = scale_;
  v[config_.history_len + 1] = static_cast<double>(history_.size());
  v[config_.history_len + 2] = static_cast<double>(steps_);
  return at::tensor(v, at::kDouble);
}

bool TensorScaling::LoadState(const at::Tensor& state) {
  if (state.numel() != config_.history_len + 3 || state.scalar_type() != at::kDouble) {
    return false;
  }
  const double* v = state.data_ptr<double>();
  const int n = static_cast<int>(v[config_.history_len + 1]);
  if (n < 0 || n > config_.history_len) return false;
  history_.assign(v, v + n);
  scale_ = v[config_.history_len];
  steps_ = static_cast<int64_t>(v[config_.history_len + 2]);
  step_amax_ = 0;
  pending_last_ = at::Tensor();
  pending_step_ = at::Tensor();
  return true;
}

}  // namespace tally::precision
