// Casts to FP8 fused into the op that produces the FP8 linear's input, as
// TransformerEngine fuses them: RMSNorm + cast (the input of wq|wk|wv and
// of w1|w3) and SwiGLU + cast (the input of w2). Each reads its inputs
// once and writes, in the same pass, what kernels/fp8_cast.h's CastCuda
// would write for the op's output: the FP8 bytes row-major and transposed,
// the raw and finite amax and the clamped/flushed counts, under a scale
// read from device memory. CUDA kernels with CPU references (raw pointers
// and a stream, no LibTorch), bit for bit the same; nothing waits for the
// host.
//
// The value that is cast is the op's output rounded to `y_dtype` (BF16 on
// CUDA, where autocast makes the products' inputs BF16; FP32 on the CPU):
// the FP8 outputs equal CastReference applied to the y this call writes
// (or would write: y itself is optional). Arithmetic is FP32 in a fixed
// order, every product and sum rounded on its own (kernels/cast_math.h);
// NaN results are the canonical NaN (0x7fffffff, in BF16 0x7fff), so even
// a NaN amax is the same bits on both sides.
//
// How the FP8 linear calls them (worker/precision): the scale, amax and
// counts are the input tensor's entries of the scaling table, exactly as
// for CastFp8 (scale = table.scale(t), amax/amax_finite = the step's amax
// sinks when the recipe records them, counts = the step's counts); `out`
// is the forward product's operand ([M, K] row-major, at::_scaled_mm's
// first argument) and `out_t` the transpose the weight gradient reads
// ([K, M]); y is written only where something still reads the
// high-precision value (the MoE router reads the norm's output; a dense
// FP8 block needs no y from either kernel). Shapes and dtypes are checked
// by the caller; pointers are device pointers for *Cuda, host pointers for
// *Reference. Errors: *Cuda return "" or the CUDA error, and never exit.
#ifndef TALLY_KERNELS_FUSED_CAST_H_
#define TALLY_KERNELS_FUSED_CAST_H_

#include <cstdint>
#include <string>

#include "kernels/elementwise.h"
#include "kernels/fp8_cast.h"

namespace tally::kernels {

// The FP8 image a fused cast writes, with CastArgs' meaning for each field
// (null: not written; amax and amax_finite fold into what is there, counts
// add to it). scale may be null only when out and out_t are.
struct Fp8Out {
  const float* scale = nullptr;  // one value
  Fp8Kind format = Fp8Kind::kE4M3;
  uint8_t* out = nullptr;    // [rows, cols]
  uint8_t* out_t = nullptr;  // [cols, rows]
  float* amax = nullptr;
  float* amax_finite = nullptr;
  uint64_t* counts = nullptr;  // [2]: clamped, flushed
};

// RMSNorm + cast. For each row r of x [rows, cols] (FP32 or BF16):
//   sum_sq = the sum of x[r][c]^2 in the order below
//   rstd[r] = 1 / sqrt(sum_sq / cols + eps)
//   y[r][c] = (x[r][c] rstd[r]) gain[c], rounded to y_dtype
// and y cast to FP8 into `fp8`. The order of sum_sq (what the kernel's warp
// computes): lane l of 32 sums the squares of its 8-element chunks l, l+32,
// l+64, ... (elements 8m..8m+7 of chunk m) in element order; the 32 lane
// sums are combined pairwise, for d = 16, 8, 4, 2, 1: s[l] = s[l] + s[l^d].
// gain is FP32 [cols] (convert a BF16 gain first: cols values). eps is the
// model's norm_eps as FP32. rstd [rows] FP32 is optional: with x and gain
// it is all the norm's backward needs (dx = rstd (g gain - x rstd^2
// mean(g gain x)), dgain = sum over rows of g x rstd).
struct RmsNormCastArgs {
  const void* x = nullptr;
  Dtype x_dtype = Dtype::kFloat32;
  int64_t rows = 0, cols = 0;
  const float* gain = nullptr;
  float eps = 1e-5f;
  Dtype y_dtype = Dtype::kBFloat16;
  void* y = nullptr;      // [rows, cols] in y_dtype, optional
  float* rstd = nullptr;  // [rows], optional
  Fp8Out fp8;
};

void RmsNormCastReference(const RmsNormCastArgs& args);
// One block per 32-row strip (grid-stride): the strip's sums of squares
// (a warp per row, 16-byte loads), then its 32 x 128 tiles from the last
// to the first (the tail of the strip is the likeliest still in L2), each
// as fp8_cast's tile (16-byte loads and stores, the transpose through
// shared memory).
std::string RmsNormCastCuda(const RmsNormCastArgs& args, void* stream);

// SwiGLU + cast on the joint gate/up product x13 [rows, 2 cols] (FP32 or
// BF16; a = x13[:, :cols], w1's output, b = x13[:, cols:], w3's):
//   y[r][c] = (a sigmoid(a)) b, sigmoid(a) = 1 / (1 + exp(-a)), rounded
//   to y_dtype
// with cast_math::Exp (within 2 ulps of e^x; not expf, whose last place
// differs between CUDA and the host's library: the FP32 y may differ from
// SwiGluForwardCuda's by an ulp or two), and y cast to FP8 into `fp8`: the
// w2 product's input. The backward reads x13 (SwiGluBackwardCuda), so y is
// optional.
struct SwiGluCastArgs {
  const void* x13 = nullptr;
  Dtype x_dtype = Dtype::kBFloat16;
  int64_t rows = 0, cols = 0;
  Dtype y_dtype = Dtype::kBFloat16;
  void* y = nullptr;  // [rows, cols] in y_dtype, optional
  Fp8Out fp8;
};

void SwiGluCastReference(const SwiGluCastArgs& args);
// Grid-stride over 32 x 128 tiles of y, as fp8_cast's kernel.
std::string SwiGluCastCuda(const SwiGluCastArgs& args, void* stream);

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_FUSED_CAST_H_
