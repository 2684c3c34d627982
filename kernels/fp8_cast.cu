// Design note. An FP8 linear needs each of its tensors cast twice over:
// the forward product reads the input and the weight row-major, the
// backward products read the gradient row-major and the input, weight and
// gradient transposed (at::_scaled_mm wants its second operand
// column-major), and delayed scaling wants each tensor's amax for its
// history. Done with ATen that is an abs/max pass, a multiply, a clamp, a
// cast, counting passes and a .t().contiguous() copy per tensor; this kernel
// reads the tensor once and writes both layouts, the amax (raw and finite)
// and the clamped/flushed counts in the same pass, with the scale read from
// device memory (so delayed scaling never waits for the host).
//
// Each block walks 64 x 64 tiles (a grid-stride loop over tiles, so any
// size fits one launch): 256 threads as 64 columns x 4 row lanes read a tile
// row-major (coalesced), convert with the hardware instruction
// (__nv_cvt_float_to_fp8: round to nearest even, saturating to the finite
// range), write the row-major bytes at once and keep them in shared memory,
// then write the tile transposed from there (coalesced too). Amax is kept on
// bit patterns (sign cleared: floats order like their unsigned bits, every
// NaN above +Inf, so a NaN anywhere makes the amax NaN as ATen's max does);
// warps reduce with shuffles, blocks through shared memory, and one
// atomicMax per block and per amax folds the result. Counts: one atomicAdd
// per thread that saw any.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include "kernels/fp8_cast.h"

namespace tally::kernels {
namespace {

constexpr int kTile = 64;
constexpr int kLanes = 4;  // rows of a tile read at once; blockDim (kTile, kLanes)

__device__ __forceinline__ float Load(const float* x, int64_t i) { return x[i]; }
__device__ __forceinline__ float Load(const __nv_bfloat16* x, int64_t i) {
  return __bfloat162float(x[i]);
}

template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_down_sync(0xffffffffu, v, offset));
  return v;
}

template <typename Src>
__global__ void CastKernel(const Src* __restrict__ x, int64_t rows, int64_t cols,
                           const float* __restrict__ scale_ptr, __nv_fp8_interpretation_t format,
                           float bound, uint8_t* __restrict__ out, uint8_t* __restrict__ out_t,
                           unsigned int* amax_bits, unsigned int* finite_bits,
                           unsigned long long* counts) {
  __shared__ uint8_t tile[kTile][kTile + 4];
  const bool cast = out != nullptr || out_t != nullptr || counts != nullptr;
  const float scale = cast && scale_ptr != nullptr ? *scale_ptr : 1.0f;
  const int64_t tiles_c = (cols + kTile - 1) / kTile;
  const int64_t tiles = tiles_c * ((rows + kTile - 1) / kTile);
  unsigned int local = 0, local_finite = 0;
  unsigned long long over = 0, under = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    const int64_t c = c0 + threadIdx.x;
    for (int i = threadIdx.y; i < kTile; i += kLanes) {
      const int64_t r = r0 + i;
      if (r >= rows || c >= cols) continue;
      const float v = Load(x, r * cols + c);
      const unsigned int bits = __float_as_uint(v) & 0x7fffffffu;
      local = max(local, bits);
      if (bits < 0x7f800000u) local_finite = max(local_finite, bits);
      if (!cast) continue;
      const float s = __fmul_rn(v, scale);
      const uint8_t q = static_cast<uint8_t>(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, format));
      if (out != nullptr) out[r * cols + c] = q;
      tile[i][threadIdx.x] = q;
      over += fabsf(s) > bound;  // NaN compares false, as in ATen
      under += v != 0.0f && (q & 0x7f) == 0;
    }
    if (out_t != nullptr) {
      __syncthreads();
      // Thread x now walks a row of the transpose: out_t[c0 + i][r0 + x].
      const int64_t r = r0 + threadIdx.x;
      for (int i = threadIdx.y; i < kTile; i += kLanes) {
        const int64_t cc = c0 + i;
        if (cc < cols && r < rows) out_t[cc * rows + r] = tile[threadIdx.x][i];
      }
      __syncthreads();
    }
  }
  if (counts != nullptr && (over | under) != 0) {
    atomicAdd(&counts[0], over);
    atomicAdd(&counts[1], under);
  }
  local = WarpMax(local);
  local_finite = WarpMax(local_finite);
  __shared__ unsigned int warp_max[kTile * kLanes / 32][2];
  const int lane = threadIdx.y * kTile + threadIdx.x;
  if ((lane & 31) == 0) {
    warp_max[lane / 32][0] = local;
    warp_max[lane / 32][1] = local_finite;
  }
  __syncthreads();
  if (lane == 0) {
    unsigned int m = 0, mf = 0;
    for (int w = 0; w < kTile * kLanes / 32; ++w) {
      m = max(m, warp_max[w][0]);
      mf = max(mf, warp_max[w][1]);
    }
    if (amax_bits != nullptr) atomicMax(amax_bits, m);
    if (finite_bits != nullptr) atomicMax(finite_bits, mf);
  }
}

}  // namespace

std::string CastCuda(const CastArgs& a, void* stream) {
  const int64_t n = a.rows * a.cols;
  if (n <= 0) return "";
  if (a.scale == nullptr && (a.out != nullptr || a.out_t != nullptr)) {
    return "CastCuda: a cast needs a scale";
  }
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  const int64_t tiles = ((a.rows + kTile - 1) / kTile) * ((a.cols + kTile - 1) / kTile);
  const int blocks = static_cast<int>(tiles < 8LL * sms ? tiles : 8LL * sms);
  const dim3 threads(kTile, kLanes);
  const auto format = a.format == Fp8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2;
  const float bound = OverflowBound(a.format);
  auto* amax = reinterpret_cast<unsigned int*>(a.amax);
  auto* finite = reinterpret_cast<unsigned int*>(a.amax_finite);
  auto* counts = reinterpret_cast<unsigned long long*>(a.counts);
  auto s = static_cast<cudaStream_t>(stream);
  if (a.source == SourceKind::kFloat32) {
    CastKernel<<<blocks, threads, 0, s>>>(static_cast<const float*>(a.x), a.rows, a.cols, a.scale,
                                          format, bound, a.out, a.out_t, amax, finite, counts);
  } else {
    CastKernel<<<blocks, threads, 0, s>>>(static_cast<const __nv_bfloat16*>(a.x), a.rows, a.cols,
                                          a.scale, format, bound, a.out, a.out_t, amax, finite,
                                          counts);
  }
  err = cudaGetLastError();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

}  // namespace tally::kernels
