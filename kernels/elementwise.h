// Fused element-wise kernels of the transformer block (CUDA, with CPU
// references), where ATen has no fused operator: SwiGLU over the joint
// gate/up product, and RoPE over the joint QKV product. No LibTorch: raw
// pointers and a stream (worker/model/fused_ops.h wraps them as autograd
// functions).
//
// Each replaces a chain of ATen passes (and their intermediates) with one
// read of its inputs and one write of its outputs, forward and backward.
// Tensors are FP32 or BF16 (Dtype); the arithmetic is FP32 and BF16 results
// are rounded to nearest even, as ATen rounds.
#ifndef TALLY_KERNELS_ELEMENTWISE_H_
#define TALLY_KERNELS_ELEMENTWISE_H_

#include <cstdint>
#include <string>

namespace tally::kernels {

enum class Dtype : uint8_t { kFloat32 = 0, kBFloat16 = 1 };

// BF16 bits of x, rounded to nearest even (NaN stays NaN), and back.
uint16_t FloatToBf16(float x);
float Bf16ToFloat(uint16_t bits);

// SwiGLU on x [n, 2f] (row-major; a = x[:, :f] the gate, b = x[:, f:] the
// up projection): y [n, f] = silu(a) * b, silu(a) = a / (1 + exp(-a)).
// Backward: dx [n, 2f] from dy [n, f]: da = dy * b * s * (1 + a (1 - s)),
// db = dy * a * s, with s = 1 / (1 + exp(-a)). x, y, dy, dx share one dtype.
void SwiGluForwardReference(const void* x, Dtype dtype, int64_t n, int64_t f, void* y);
void SwiGluBackwardReference(const void* x, const void* dy, Dtype dtype, int64_t n, int64_t f,
                             void* dx);
std::string SwiGluForwardCuda(const void* x, Dtype dtype, int64_t n, int64_t f, void* y,
                              void* stream);
std::string SwiGluBackwardCuda(const void* x, const void* dy, Dtype dtype, int64_t n, int64_t f,
                               void* dx, void* stream);

// RoPE on the joint QKV product qkv [n, 3, h, k] (n tokens, h heads of k,
// k even; q, k, v in that order): q and k rotated pair by pair, (x[i],
// x[i + k/2]) -> (x[i] c - x[i + k/2] s, x[i] s + x[i + k/2] c) with c, s
// = cos_nk2[t][i], sin_nk2[t][i] (FP32 [n, k/2], the token's angles), v
// copied; written as three [n, h, k] tensors in `out` dtype (BF16 for
// flash attention). Backward: the rotation by minus the angle of dq and dk,
// and dv copied, into dqkv [n, 3, h, k] in `in` dtype. Products and sums in
// FP32 without fused multiply-adds, so kernel and reference agree bit for
// bit.
struct RopeArgs {
  int64_t n = 0, h = 0, k = 0;
  const float* cos = nullptr;  // [n, k/2]
  const float* sin = nullptr;
  Dtype in = Dtype::kFloat32;   // qkv's and dqkv's
  Dtype out = Dtype::kBFloat16;  // q, k, v's and dq, dk, dv's
};
void RopeForwardReference(const RopeArgs& a, const void* qkv, void* q, void* k, void* v);
void RopeBackwardReference(const RopeArgs& a, const void* dq, const void* dk, const void* dv,
                           void* dqkv);
std::string RopeForwardCuda(const RopeArgs& a, const void* qkv, void* q, void* k, void* v,
                            void* stream);
std::string RopeBackwardCuda(const RopeArgs& a, const void* dq, const void* dk, const void* dv,
                             void* dqkv, void* stream);

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_ELEMENTWISE_H_
