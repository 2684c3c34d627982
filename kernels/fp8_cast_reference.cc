// The CPU definitions of kernels/fp8_cast.h. The conversion works on the
// bit pattern (no frexp, no rounding-mode dependence), so the trainer's CPU
// emulation can run it over whole tensors.
#include <algorithm>
#include <cmath>

#include "kernels/float_bits.h"
#include "kernels/fp8_cast.h"

namespace tally::kernels {
namespace {


struct Format {
  int mantissa_bits;  // 3 or 2
  int bias;           // 7 or 15
  int max_exponent;   // unbiased exponent of the largest finite value
  uint8_t max_code;   // its bits: 0x7e or 0x7b
};

constexpr Format FormatOf(Fp8Kind k) {
  return k == Fp8Kind::kE4M3 ? Format{3, 7, 8, 0x7e} : Format{2, 15, 15, 0x7b};
}

float ReadSource(const void* x, SourceKind source, int64_t i) {
  if (source == SourceKind::kFloat32) return static_cast<const float*>(x)[i];
  return BitsFloat(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16);
}

}  // namespace

uint8_t FloatToFp8(float x, Fp8Kind kind) {
  const Format f = FormatOf(kind);
  const uint32_t b = FloatBits(x);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80);
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN
  const int e = static_cast<int>(a >> 23) - 127;  // FP32 denormals: -127, far below
  if (e > f.max_exponent) return sign | f.max_code;
  const int min_normal = 1 - f.bias;
  if (e < min_normal) {
    // Subnormal range: multiples of 2^(min_normal - M), rounded to nearest
    // even. The scaling by a power of two is exact; q = 2^M is the smallest
    // normal's code.
    const float scaled = std::ldexp(BitsFloat(a), f.mantissa_bits - min_normal);
    const float floor = std::floor(scaled);
    const float rest = scaled - floor;
    uint32_t q = static_cast<uint32_t>(floor);
    if (rest > 0.5f || (rest == 0.5f && (q & 1))) ++q;
    return sign | static_cast<uint8_t>(q);
  }
  // Normal: keep the top M mantissa bits, rounding the dropped ones to
  // nearest even (a carry moves into the exponent, as it should).
  const int drop = 23 - f.mantissa_bits;
  const uint32_t rounded = (a + ((1u << (drop - 1)) - 1) + ((a >> drop) & 1)) >> drop;
  const int exponent = static_cast<int>(rounded >> f.mantissa_bits) - 127 + f.bias;
  const uint32_t code = (static_cast<uint32_t>(exponent) << f.mantissa_bits) |
                        (rounded & ((1u << f.mantissa_bits) - 1));
  return sign | static_cast<uint8_t>(std::min<uint32_t>(code, f.max_code));
}

float Fp8ToFloat(uint8_t bits, Fp8Kind kind) {
  const Format f = FormatOf(kind);
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  const int exp_bits = 7 - f.mantissa_bits;
  const int exp = (bits >> f.mantissa_bits) & ((1 << exp_bits) - 1);
  const int frac = bits & ((1 << f.mantissa_bits) - 1);
  const float one = static_cast<float>(1 << f.mantissa_bits);
  if (kind == Fp8Kind::kE4M3 && exp == 15 && frac == 7) return std::nanf("");
  if (kind == Fp8Kind::kE5M2 && exp == 31) {
    return frac == 0 ? sign * INFINITY : std::nanf("");
  }
  if (exp == 0) return sign * std::ldexp(static_cast<float>(frac), 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp(1.0f + frac / one, exp - f.bias);
}

void CastReference(const CastArgs& a) {
  const int64_t n = a.rows * a.cols;
  const float scale = a.scale != nullptr ? *a.scale : 1.0f;
  const float bound = OverflowBound(a.format);
  uint32_t max_bits = 0, finite_bits = 0;
  uint64_t over = 0, under = 0;
  const bool casts = a.out != nullptr || a.out_t != nullptr || a.counts != nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const float v = ReadSource(a.x, a.source, i);
    const uint32_t abs_bits = FloatBits(v) & 0x7fffffffu;
    max_bits = std::max(max_bits, abs_bits);
    if (abs_bits < 0x7f800000u) finite_bits = std::max(finite_bits, abs_bits);
    if (!casts) continue;
    const float s = v * scale;
    const uint8_t q = FloatToFp8(s, a.format);
    if (a.out != nullptr) a.out[i] = q;
    if (a.out_t != nullptr) a.out_t[(i % a.cols) * a.rows + i / a.cols] = q;
    over += std::fabs(s) > bound;  // NaN compares false, as in ATen
    under += v != 0.0f && (q & 0x7f) == 0;
  }
  if (a.amax != nullptr) *a.amax = BitsFloat(std::max(FloatBits(*a.amax), max_bits));
  if (a.amax_finite != nullptr) {
    *a.amax_finite = BitsFloat(std::max(FloatBits(*a.amax_finite), finite_bits));
  }
  if (a.counts != nullptr) {
    a.counts[0] += over;
    a.counts[1] += under;
  }
}

}  // namespace tally::kernels
