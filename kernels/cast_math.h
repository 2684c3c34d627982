// The arithmetic the fused casts' kernels and their CPU references share,
// written once for both compilers (nvcc's device pass and the host's), so
// the two agree bit for bit by construction rather than by testing alone.
//
// Every operation rounds to FP32 on its own: the device uses the
// round-to-nearest intrinsics (__fmul_rn, ...: never contracted into a
// fused multiply-add), the host stores each result through a volatile (GCC
// may otherwise contract a * b + c where FMA is available). exp is a
// deterministic range reduction and polynomial rather than the math
// library's (CUDA's expf and glibc's differ by an ulp here and there, and
// one ulp can move an FP8 rounding); it is within 2 ulps of the true value.
// NaN results are made the canonical NaN (0x7fffffff) so that amaxes, which
// keep a NaN's bits, are the same on both sides.
#ifndef TALLY_KERNELS_CAST_MATH_H_
#define TALLY_KERNELS_CAST_MATH_H_

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TALLY_HD __host__ __device__ __forceinline__
#else
#define TALLY_HD inline
#endif

namespace tally::kernels::cast_math {

TALLY_HD uint32_t Bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
#endif
}

TALLY_HD float FromBits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
#endif
}

TALLY_HD bool IsNan(float x) { return (Bits(x) & 0x7fffffffu) > 0x7f800000u; }

constexpr uint32_t kCanonicalNan = 0x7fffffffu;
TALLY_HD float Canonical(float x) { return IsNan(x) ? FromBits(kCanonicalNan) : x; }

#if defined(__CUDA_ARCH__)
TALLY_HD float Mul(float a, float b) { return __fmul_rn(a, b); }
TALLY_HD float Add(float a, float b) { return __fadd_rn(a, b); }
TALLY_HD float Sub(float a, float b) { return __fsub_rn(a, b); }
TALLY_HD float Div(float a, float b) { return __fdiv_rn(a, b); }
TALLY_HD float Sqrt(float a) { return __fsqrt_rn(a); }
#else
inline float Mul(float a, float b) {
  volatile float r = a * b;
  return r;
}
inline float Add(float a, float b) {
  volatile float r = a + b;
  return r;
}
inline float Sub(float a, float b) {
  volatile float r = a - b;
  return r;
}
inline float Div(float a, float b) {
  volatile float r = a / b;
  return r;
}
inline float Sqrt(float a) {
  // sqrtss: IEEE, correctly rounded, as __fsqrt_rn.
  volatile float r = __builtin_sqrtf(a);
  return r;
}
#endif

// x rounded to BF16 (nearest even; NaN canonical) and widened back: the
// integer rounding of kernels/elementwise.h's FloatToBf16.
TALLY_HD float RoundBf16(float x) {
  if (IsNan(x)) return FromBits(0x7fff0000u);
  const uint32_t b = Bits(x);
  return FromBits(((b + 0x7fffu + ((b >> 16) & 1u)) >> 16) << 16);
}

// e^x within 2 ulps: x = k ln2 + r (Cody-Waite, |r| <= ln2 / 2), e^r by
// its Taylor polynomial to degree 7 (truncation below 1e-8), times 2^k in
// two exact steps. Below -103 the result is 0 (it is below FP32's smallest
// subnormal), above 88.73 +Inf; NaN stays NaN.
TALLY_HD float Exp(float x) {
  if (IsNan(x)) return x;
  if (x > 88.7228394f) return FromBits(0x7f800000u);
  if (x < -103.0f) return 0.0f;
  // k = x / ln2 rounded to nearest even (adding and subtracting 1.5 x 2^23
  // rounds the sum's fraction away).
  const float kMagic = 12582912.0f;
  const float k = Sub(Add(Mul(x, 1.44269502f), kMagic), kMagic);
  // ln2 = hi + lo, hi with 15 significant bits: k hi is exact for |k| < 2^9.
  const float r = Sub(Sub(x, Mul(k, 0.693145751953125f)), Mul(k, 1.42860677e-6f));
  float p = 1.98412701e-4f;            // 1/5040
  p = Add(Mul(p, r), 1.38888892e-3f);  // 1/720
  p = Add(Mul(p, r), 8.33333377e-3f);  // 1/120
  p = Add(Mul(p, r), 4.16666679e-2f);  // 1/24
  p = Add(Mul(p, r), 0.166666672f);    // 1/6
  p = Add(Mul(p, r), 0.5f);
  p = Add(Mul(p, r), 1.0f);
  p = Add(Mul(p, r), 1.0f);
  const int ki = static_cast<int>(k);   // exact: k is an integer in [-149, 128]
  const int k1 = ki / 2, k2 = ki - k1;  // each within [-75, 64]: 2^k1, 2^k2 normal
  const float s1 = FromBits(static_cast<uint32_t>(k1 + 127) << 23);
  const float s2 = FromBits(static_cast<uint32_t>(k2 + 127) << 23);
  return Mul(Mul(p, s1), s2);
}

// silu(a) b = a / (1 + e^-a) x b, as the SwiGLU kernels order it:
// (a x sigmoid(a)) x b; NaN canonical.
TALLY_HD float SwiGlu(float a, float b) {
  const float sigmoid = Div(1.0f, Add(1.0f, Exp(-a)));
  return Canonical(Mul(Mul(a, sigmoid), b));
}

// RMSNorm's reciprocal: 1 / sqrt(sum_sq / d + eps), each step rounded.
TALLY_HD float Rstd(float sum_sq, int64_t d, float eps) {
  return Div(1.0f, Sqrt(Add(Div(sum_sq, static_cast<float>(d)), eps)));
}

// RMSNorm's output: (x rstd) gain; NaN canonical.
TALLY_HD float Normed(float x, float rstd, float gain) {
  return Canonical(Mul(Mul(x, rstd), gain));
}

// max / (amax x 2^margin) in FP64, rounded to FP32, or 1 where amax is
// zero, not finite, or gives a scale FP32 cannot hold: ScaleForAmax of
// kernels/fp8_scaling.h with a previous scale of 1 (row-wise scaling).
TALLY_HD float RowScale(float amax, float max, int margin) {
  if (!(amax > 0) || IsNan(amax) || (Bits(amax) & 0x7fffffffu) == 0x7f800000u) return 1.0f;
  const double s = static_cast<double>(max) / static_cast<double>(amax) / ldexp(1.0, margin);
  if (!(s >= FLT_MIN && s <= FLT_MAX)) return 1.0f;
  return static_cast<float>(s);
}

// 1 / scale in FP64, rounded to FP32: what the products dequantize by.
TALLY_HD float Inverse(float scale) { return static_cast<float>(1.0 / static_cast<double>(scale)); }

}  // namespace tally::kernels::cast_math

#endif  // TALLY_KERNELS_CAST_MATH_H_
