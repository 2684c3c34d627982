// Row-wise FP8 scaling (torchao's row-wise recipe) as one kernel per
// operand: each row's amax, its scale, and the cast under it, where ATen
// takes about 18 passes (abs, amax, the scale's arithmetic, multiply,
// clamp, cast, counts, and a .t().contiguous() copy for the operands the
// backward reads transposed). CUDA kernel with a CPU reference (raw
// pointers and a stream, no LibTorch), bit for bit the same; nothing waits
// for the host.
//
// An operand of a row-wise at::_scaled_mm is [R, K] row-major with a scale
// per row (K the contraction): a is [M, K] with scale_a [M, 1]; b is
// [N, K] (passed as its .t()) with scale_b [1, N]. For y = x w^T, dX = dY
// W and dW = dY^T X the operands are x, w (per row: axis kRows) and dY
// (kRows, for dX), W^T, dY^T and X^T (per column of W, dY, X: axis
// kColumns, which reads the untransposed tensor and writes the transposed
// bytes, so no transposed copy is made).
//
// How the row-wise recipe calls it (worker/precision/rowwise_recipe.cc):
// per operand, RowwiseCastCuda on CUDA (RowwiseCastReference on the CPU)
// with `out` an uninitialised uint8 [R, K] buffer viewed afterwards as the
// FP8 dtype, `scale` and `inv_scale` FP32 [R]; the product is
// at::_scaled_mm(a8, b8.t(), inv_scale_a.view({M, 1}), inv_scale_b.view({1,
// N}), ...). amax (one FP32, zeroed by the caller before its first fold)
// is what Fp8Linears::ReportRowwiseAmax records; counts (two uint64,
// [clamped, flushed], added to) are Fp8Linears' counts. A weight's casts
// change only when the weight does: cache them per optimizer step.
#ifndef TALLY_KERNELS_ROWWISE_CAST_H_
#define TALLY_KERNELS_ROWWISE_CAST_H_

#include <cstdint>
#include <string>

#include "kernels/fp8_cast.h"

namespace tally::kernels {

// What gets a scale: each row of x, or each column (the rows of x^T).
enum class RowwiseAxis : uint8_t { kRows = 0, kColumns = 1 };

// The scale of a row (or column) whose largest |value| is amax:
// ScaleForAmax(amax, kind, margin, 1) of kernels/fp8_scaling.h, i.e.
// max / (amax x 2^margin) computed in FP64 and rounded to FP32, and 1 for
// a row that is all zeros, holds an Inf or NaN, or whose scale FP32 cannot
// hold. (ATen's version divides in FP32: its scales can differ in the last
// place.)
float RowwiseScale(float amax, Fp8Kind kind, int margin);

// x [rows, cols], FP32 or BF16. With axis kRows, for each row r:
//   scale[r] = RowwiseScale(max_c |x[r][c]|), inv_scale[r] = 1 / scale[r]
//     (FP64 division rounded to FP32)
//   out[r][c] = FloatToFp8(x[r][c] x scale[r]) (the product in FP32), out
//     [rows, cols]
// With kColumns the same per column c, and out [cols, rows] holds
//   out[c][r] = FloatToFp8(x[r][c] x scale[c]): the transposed operand.
// amax (optional) folds max |x| over the whole tensor into *amax as
// CastArgs' amax does (raw: a NaN anywhere makes it NaN); counts (optional)
// add the clamped and flushed values as CastArgs' counts do. out, scale
// and inv_scale are required.
struct RowwiseCastArgs {
  const void* x = nullptr;
  SourceKind source = SourceKind::kFloat32;
  int64_t rows = 0, cols = 0;
  RowwiseAxis axis = RowwiseAxis::kRows;
  Fp8Kind format = Fp8Kind::kE4M3;
  int margin = 0;
  uint8_t* out = nullptr;
  float* scale = nullptr;      // [rows] (kRows) or [cols] (kColumns)
  float* inv_scale = nullptr;  // the same shape
  float* amax = nullptr;
  uint64_t* counts = nullptr;  // [2]
};

void RowwiseCastReference(const RowwiseCastArgs& args);

// kRows: a block per 32-row strip (grid-stride): each warp takes 4 rows'
// amaxes (16-byte loads, shuffles), lane 0 their scales into shared memory
// and the outputs, then the strip's 32 x 128 tiles, last first, are cast
// as kernels/fp8_cast.cu casts them (16-byte loads and stores). kColumns: a
// block per 16-column strip (grid-stride): a thread per row takes running
// column maxima over the strip (one 16-byte-aligned row segment per thread
// per 256 rows), reduced through shuffles and shared memory into 16
// scales; then the strip is cast 256 rows at a time, bottom first, and
// written transposed through shared memory, 16 bytes per thread.
std::string RowwiseCastCuda(const RowwiseCastArgs& args, void* stream);

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_ROWWISE_CAST_H_
