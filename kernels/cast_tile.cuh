// The device side of kernels/cast_tile.h: a whole tile with its barriers,
// the block's fold of amaxes and counts, and launch helpers. Included by
// the cast kernels' .cu files only.
#ifndef TALLY_KERNELS_CAST_TILE_CUH_
#define TALLY_KERNELS_CAST_TILE_CUH_

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cast_tile.h"

namespace tally::kernels::cast_tile {

// One tile, both phases. Every thread of the block calls it (it
// synchronises when it writes the transpose).
template <class Producer, class ScaleOf>
__device__ __forceinline__ void CastTile(const Producer& p, const ScaleOf& scale_of,
                                         const Target& t, int64_t r0, int64_t c0,
                                         uint8_t (*tile)[kTileStride], Tally* tally) {
  RowMajorPhase(threadIdx.x, p, scale_of, t, r0, c0, tile, tally);
  if (WritesTranspose(t)) {
    __syncthreads();
    TransposedPhase(threadIdx.x, t, r0, c0, tile);
    __syncthreads();
  }
}

template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    v = max(v, __shfl_down_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Folds the block's tallies into the outputs: one atomicAdd per count per
// thread that saw any, one atomicMax per amax per block. Every thread of
// the block calls it.
__device__ inline void Fold(Tally t, unsigned int* amax_bits, unsigned int* finite_bits,
                            unsigned long long* counts) {
  if (counts != nullptr && (t.over | t.under) != 0) {
    atomicAdd(&counts[0], t.over);
    atomicAdd(&counts[1], t.under);
  }
  const unsigned int m = WarpMax(t.amax), mf = WarpMax(t.finite);
  __shared__ unsigned int warp_max[kWarps][2];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_max[warp][0] = m;
    warp_max[warp][1] = mf;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned int bm = 0, bf = 0;
    for (int w = 0; w < kWarps; ++w) {
      bm = max(bm, warp_max[w][0]);
      bf = max(bf, warp_max[w][1]);
    }
    if (amax_bits != nullptr) atomicMax(amax_bits, bm);
    if (finite_bits != nullptr) atomicMax(finite_bits, bf);
  }
}

// The number of SMs of the current device, or the CUDA error.
inline std::string Multiprocessors(int* sms) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) {
    err = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, device);
  }
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

// Blocks for `work` independent units: at most 8 per SM (the loops are
// grid-stride), at least 1.
inline int Blocks(int64_t work, int sms) {
  const int64_t cap = 8LL * sms;
  return static_cast<int>(work < 1 ? 1 : (work < cap ? work : cap));
}

inline std::string Launched() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

}  // namespace tally::kernels::cast_tile

#endif  // TALLY_KERNELS_CAST_TILE_CUH_
