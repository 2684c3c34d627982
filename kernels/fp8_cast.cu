// Design note. Casting to FP8 with delayed scaling needs two things from
// each tensor: its FP8 image under a scale chosen earlier, and its amax for
// the history. Done separately that is two passes over the tensor in
// memory; this kernel does both in one. Each thread converts a strided
// slice with the hardware conversion (__nv_cvt_float_to_fp8, saturating to
// the finite range, round to nearest even) and keeps a running max |x| on
// the bit patterns: with the sign cleared, floats order like their unsigned
// bits and every NaN orders above +Inf, so a NaN anywhere makes the amax NaN
// as ATen's max does (fmaxf would drop it, and the trainer's guard against
// a non-finite amax would never see a NaN weight). Warps reduce with
// shuffles, blocks through shared memory, and one atomicMax per block folds
// the block into the result. Optional counters (clamped values: above
// kE4M3OverflowBound, the trainer's bound; nonzero values that became zero)
// come from the same pass, one atomic per thread that saw any.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/fp8_cast.h"

namespace tally::kernels {
namespace {

constexpr int kThreads = 256;

__global__ void CastToE4M3Kernel(const float* __restrict__ x, int64_t n, float scale,
                                 uint8_t* __restrict__ y, unsigned int* amax_bits,
                                 unsigned long long* counts) {
  unsigned int local = 0;  // max |x| as bits (see the note above)
  unsigned long long over = 0, under = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    local = max(local, __float_as_uint(v) & 0x7fffffffu);
    const float s = __fmul_rn(v, scale);
    const uint8_t q = static_cast<uint8_t>(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, __NV_E4M3));
    y[i] = q;
    over += fabsf(s) > kE4M3OverflowBound;  // NaN compares false, as in ATen
    under += v != 0.0f && (q & 0x7f) == 0;
  }
  if (counts != nullptr && (over | under) != 0) {
    atomicAdd(&counts[0], over);
    atomicAdd(&counts[1], under);
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    local = max(local, __shfl_down_sync(0xffffffffu, local, offset));
  }
  __shared__ unsigned int warp_max[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x / 32] = local;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int m = 0;
    for (int w = 0; w < kThreads / 32; ++w) m = max(m, warp_max[w]);
    atomicMax(amax_bits, m);
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
