// Design note. Row-wise scaling needs a row's amax before any of its
// values can be cast, so each operand is read twice, inside one kernel:
// the amax pass, then the cast pass, walking the strip in the opposite
// direction so that its first tiles read what the amax pass read last
// (the likeliest still in L2). Per row (axis kRows) a warp reduces a row
// (16-byte loads, shuffles) and the cast is fp8_cast's tile under a scale
// per row; per column (kColumns) a thread per row keeps 16 columns' running
// maxima, and the cast writes the transpose directly, so the operands the
// backward reads transposed (W^T, dY^T, X^T) cost no .t().contiguous()
// copy. Scales are computed on the device in FP64 as the CPU reference
// computes them (cast_math::RowScale), so kernel and reference agree bit
// for bit. The per-thread code is kernels/cast_tile.h's (checked on the
// CPU by cast_tile_test.cc).
#include <cuda_runtime.h>

#include "kernels/cast_tile.cuh"
#include "kernels/rowwise_cast.h"

namespace tally::kernels {
namespace {

using namespace cast_tile;  // NOLINT: the shared tile's vocabulary

struct RowScales {
  const float* scale;  // the strip's, from its first row
  __device__ float operator()(int i) const { return scale[i]; }
};

struct ScaleOutputs {
  float* scale;
  float* inv_scale;
  float max;  // the format's largest finite value
  int margin;
};

__device__ __forceinline__ float WriteScale(const ScaleOutputs& s, int64_t i, unsigned int bits) {
  const float scale = cast_math::RowScale(__uint_as_float(bits), s.max, s.margin);
  s.scale[i] = scale;
  s.inv_scale[i] = cast_math::Inverse(scale);
  return scale;
}

template <typename Src>
__global__ void __launch_bounds__(kThreads, 4)
    RowsKernel(const Src* __restrict__ x, Target t, ScaleOutputs so, unsigned int* amax_bits,
               unsigned long long* counts) {
  __shared__ __align__(16) uint8_t tile[kTileRows][kTileStride];
  __shared__ float scale[kTileRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t strips = (t.rows + kTileRows - 1) / kTileRows;
  const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
  const SourceProducer<Src> source{x, t.cols};
  Tally tally;
  for (int64_t s = blockIdx.x; s < strips; s += gridDim.x) {
    const int64_t r0 = s * kTileRows;
    for (int i = warp; i < kTileRows; i += kWarps) {
      const int64_t r = r0 + i;
      if (r >= t.rows) break;  // the same for the whole warp
      unsigned int m = AbsMaxBits(x, t.cols, r, lane, &tally);
#pragma unroll
      for (int d = 16; d > 0; d /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, d));
      if (lane == 0) scale[i] = WriteScale(so, r, m);
    }
    __syncthreads();
    for (int64_t c = tiles_c - 1; c >= 0; --c) {
      CastTile(source, RowScales{scale}, t, r0, c * kTileCols, tile, &tally);
    }
    __syncthreads();  // scale is the next strip's
  }
  Fold(tally, amax_bits, nullptr, counts);
}

// 16 column maxima per thread: fewer blocks per SM than the row kernel's
// register budget allows.
template <typename Src>
__global__ void __launch_bounds__(kThreads, 3)
    ColumnsKernel(const Src* __restrict__ x, Target t, ScaleOutputs so, unsigned int* amax_bits,
                  unsigned long long* counts) {
  __shared__ __align__(16) uint8_t strip[kStripRows][kStripStride];
  __shared__ unsigned int warp_max[kWarps][kStripCols];
  __shared__ float scale[kStripCols];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t strips = (t.cols + kStripCols - 1) / kStripCols;
  const int64_t tiles_r = (t.rows + kStripRows - 1) / kStripRows;
  Tally tally;
  for (int64_t s = blockIdx.x; s < strips; s += gridDim.x) {
    const int64_t c0 = s * kStripCols;
    unsigned int col_max[kStripCols];
#pragma unroll
    for (int k = 0; k < kStripCols; ++k) col_max[k] = 0;
    for (int64_t k = 0; k < tiles_r; ++k) {
      ColumnAmaxPhase(threadIdx.x, x, t.rows, t.cols, k * kStripRows, c0, col_max, &tally);
    }
#pragma unroll
    for (int k = 0; k < kStripCols; ++k) {
      unsigned int m = col_max[k];
#pragma unroll
      for (int d = 16; d > 0; d /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, d));
      if (lane == 0) warp_max[warp][k] = m;
    }
    __syncthreads();
    if (threadIdx.x < kStripCols) {
      unsigned int m = 0;
      for (int w = 0; w < kWarps; ++w) m = max(m, warp_max[w][threadIdx.x]);
      const int64_t c = c0 + threadIdx.x;
      scale[threadIdx.x] = c < t.cols ? WriteScale(so, c, m) : 1.0f;
    }
    __syncthreads();
    for (int64_t k = tiles_r - 1; k >= 0; --k) {
      ColumnCastPhase(threadIdx.x, x, t, k * kStripRows, c0, scale, strip, &tally);
      __syncthreads();
      ColumnStorePhase(threadIdx.x, t, k * kStripRows, c0, strip);
      __syncthreads();
    }
  }
  Fold(tally, amax_bits, nullptr, counts);
}

template <typename Src>
void Launch(const RowwiseCastArgs& a, const Target& t, const ScaleOutputs& so, int sms,
            cudaStream_t s) {
  const auto* x = static_cast<const Src*>(a.x);
  auto* amax = reinterpret_cast<unsigned int*>(a.amax);
  auto* counts = reinterpret_cast<unsigned long long*>(a.counts);
  if (a.axis == RowwiseAxis::kRows) {
    RowsKernel<<<Blocks((a.rows + kTileRows - 1) / kTileRows, sms), kThreads, 0, s>>>(x, t, so,
                                                                                      amax, counts);
  } else {
    ColumnsKernel<<<Blocks((a.cols + kStripCols - 1) / kStripCols, sms), kThreads, 0, s>>>(
        x, t, so, amax, counts);
  }
}

}  // namespace

std::string RowwiseCastCuda(const RowwiseCastArgs& a, void* stream) {
  if (a.rows <= 0 || a.cols <= 0) return "";
  if (a.out == nullptr || a.scale == nullptr || a.inv_scale == nullptr) {
    return "RowwiseCastCuda: out, scale and inv_scale are required";
  }
  int sms = 0;
  if (std::string err = Multiprocessors(&sms); !err.empty()) return err;
  Target t;
  t.rows = a.rows;
  t.cols = a.cols;
  (a.axis == RowwiseAxis::kRows ? t.out : t.out_t) = a.out;
  t.format = Interpretation(a.format);
  t.bound = OverflowBound(a.format);
  t.cast = true;
  const ScaleOutputs so{a.scale, a.inv_scale, Fp8Max(a.format), a.margin};
  auto s = static_cast<cudaStream_t>(stream);
  if (a.source == SourceKind::kFloat32) {
    Launch<float>(a, t, so, sms, s);
  } else {
    Launch<uint16_t>(a, t, so, sms, s);
  }
  return Launched();
}

}  // namespace tally::kernels
