// Design note. Casting to FP8 with delayed scaling needs two things from
// each tensor: its FP8 image under a scale chosen earlier, and its amax for
// the history. Done separately that is two passes over the tensor in
// memory; this kernel does both in one. Each thread converts a strided
// slice with the hardware conversion (__nv_cvt_float_to_fp8, saturating to
// the finite range, round to nearest even) and keeps a running max |x|;
// warps reduce with shuffles, blocks through shared memory, and one
// atomicMax per block on the float's bits (non-negative floats order like
// their unsigned bit patterns) folds the block into the result. Optional
// counters (clamped values, nonzero values that became zero) come from the
// same pass, one atomic per thread that saw any.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/fp8_cast.h"

namespace tally::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void CastToE4M3Kernel(const float* __restrict__ x, int64_t n, float scale,
                                 uint8_t* __restrict__ y, unsigned int* amax_bits,
                                 unsigned long long* counts) {
  float local = 0.0f;
  unsigned long long over = 0, under = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const float a = fabsf(v);
    if (a > local) local = a;  // NaN compares false: ignored
    const float s = __fmul_rn(v, scale);
    const uint8_t q = static_cast<uint8_t>(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3));
    y[i] = q;
    over += fabsf(s) > 448.0f * (1.0f + 1e-6f);
    under += v != 0.0f && (q & 0x7f) == 0;
  }
  if (counts != nullptr && (over | under) != 0) {
    atomicAdd(&counts[0], over);
    atomicAdd(&counts[1], under);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    local = fmaxf(local, __shfl_down_sync(0xffffffffu, local, offset));
  }
  __shared__ float warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    float m = 0.0f;
    for (int w = 0; w < kThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    atomicMax(amax_bits, __float_as_uint(m));
  }
}

}  // namespace

std::string CastToE4M3Cuda(const float* x, int64_t n, float scale, uint8_t* y, float* amax,
                           void* stream, uint64_t* counts) {
  if (n <= 0) return "";
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  const int64_t needed = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(needed < 4LL * sms ? needed : 4LL * sms);
  CastToE4M3Kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, n, scale, y, reinterpret_cast<unsigned int*>(amax),
      reinterpret_cast<unsigned long long*>(counts));
  err = cudaGetLastError();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

}  // namespace tally::kernels
