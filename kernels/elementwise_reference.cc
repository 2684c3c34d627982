// The CPU definitions of kernels/elementwise.h. Written so that the compiler
// cannot contract a multiply and an add into one (each product is stored
// before it is summed), matching the kernels' explicit round-to-nearest
// operations.
#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/float_bits.h"

namespace tally::kernels {
namespace {

float Load(const void* p, Dtype d, int64_t i) {
  return d == Dtype::kFloat32 ? static_cast<const float*>(p)[i]
                              : Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
}

void Store(void* p, Dtype d, int64_t i, float v) {
  if (d == Dtype::kFloat32) {
    static_cast<float*>(p)[i] = v;
  } else {
    static_cast<uint16_t*>(p)[i] = FloatToBf16(v);
  }
}

// a * b, rounded to FP32 on its own (never fused with what it is added to).
float Mul(float a, float b) {
  volatile float p = a * b;
  return p;
}

float Sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }

}  // namespace

uint16_t FloatToBf16(float x) {
  const uint32_t b = FloatBits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

float Bf16ToFloat(uint16_t bits) { return BitsFloat(static_cast<uint32_t>(bits) << 16); }

void SwiGluForwardReference(const void* x, Dtype d, int64_t n, int64_t f, void* y) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      const float a = Load(x, d, r * 2 * f + i), b = Load(x, d, r * 2 * f + f + i);
      Store(y, d, r * f + i, Mul(Mul(a, Sigmoid(a)), b));
    }
  }
}

void SwiGluBackwardReference(const void* x, const void* dy, Dtype d, int64_t n, int64_t f,
                             void* dx) {
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      const float a = Load(x, d, r * 2 * f + i), b = Load(x, d, r * 2 * f + f + i);
      const float g = Load(dy, d, r * f + i);
      const float s = Sigmoid(a);
      // silu'(a) = s (1 + a (1 - s))
      const float dsilu = Mul(s, 1.0f + Mul(a, 1.0f - s));
      Store(dx, d, r * 2 * f + i, Mul(Mul(g, b), dsilu));
      Store(dx, d, r * 2 * f + f + i, Mul(g, Mul(a, s)));
    }
  }
}

void RopeForwardReference(const RopeArgs& a, const void* qkv, void* q, void* k, void* v) {
  const int64_t half = a.k / 2;
  for (int64_t t = 0; t < a.n; ++t) {
    for (int64_t hh = 0; hh < a.h; ++hh) {
      for (int64_t i = 0; i < half; ++i) {
        const float c = a.cos[t * half + i], s = a.sin[t * half + i];
        const int64_t out = (t * a.h + hh) * a.k + i;
        for (int part = 0; part < 2; ++part) {
          const int64_t in = ((t * 3 + part) * a.h + hh) * a.k + i;
          const float x1 = Load(qkv, a.in, in), x2 = Load(qkv, a.in, in + half);
          void* dst = part == 0 ? q : k;
          Store(dst, a.out, out, Mul(x1, c) - Mul(x2, s));
          Store(dst, a.out, out + half, Mul(x1, s) + Mul(x2, c));
        }
        const int64_t in = ((t * 3 + 2) * a.h + hh) * a.k + i;
        Store(v, a.out, out, Load(qkv, a.in, in));
        Store(v, a.out, out + half, Load(qkv, a.in, in + half));
      }
    }
  }
}

void RopeBackwardReference(const RopeArgs& a, const void* dq, const void* dk, const void* dv,
                           void* dqkv) {
  const int64_t half = a.k / 2;
  for (int64_t t = 0; t < a.n; ++t) {
    for (int64_t hh = 0; hh < a.h; ++hh) {
      for (int64_t i = 0; i < half; ++i) {
        const float c = a.cos[t * half + i], s = a.sin[t * half + i];
        const int64_t src = (t * a.h + hh) * a.k + i;
        for (int part = 0; part < 2; ++part) {
          const void* g = part == 0 ? dq : dk;
          const float g1 = Load(g, a.out, src), g2 = Load(g, a.out, src + half);
          const int64_t dst = ((t * 3 + part) * a.h + hh) * a.k + i;
          // The transpose of the rotation: by minus the angle.
          Store(dqkv, a.in, dst, Mul(g1, c) + Mul(g2, s));
          Store(dqkv, a.in, dst + half, Mul(g2, c) - Mul(g1, s));
        }
        const int64_t dst = ((t * 3 + 2) * a.h + hh) * a.k + i;
        Store(dqkv, a.in, dst, Load(dv, a.out, src));
        Store(dqkv, a.in, dst + half, Load(dv, a.out, src + half));
      }
    }
  }
}

}  // namespace tally::kernels
