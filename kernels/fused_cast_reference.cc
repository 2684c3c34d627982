// The CPU definitions of kernels/fused_cast.h: the op's output into a
// buffer of y_dtype, then CastReference over it, so the FP8 outputs are the
// plain cast's of y by construction.
#include <cstring>
#include <vector>

#include "kernels/cast_math.h"
#include "kernels/fused_cast.h"

namespace tally::kernels {
namespace {

float Load(const void* p, Dtype d, int64_t i) {
  return d == Dtype::kFloat32 ? static_cast<const float*>(p)[i]
                              : Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
}

// y as the cast reads it: FP32 values, or BF16 bits.
struct YBuffer {
  YBuffer(Dtype d, int64_t n)
      : dtype(d), f32(d == Dtype::kFloat32 ? n : 0), bf16(d == Dtype::kBFloat16 ? n : 0) {}
  void Set(int64_t i, float v) {
    if (dtype == Dtype::kFloat32) {
      f32[i] = v;
    } else {
      bf16[i] = static_cast<uint16_t>(cast_math::Bits(cast_math::RoundBf16(v)) >> 16);
    }
  }
  const void* data() const {
    return dtype == Dtype::kFloat32 ? static_cast<const void*>(f32.data()) : bf16.data();
  }
  void CopyTo(void* y) const {
    if (y == nullptr) return;
    if (dtype == Dtype::kFloat32) {
      std::memcpy(y, f32.data(), f32.size() * sizeof(float));
    } else {
      std::memcpy(y, bf16.data(), bf16.size() * sizeof(uint16_t));
    }
  }
  Dtype dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};

void Cast(const YBuffer& y, int64_t rows, int64_t cols, const Fp8Out& o) {
  CastArgs a;
  a.x = y.data();
  a.source = y.dtype == Dtype::kFloat32 ? SourceKind::kFloat32 : SourceKind::kBFloat16;
  a.rows = rows;
  a.cols = cols;
  a.scale = o.scale;
  a.format = o.format;
  a.out = o.out;
  a.out_t = o.out_t;
  a.amax = o.amax;
  a.amax_finite = o.amax_finite;
  a.counts = o.counts;
  CastReference(a);
}

}  // namespace

void RmsNormCastReference(const RmsNormCastArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  YBuffer y(a.y_dtype, a.rows * a.cols);
  for (int64_t r = 0; r < a.rows; ++r) {
    // The kernel's order (fused_cast.h): 32 lane sums over 8-element
    // chunks, then a butterfly.
    float lane[32];
    for (int l = 0; l < 32; ++l) {
      lane[l] = 0.0f;
      for (int64_t c = 8 * l; c < a.cols; c += 256) {
        for (int64_t k = c; k < c + 8 && k < a.cols; ++k) {
          const float v = Load(a.x, a.x_dtype, r * a.cols + k);
          lane[l] = cast_math::Add(lane[l], cast_math::Mul(v, v));
        }
      }
    }
    for (int d = 16; d > 0; d /= 2) {
      float next[32];
      for (int l = 0; l < 32; ++l) next[l] = cast_math::Add(lane[l], lane[l ^ d]);
      std::memcpy(lane, next, sizeof(lane));
    }
    const float rstd = cast_math::Rstd(lane[0], a.cols, a.eps);
    if (a.rstd != nullptr) a.rstd[r] = rstd;
    for (int64_t c = 0; c < a.cols; ++c) {
      y.Set(r * a.cols + c,
            cast_math::Normed(Load(a.x, a.x_dtype, r * a.cols + c), rstd, a.gain[c]));
    }
  }
  y.CopyTo(a.y);
  Cast(y, a.rows, a.cols, a.fp8);
}

void SwiGluCastReference(const SwiGluCastArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  const int64_t f = a.cols;
  YBuffer y(a.y_dtype, a.rows * f);
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t c = 0; c < f; ++c) {
      y.Set(r * f + c, cast_math::SwiGlu(Load(a.x13, a.x_dtype, r * 2 * f + c),
                                         Load(a.x13, a.x_dtype, r * 2 * f + f + c)));
    }
  }
  y.CopyTo(a.y);
  Cast(y, a.rows, f, a.fp8);
}

}  // namespace tally::kernels
