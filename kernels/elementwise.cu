// Design note. SwiGLU and RoPE are a few FLOPs per element, so their cost
// is memory traffic. With ATen, SwiGLU forward reads the gate twice and
// writes a temporary (silu, then mul); its backward takes five passes and a
// zero-filled copy to stitch the two halves' gradients together. RoPE on q
// and k narrows, multiplies, subtracts and concatenates (six passes each),
// then q, k and v are each copied to BF16 for flash attention. Here each is
// one pass: a thread per output element (SwiGLU) or per rotated pair
// (RoPE, which also writes v), grid-stride loops, FP32 arithmetic with
// explicit round-to-nearest operations (no fused multiply-add), so RoPE
// agrees with its CPU reference bit for bit and SwiGLU to the last place of
// expf.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "kernels/elementwise.h"

namespace tally::kernels {
namespace {

constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float Ld(const T* p, int64_t i);
template <>
__device__ __forceinline__ float Ld<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ __forceinline__ float Ld<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}

__device__ __forceinline__ void St(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void St(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}

__device__ __forceinline__ float Sigmoid(float a) {
  return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-a)));
}

template <typename T>
__global__ void SwiGluForwardKernel(const T* __restrict__ x, int64_t n, int64_t f,
                                    T* __restrict__ y) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n * f;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = j / f, i = j % f;
    const float a = Ld(x, r * 2 * f + i), b = Ld(x, r * 2 * f + f + i);
    St(y, j, __fmul_rn(__fmul_rn(a, Sigmoid(a)), b));
  }
}

template <typename T>
__global__ void SwiGluBackwardKernel(const T* __restrict__ x, const T* __restrict__ dy,
                                     int64_t n, int64_t f, T* __restrict__ dx) {
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n * f;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = j / f, i = j % f;
    const float a = Ld(x, r * 2 * f + i), b = Ld(x, r * 2 * f + f + i), g = Ld(dy, j);
    const float s = Sigmoid(a);
    const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(a, __fsub_rn(1.0f, s))));
    St(dx, r * 2 * f + i, __fmul_rn(__fmul_rn(g, b), dsilu));
    St(dx, r * 2 * f + f + i, __fmul_rn(g, __fmul_rn(a, s)));
  }
}

template <typename In, typename Out>
__global__ void RopeForwardKernel(RopeArgs a, const In* __restrict__ qkv, Out* __restrict__ q,
                                  Out* __restrict__ k, Out* __restrict__ v) {
  const int64_t half = a.k / 2, pairs = a.n * a.h * half;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = j % half, th = j / half, hh = th % a.h, t = th / a.h;
    const float c = a.cos[t * half + i], s = a.sin[t * half + i];
    const int64_t out = (t * a.h + hh) * a.k + i;
    for (int part = 0; part < 2; ++part) {
      const int64_t in = ((t * 3 + part) * a.h + hh) * a.k + i;
      const float x1 = Ld(qkv, in), x2 = Ld(qkv, in + half);
      Out* dst = part == 0 ? q : k;
      St(dst, out, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
      St(dst, out + half, __fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c)));
    }
    const int64_t in = ((t * 3 + 2) * a.h + hh) * a.k + i;
    St(v, out, Ld(qkv, in));
    St(v, out + half, Ld(qkv, in + half));
  }
}

template <typename In, typename Out>
__global__ void RopeBackwardKernel(RopeArgs a, const Out* __restrict__ dq,
                                   const Out* __restrict__ dk, const Out* __restrict__ dv,
                                   In* __restrict__ dqkv) {
  const int64_t half = a.k / 2, pairs = a.n * a.h * half;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = j % half, th = j / half, hh = th % a.h, t = th / a.h;
    const float c = a.cos[t * half + i], s = a.sin[t * half + i];
    const int64_t src = (t * a.h + hh) * a.k + i;
    for (int part = 0; part < 2; ++part) {
      const Out* g = part == 0 ? dq : dk;
      const float g1 = Ld(g, src), g2 = Ld(g, src + half);
      const int64_t dst = ((t * 3 + part) * a.h + hh) * a.k + i;
      St(dqkv, dst, __fadd_rn(__fmul_rn(g1, c), __fmul_rn(g2, s)));
      St(dqkv, dst + half, __fsub_rn(__fmul_rn(g2, c), __fmul_rn(g1, s)));
    }
    const int64_t dst = ((t * 3 + 2) * a.h + hh) * a.k + i;
    St(dqkv, dst, Ld(dv, src));
    St(dqkv, dst + half, Ld(dv, src + half));
  }
}

std::string Launched() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

int Blocks(int64_t work) {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    sms = 132;
  }
  const int64_t needed = (work + kThreads - 1) / kThreads;
  return static_cast<int>(needed < 16LL * sms ? (needed > 0 ? needed : 1) : 16LL * sms);
}

using Bf16 = __nv_bfloat16;

}  // namespace

std::string SwiGluForwardCuda(const void* x, Dtype d, int64_t n, int64_t f, void* y,
                              void* stream) {
  if (n * f == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  if (d == Dtype::kFloat32) {
    SwiGluForwardKernel<<<Blocks(n * f), kThreads, 0, s>>>(static_cast<const float*>(x), n, f,
                                                            static_cast<float*>(y));
  } else {
    SwiGluForwardKernel<<<Blocks(n * f), kThreads, 0, s>>>(static_cast<const Bf16*>(x), n, f,
                                                            static_cast<Bf16*>(y));
  }
  return Launched();
}

std::string SwiGluBackwardCuda(const void* x, const void* dy, Dtype d, int64_t n, int64_t f,
                               void* dx, void* stream) {
  if (n * f == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  if (d == Dtype::kFloat32) {
    SwiGluBackwardKernel<<<Blocks(n * f), kThreads, 0, s>>>(
        static_cast<const float*>(x), static_cast<const float*>(dy), n, f,
        static_cast<float*>(dx));
  } else {
    SwiGluBackwardKernel<<<Blocks(n * f), kThreads, 0, s>>>(
        static_cast<const Bf16*>(x), static_cast<const Bf16*>(dy), n, f, static_cast<Bf16*>(dx));
  }
  return Launched();
}

namespace {

template <typename In, typename Out>
void RopeForward(const RopeArgs& a, const void* qkv, void* q, void* k, void* v, cudaStream_t s) {
  RopeForwardKernel<In, Out><<<Blocks(a.n * a.h * (a.k / 2)), kThreads, 0, s>>>(
      a, static_cast<const In*>(qkv), static_cast<Out*>(q), static_cast<Out*>(k),
      static_cast<Out*>(v));
}

template <typename In, typename Out>
void RopeBackward(const RopeArgs& a, const void* dq, const void* dk, const void* dv, void* dqkv,
                  cudaStream_t s) {
  RopeBackwardKernel<In, Out><<<Blocks(a.n * a.h * (a.k / 2)), kThreads, 0, s>>>(
      a, static_cast<const Out*>(dq), static_cast<const Out*>(dk), static_cast<const Out*>(dv),
      static_cast<In*>(dqkv));
}

}  // namespace

std::string RopeForwardCuda(const RopeArgs& a, const void* qkv, void* q, void* k, void* v,
                            void* stream) {
  if (a.n * a.h * a.k == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  const bool in32 = a.in == Dtype::kFloat32, out32 = a.out == Dtype::kFloat32;
  if (in32 && out32) RopeForward<float, float>(a, qkv, q, k, v, s);
  if (in32 && !out32) RopeForward<float, Bf16>(a, qkv, q, k, v, s);
  if (!in32 && out32) RopeForward<Bf16, float>(a, qkv, q, k, v, s);
  if (!in32 && !out32) RopeForward<Bf16, Bf16>(a, qkv, q, k, v, s);
  return Launched();
}

std::string RopeBackwardCuda(const RopeArgs& a, const void* dq, const void* dk, const void* dv,
                             void* dqkv, void* stream) {
  if (a.n * a.h * a.k == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  const bool in32 = a.in == Dtype::kFloat32, out32 = a.out == Dtype::kFloat32;
  if (in32 && out32) RopeBackward<float, float>(a, dq, dk, dv, dqkv, s);
  if (in32 && !out32) RopeBackward<float, Bf16>(a, dq, dk, dv, dqkv, s);
  if (!in32 && out32) RopeBackward<Bf16, float>(a, dq, dk, dv, dqkv, s);
  if (!in32 && !out32) RopeBackward<Bf16, Bf16>(a, dq, dk, dv, dqkv, s);
  return Launched();
}

}  // namespace tally::kernels
