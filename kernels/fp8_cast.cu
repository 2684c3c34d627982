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
// Each block walks 32 x 128 tiles (a grid-stride loop over tiles, so any
// size fits one launch; the per-thread code is kernels/cast_tile.h's): a
// thread reads 16 consecutive values of a row with 16-byte loads (four of
// FP32, two of BF16), converts them with the hardware instruction
// (__nv_cvt_float_to_fp8: round to nearest even, saturating to the finite
// range) and writes their 16 bytes with one 16-byte store; the transpose
// is gathered from shared memory and written 16 bytes per thread too.
// Unaligned segments and the edges take a scalar path with the same
// arithmetic. Amax is kept on bit patterns (sign cleared: floats order like
// their unsigned bits, every NaN above +Inf, so a NaN anywhere makes the
// amax NaN as ATen's max does); warps reduce with shuffles, blocks through
// shared memory, and one atomicMax per block and per amax folds the result.
// Counts: one atomicAdd per thread that saw any.
//
// What the PTX shows (nvcc 13.0, -arch=sm_90, `nvcc -ptx`; this toolkit
// has no cuobjdump, so no SASS was read): each kernel's vector path is
// 128-bit throughout. FP32 source: 4 ld.global.nc.v4.u32 per 16-value
// segment (the float4 loads, typed as bits); BF16: 2 ld.global.nc.v4.u32;
// both store the row-major bytes and the transposed bytes with one
// st.global.wb.v4.u32 each per segment. The scalar loads (ld.global.u32 /
// u16) and byte stores (st.global.u8) are the tail's and the unaligned
// path's. The conversion is cvt.rn.satfinite.e4m3x2.f32 (e5m2x2), 16 per
// segment. ptxas -v: 64 registers under __launch_bounds__(256, 4), no
// spills, 4.3 KB of shared memory. (The version before this one loaded and
// stored one element per instruction: ld.global.f32, st.global.u8.)
#include <cuda_runtime.h>

#include "kernels/cast_tile.cuh"
#include "kernels/fp8_cast.h"

namespace tally::kernels {
namespace {

using namespace cast_tile;  // NOLINT: the shared tile's vocabulary

template <typename Src>
__global__ void __launch_bounds__(kThreads, 4)
    CastKernel(const Src* __restrict__ x, Target t, const float* __restrict__ scale_ptr,
               unsigned int* amax_bits, unsigned int* finite_bits, unsigned long long* counts) {
  __shared__ __align__(16) uint8_t tile[kTileRows][kTileStride];
  const UniformScale scale{t.cast && scale_ptr != nullptr ? *scale_ptr : 1.0f};
  const SourceProducer<Src> source{x, t.cols};
  const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = tiles_c * ((t.rows + kTileRows - 1) / kTileRows);
  Tally tally;
  for (int64_t k = blockIdx.x; k < tiles; k += gridDim.x) {
    CastTile(source, scale, t, (k / tiles_c) * kTileRows, (k % tiles_c) * kTileCols, tile, &tally);
  }
  Fold(tally, amax_bits, finite_bits, counts);
}

}  // namespace

std::string CastCuda(const CastArgs& a, void* stream) {
  const int64_t n = a.rows * a.cols;
  if (n <= 0) return "";
  if (a.scale == nullptr && (a.out != nullptr || a.out_t != nullptr)) {
    return "CastCuda: a cast needs a scale";
  }
  int sms = 0;
  if (std::string err = Multiprocessors(&sms); !err.empty()) return err;
  Target t;
  t.rows = a.rows;
  t.cols = a.cols;
  t.out = a.out;
  t.out_t = a.out_t;
  t.format = Interpretation(a.format);
  t.bound = OverflowBound(a.format);
  t.cast = a.out != nullptr || a.out_t != nullptr || a.counts != nullptr;
  const int blocks =
      Blocks(((a.rows + kTileRows - 1) / kTileRows) * ((a.cols + kTileCols - 1) / kTileCols), sms);
  auto* amax = reinterpret_cast<unsigned int*>(a.amax);
  auto* finite = reinterpret_cast<unsigned int*>(a.amax_finite);
  auto* counts = reinterpret_cast<unsigned long long*>(a.counts);
  auto s = static_cast<cudaStream_t>(stream);
  if (a.source == SourceKind::kFloat32) {
    CastKernel<<<blocks, kThreads, 0, s>>>(static_cast<const float*>(a.x), t, a.scale, amax, finite,
                                           counts);
  } else {
    CastKernel<<<blocks, kThreads, 0, s>>>(static_cast<const uint16_t*>(a.x), t, a.scale, amax,
                                           finite, counts);
  }
  return Launched();
}

}  // namespace tally::kernels
