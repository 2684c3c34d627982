#include <algorithm>
#include <cfloat>
#include <cmath>

#include "kernels/fp8_scaling.h"

namespace tally::kernels {

float ScaleForAmax(float amax, Fp8Kind kind, int margin, float previous) {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const double s = static_cast<double>(Fp8Max(kind)) / static_cast<double>(amax) /
                   std::ldexp(1.0, margin);
  // Both ways: a scale FP32 rounds to 0 or to infinity would zero or blow
  // up every value cast with it.
  if (!(s >= FLT_MIN && s <= FLT_MAX)) return previous;
  return static_cast<float>(s);
}

namespace {

float Inverse(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

}  // namespace

void DelayedScalingStepReference(const ScalingState& s, const ScalingRecipe& r) {
  const int H = s.history_len;
  for (int64_t t = 0; t < s.tensors; ++t) {
    float* h = s.history + t * H;
    const float seen = s.step_finite[t];
    s.step_amax[t] = 0;
    s.step_finite[t] = 0;
    if (s.count[t] == 0 && !(seen > 0)) continue;
    if (s.count[t] == H) {
      std::copy(h + 1, h + H, h);
      h[H - 1] = seen;
    } else {
      h[s.count[t]++] = seen;
    }
    const int n = s.count[t];
    const float amax = r.history_max ? *std::max_element(h, h + n) : h[n - 1];
    s.scale[t] = ScaleForAmax(amax, static_cast<Fp8Kind>(s.formats[t]), r.margin, s.scale[t]);
    s.inv_scale[t] = Inverse(s.scale[t]);
  }
}

void ScaleFromAmaxReference(const float* amax, const uint8_t* formats, int64_t n, int margin,
                            float* scale, float* inv_scale) {
  for (int64_t i = 0; i < n; ++i) {
    scale[i] = ScaleForAmax(amax[i], static_cast<Fp8Kind>(formats[i]), margin, scale[i]);
    inv_scale[i] = Inverse(scale[i]);
  }
}

}  // namespace tally::kernels
