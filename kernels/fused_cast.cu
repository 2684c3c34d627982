// Design note. Without fusion, the FP8 linear's input costs a pass to make
// it (RMSNorm reads x and writes y; SwiGLU reads x13 and writes y) and a
// pass to cast it (reads y, writes the FP8 bytes and their transpose), with
// y kept alive in between (and, on CUDA, in FP32 for the norm). Fused, the
// op's output goes straight into fp8_cast's tile (kernels/cast_tile.h):
// x13 is read once; x is read twice (RMSNorm needs a row's sum of squares
// before its first output), the second time mostly from L2, and y is
// written only when asked for.
//
// RMSNorm: a block owns 32-row strips (grid-stride). First pass: each of
// its 8 warps sums the squares of 4 rows, a lane per 8-element chunk
// (16-byte loads), lanes combined by an xor butterfly of shuffles; the
// order is fused_cast.h's, so the CPU reference repeats it exactly. The 32
// reciprocals go to shared memory. Second pass: the strip's 32 x 128 tiles,
// last first, each produced (x rstd gain, 16-byte loads of x and gain),
// rounded to y's dtype, optionally stored (16-byte stores) and cast as
// fp8_cast casts. SwiGLU: fp8_cast's grid-stride tile loop, producing each
// value from a and b (two 16-byte-load streams). The arithmetic is
// cast_math.h's, shared with the references.
#include <cuda_runtime.h>

#include "kernels/cast_tile.cuh"
#include "kernels/fused_cast.h"

namespace tally::kernels {
namespace {

using namespace cast_tile;  // NOLINT: the shared tile's vocabulary

struct Outputs {
  const float* scale;
  unsigned int* amax;
  unsigned int* finite;
  unsigned long long* counts;
};

Target TargetOf(const Fp8Out& o, int64_t rows, int64_t cols) {
  Target t;
  t.rows = rows;
  t.cols = cols;
  t.out = o.out;
  t.out_t = o.out_t;
  t.format = Interpretation(o.format);
  t.bound = OverflowBound(o.format);
  t.cast = o.out != nullptr || o.out_t != nullptr || o.counts != nullptr;
  return t;
}

Outputs OutputsOf(const Fp8Out& o) {
  return {o.scale, reinterpret_cast<unsigned int*>(o.amax),
          reinterpret_cast<unsigned int*>(o.amax_finite),
          reinterpret_cast<unsigned long long*>(o.counts)};
}

__device__ __forceinline__ float ScaleFrom(const Target& t, const float* scale) {
  return t.cast && scale != nullptr ? *scale : 1.0f;
}

template <typename Src, typename Out>
__global__ void __launch_bounds__(kThreads, 4)
    RmsNormCastKernel(const Src* __restrict__ x, const float* __restrict__ gain, float eps,
                      Out* __restrict__ y, float* __restrict__ rstd_out, Target t, Outputs o) {
  __shared__ __align__(16) uint8_t tile[kTileRows][kTileStride];
  __shared__ float rstd[kTileRows];
  const UniformScale scale{ScaleFrom(t, o.scale)};
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t strips = (t.rows + kTileRows - 1) / kTileRows;
  const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
  Tally tally;
  for (int64_t s = blockIdx.x; s < strips; s += gridDim.x) {
    const int64_t r0 = s * kTileRows;
    for (int i = warp; i < kTileRows; i += kWarps) {
      const int64_t r = r0 + i;
      if (r >= t.rows) break;  // the same for the whole warp
      float sum = SumSquares(x, t.cols, r, lane);
#pragma unroll
      for (int d = 16; d > 0; d /= 2) {
        sum = cast_math::Add(sum, __shfl_xor_sync(0xffffffffu, sum, d));
      }
      if (lane == 0) {
        rstd[i] = cast_math::Rstd(sum, t.cols, eps);
        if (rstd_out != nullptr) rstd_out[r] = rstd[i];
      }
    }
    __syncthreads();
    const NormProducer<Src, Out> norm{x, t.cols, gain, rstd, r0, y};
    for (int64_t c = tiles_c - 1; c >= 0; --c) {
      CastTile(norm, scale, t, r0, c * kTileCols, tile, &tally);
    }
    __syncthreads();  // rstd is the next strip's
  }
  Fold(tally, o.amax, o.finite, o.counts);
}

template <typename Src, typename Out>
__global__ void __launch_bounds__(kThreads, 4)
    SwiGluCastKernel(const Src* __restrict__ x13, Out* __restrict__ y, Target t, Outputs o) {
  __shared__ __align__(16) uint8_t tile[kTileRows][kTileStride];
  const UniformScale scale{ScaleFrom(t, o.scale)};
  const SwiGluProducer<Src, Out> swiglu{x13, t.cols, y};
  const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = tiles_c * ((t.rows + kTileRows - 1) / kTileRows);
  Tally tally;
  for (int64_t k = blockIdx.x; k < tiles; k += gridDim.x) {
    CastTile(swiglu, scale, t, (k / tiles_c) * kTileRows, (k % tiles_c) * kTileCols, tile, &tally);
  }
  Fold(tally, o.amax, o.finite, o.counts);
}

template <typename Src, typename Out>
void LaunchNorm(const RmsNormCastArgs& a, const Target& t, const Outputs& o, int blocks,
                cudaStream_t s) {
  RmsNormCastKernel<Src, Out><<<blocks, kThreads, 0, s>>>(
      static_cast<const Src*>(a.x), a.gain, a.eps, static_cast<Out*>(a.y), a.rstd, t, o);
}

template <typename Src, typename Out>
void LaunchSwiGlu(const SwiGluCastArgs& a, const Target& t, const Outputs& o, int blocks,
                  cudaStream_t s) {
  SwiGluCastKernel<Src, Out>
      <<<blocks, kThreads, 0, s>>>(static_cast<const Src*>(a.x13), static_cast<Out*>(a.y), t, o);
}

std::string CheckScale(const Fp8Out& o, const char* name) {
  if (o.scale == nullptr && (o.out != nullptr || o.out_t != nullptr)) {
    return std::string(name) + ": a cast needs a scale";
  }
  return "";
}

}  // namespace

std::string RmsNormCastCuda(const RmsNormCastArgs& a, void* stream) {
  if (a.rows <= 0 || a.cols <= 0) return "";
  if (std::string err = CheckScale(a.fp8, "RmsNormCastCuda"); !err.empty()) return err;
  if (a.gain == nullptr) return "RmsNormCastCuda: gain is required";
  int sms = 0;
  if (std::string err = Multiprocessors(&sms); !err.empty()) return err;
  const Target t = TargetOf(a.fp8, a.rows, a.cols);
  const Outputs o = OutputsOf(a.fp8);
  const int blocks = Blocks((a.rows + kTileRows - 1) / kTileRows, sms);
  auto s = static_cast<cudaStream_t>(stream);
  const bool x32 = a.x_dtype == Dtype::kFloat32, y32 = a.y_dtype == Dtype::kFloat32;
  if (x32 && y32) LaunchNorm<float, float>(a, t, o, blocks, s);
  if (x32 && !y32) LaunchNorm<float, uint16_t>(a, t, o, blocks, s);
  if (!x32 && y32) LaunchNorm<uint16_t, float>(a, t, o, blocks, s);
  if (!x32 && !y32) LaunchNorm<uint16_t, uint16_t>(a, t, o, blocks, s);
  return Launched();
}

std::string SwiGluCastCuda(const SwiGluCastArgs& a, void* stream) {
  if (a.rows <= 0 || a.cols <= 0) return "";
  if (std::string err = CheckScale(a.fp8, "SwiGluCastCuda"); !err.empty()) return err;
  int sms = 0;
  if (std::string err = Multiprocessors(&sms); !err.empty()) return err;
  const Target t = TargetOf(a.fp8, a.rows, a.cols);
  const Outputs o = OutputsOf(a.fp8);
  const int blocks =
      Blocks(((a.rows + kTileRows - 1) / kTileRows) * ((a.cols + kTileCols - 1) / kTileCols), sms);
  auto s = static_cast<cudaStream_t>(stream);
  const bool x32 = a.x_dtype == Dtype::kFloat32, y32 = a.y_dtype == Dtype::kFloat32;
  if (x32 && y32) LaunchSwiGlu<float, float>(a, t, o, blocks, s);
  if (x32 && !y32) LaunchSwiGlu<float, uint16_t>(a, t, o, blocks, s);
  if (!x32 && y32) LaunchSwiGlu<uint16_t, float>(a, t, o, blocks, s);
  if (!x32 && !y32) LaunchSwiGlu<uint16_t, uint16_t>(a, t, o, blocks, s);
  return Launched();
}

}  // namespace tally::kernels
