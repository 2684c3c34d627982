#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/fp8_cast.h"

namespace tally::kernels {

uint8_t FloatToE4M3(float x) {
  if (std::isnan(x)) return 0x7f;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7e;  // saturate: 1.75 * 2^8
  // Exponent bias 7; subnormals below 2^-6 step by 2^-9.
  if (a < std::ldexp(1.0f, -6)) {
    const float q = std::nearbyint(a / std::ldexp(1.0f, -9));  // ties to even (default mode)
    return sign | static_cast<uint8_t>(q);  // q == 8 is the smallest normal, 0x08
  }
  int e;
  const float m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  // a = (1 + f/8) * 2^(e-1); f = round((2m - 1) * 8)
  float f = std::nearbyint((2.0f * m - 1.0f) * 8.0f);
  int exp = e - 1;
  if (f == 8.0f) {  // rounded up to the next power of two
    f = 0.0f;
    ++exp;
  }
  const int biased = exp + 7;
  if (biased > 15 || (biased == 15 && f > 6.0f)) return sign | 0x7e;
  return sign | static_cast<uint8_t>((biased << 3) | static_cast<int>(f));
}

float E4M3ToFloat(uint8_t bits) {
  const float sign = (bits & 0x80) ? -1.0f : 1.0f;
  const int exp = (bits >> 3) & 0xf, frac = bits & 0x7;
  if (exp == 15 && frac == 7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(frac), -9);
  return sign * std::ldexp(1.0f + frac / 8.0f, exp - 7);
}

void CastToE4M3Reference(const float* x, int64_t n, float scale, uint8_t* y, float* amax,
                         uint64_t* counts) {
  // The maximum of |x| taken on bit patterns, as the kernel does: with the
  // sign cleared, every NaN orders above +Inf and +Inf above every finite
  // value, so NaN propagates like ATen's max and the result is the same bits
  // the kernel's atomicMax leaves.
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof(bits));
    m = std::max(m, bits & 0x7fffffffu);
    const float s = x[i] * scale;
    y[i] = FloatToE4M3(s);
    if (counts != nullptr) {
      counts[0] += std::fabs(s) > kE4M3OverflowBound;
      counts[1] += x[i] != 0.0f && (y[i] & 0x7f) == 0;
    }
  }
  std::memcpy(amax, &m, sizeof(m));
}

}  // namespace tally::kernels
