#include "worker/precision/scaling.h"

#if defined(TALLY_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/core/grad_mode.h>
#include <ATen/record_function.h>

#include <cfloat>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/fp8_scaling.h"

namespace tally::precision {

using internal::ReadHost;

namespace {

kernels::Fp8Kind KindOf(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? kernels::Fp8Kind::kE4M3 : kernels::Fp8Kind::kE5M2;
}

#if defined(TALLY_WITH_CUDA)
void* Stream() { return c10::cuda::getCurrentCUDAStream().stream(); }
#endif

}  // namespace

double ScaleForAmax(double amax, Fp8Format format, int margin, double previous) {
  // As the device computes it (FP64, rounded to FP32); `previous` passes
  // through unchanged.
  const float s = kernels::ScaleForAmax(static_cast<float>(amax), KindOf(format), margin, NAN);
  return std::isnan(s) ? previous : s;
}

ScalingTable::ScalingTable(const RecipeConfig& config, at::Device device)
    : config_(config), device_(device) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  history_ = at::zeros({0, config_.history_len}, f32);
  count_ = at::zeros({0}, f32.dtype(at::kInt));
  scale_ = at::zeros({0}, f32);
  inv_scale_ = at::zeros({0}, f32);
  step_amax_ = at::zeros({0}, f32);
  step_finite_ = at::zeros({0}, f32);
  format_codes_ = at::zeros({0}, f32.dtype(at::kByte));
}

int64_t ScalingTable::Add(Fp8Format format) {
  formats_.push_back(format);
  has_history_.push_back(false);
  seen_.push_back(false);
  steps_.push_back(0);
  Grow();
  return size() - 1;
}

void ScalingTable::Grow() {
  // One tensor more: every array gains its initial entry (device ops, no
  // read). Declared layers come before the first step, so this is rare.
  const auto f32 = scale_.options();
  auto one = [&](const at::Tensor& a, double v) {
    return at::cat({a, at::full({1}, v, a.options())});
  };
  history_ = at::cat({history_, at::zeros({1, config_.history_len}, f32)});
  count_ = one(count_, 0);
  scale_ = one(scale_, 1.0);
  inv_scale_ = one(inv_scale_, 1.0);
  step_amax_ = one(step_amax_, 0);
  step_finite_ = one(step_finite_, 0);
  format_codes_ = one(format_codes_, static_cast<double>(KindOf(formats_.back())));
}

Scale ScalingTable::scale(int64_t t) const {
  return {scale_.narrow(0, t, 1), inv_scale_.narrow(0, t, 1)};
}

Scale ScalingTable::ScaleFromItself(int64_t t, const at::Tensor& x2, bool record) {
  RECORD_USER_SCOPE("tally::fp8_scale_from_amax");
  at::Tensor amax = at::zeros({2}, scale_.options());  // raw, finite
  CastFp8(x2, {}, formats_[t], false, false, {amax.narrow(0, 0, 1), amax.narrow(0, 1, 1), {}});
  Scale s{scale_.narrow(0, t, 1).clone(), at::empty({1}, scale_.options())};
  const uint8_t* format = format_codes_.narrow(0, t, 1).data_ptr<uint8_t>();
  if (x2.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
    const std::string err =
        kernels::ScaleFromAmaxCuda(amax.data_ptr<float>(), format, 1, config_.margin,
                                   s.scale.data_ptr<float>(), s.inv_scale.data_ptr<float>(),
                                   Stream());
    TORCH_CHECK(err.empty(), "FP8 scale: ", err);
#endif
  } else {
    kernels::ScaleFromAmaxReference(amax.data_ptr<float>(), format, 1, config_.margin,
                                    s.scale.data_ptr<float>(), s.inv_scale.data_ptr<float>());
  }
  if (record) {
    at::Tensor raw = step_amax_.narrow(0, t, 1), finite = step_finite_.narrow(0, t, 1);
    raw.copy_(at::maximum(raw, amax.narrow(0, 0, 1)));  // NaN stays NaN
    finite.copy_(at::maximum(finite, amax.narrow(0, 1, 1)));
  }
  return s;
}

void ScalingTable::ObserveStep(const std::vector<double>& step_finite) {
  for (size_t t = 0; t < seen_.size() && t < step_finite.size(); ++t) {
    seen_[t] = step_finite[t] > 0;
  }
  observed_ = true;
}

void ScalingTable::StepDelayed() {
  RECORD_USER_SCOPE("tally::fp8_delayed_scaling_step");
  if (!observed_) ObserveStep(ReadHost(step_finite_));
  kernels::ScalingState s;
  s.tensors = size();
  s.history_len = config_.history_len;
  s.history = history_.data_ptr<float>();
  s.count = count_.data_ptr<int32_t>();
  s.scale = scale_.data_ptr<float>();
  s.inv_scale = inv_scale_.data_ptr<float>();
  s.step_amax = step_amax_.data_ptr<float>();
  s.step_finite = step_finite_.data_ptr<float>();
  s.formats = format_codes_.data_ptr<uint8_t>();
  const kernels::ScalingRecipe r{config_.margin, config_.history_max};
  if (device_.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
    const std::string err = kernels::DelayedScalingStepCuda(s, r, Stream());
    TORCH_CHECK(err.empty(), "FP8 delayed scaling step: ", err);
#endif
  } else {
    kernels::DelayedScalingStepReference(s, r);
  }
  for (int64_t t = 0; t < size(); ++t) {
    has_history_[t] = has_history_[t] || seen_[t];
    seen_[t] = false;
    ++steps_[t];
  }
  observed_ = false;
}

void ScalingTable::StepCurrent() {
  step_amax_.zero_();
  step_finite_.zero_();
  for (int64_t& s : steps_) ++s;
  std::fill(seen_.begin(), seen_.end(), false);
  observed_ = false;
}

std::vector<at::Tensor> ScalingTable::State() const {
  const int64_t T = size(), H = config_.history_len;
  std::vector<at::Tensor> out;
  if (T == 0) return out;
  // One read: history, count, scale.
  const std::vector<double> v = ReadHost(at::cat(
      {history_.reshape({-1}), count_.to(at::kFloat), scale_}));
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> s(H + 3, 0.0);
    const int64_t n = static_cast<int64_t>(v[T * H + t]);
    for (int64_t i = 0; i < n; ++i) s[i] = v[t * H + i];
    s[H] = v[T * H + T + t];
    s[H + 1] = static_cast<double>(n);
    s[H + 2] = static_cast<double>(steps_[t]);
    out.push_back(at::tensor(s, at::kDouble));
  }
  return out;
}

std::string ScalingTable::Check(const at::Tensor& t, int64_t step) const {
  const int64_t H = config_.history_len;
  if (t.scalar_type() != at::kDouble || t.dim() != 1 || t.size(0) != H + 3) {
    return absl::StrCat("is ", c10::toString(t.scalar_type()), " [",
                        c10::str(t.sizes()).substr(1), " (expected Double [", H + 3,
                        "] for precision.amax_history_len ", H, ")");
  }
  const at::Tensor c = t.contiguous();
  const double* v = c.data_ptr<double>();
  const double count = v[H + 1], steps = v[H + 2], scale = v[H];
  if (!(count >= 0 && count <= H && count == std::floor(count))) {
    return absl::StrCat("history length is ", count, " (expected an integer between 0 and ", H,
                        ")");
  }
  for (int64_t i = 0; i < static_cast<int64_t>(count); ++i) {
    if (!(std::isfinite(v[i]) && v[i] >= 0 && v[i] <= FLT_MAX)) {
      return absl::StrCat("amax history entry ", i, " is ", v[i],
                          " (expected a finite amax >= 0 that FP32 holds)");
    }
  }
  if (!(std::isfinite(scale) && scale >= FLT_MIN && scale <= FLT_MAX)) {
    return absl::StrCat("scale is ", scale, " (expected a number between ", FLT_MIN, " and ",
                        FLT_MAX, ", what FP32 holds)");
  }
  if (!(steps >= 0 && steps <= static_cast<double>(step) && steps == std::floor(steps))) {
    return absl::StrCat("steps is ", steps, " (expected an integer between 0 and step, ", step,
                        ")");
  }
  return "";
}

bool ScalingTable::LoadState(int64_t t, const at::Tensor& state) {
  if (t < 0 || t >= size() || !Check(state, INT64_MAX).empty()) return false;
  const int64_t H = config_.history_len;
  const at::Tensor v = state.contiguous();
  const double* d = v.data_ptr<double>();
  const int64_t n = static_cast<int64_t>(d[H + 1]);
  at::Tensor row = at::zeros({H}, at::kFloat);
  for (int64_t i = 0; i < n; ++i) row[i] = static_cast<float>(d[i]);
  at::NoGradGuard no_grad;
  history_[t].copy_(row);
  count_[t].fill_(n);
  const float scale = static_cast<float>(d[H]);
  scale_[t].fill_(scale);
  inv_scale_[t].fill_(static_cast<float>(1.0 / static_cast<double>(scale)));
  step_amax_[t].fill_(0);
  step_finite_[t].fill_(0);
  has_history_[t] = n > 0;
  seen_[t] = false;
  steps_[t] = static_cast<int64_t>(d[H + 2]);
  return true;
}

}  // namespace tally::precision
