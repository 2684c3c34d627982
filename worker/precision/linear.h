// The FP8 linear: y = x w^T as a LibTorch autograd function whose three
// products (output, input gradient, weight gradient) take FP8 operands and
// accumulate in FP32. Forward: input and weight are cast to E4M3; backward:
// the output gradient to E5M2. Master weights and optimizer state stay FP32.
// Also the statistics every FP8 product adds to (Fp8Stats) and one layer's
// scaling entries (Fp8Layer).
//
// Per-tensor recipes: every cast is the fused cast (quantize.h) under a
// scale on the device (the recipe's, fp8_recipe.h), writing the layouts the
// products read; the weight is cast once per optimizer step (row-major and
// transposed) and reused by every micro-batch, and an input two layers share
// (w1 and w3 read the same h) is cast once. CUDA: every
// product is at::_scaled_mm on those bytes with the inverse scales from
// device memory (the second operand column-major, dimensions multiples of
// 16; a shape it cannot take runs in BF16 and is counted); nothing reads a
// value back to the host. Forward products accumulate fast (the tensor
// cores' accumulator over the whole K, as TransformerEngine's forward),
// the two backward products exactly. CPU: the same bytes dequantized
// (FP8 / scale) and multiplied in FP32, so CPU tests check what the GPU
// computes up to accumulation order. Row-wise: rowwise_recipe.cc.
//
// What the forward keeps for the backward (the autograd graph's share of a
// step's memory): x's FP8 bytes and their scale, never x itself — on CUDA
// the transpose the weight gradient reads (1 byte an element), on the CPU
// the row-major bytes the backward dequantizes (the same values the forward
// multiplied); the weight's image is the optimizer step's, shared with every
// micro-batch. A product run in BF16 (a shape _scaled_mm cannot take) keeps
// x in BF16. Row-wise keeps x's FP8 image scaled per column (the one its
// weight gradient reads), cast in the forward.
//
// Not thread-safe: one trainer owns it.
#ifndef TALLY_WORKER_PRECISION_LINEAR_H_
#define TALLY_WORKER_PRECISION_LINEAR_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "worker/precision/quantize.h"
#include "worker/precision/scaling.h"

namespace tally::precision {

struct Fp8Stats {
  int64_t overflows = 0;
  int64_t underflows = 0;
  int64_t elements = 0;        // values cast to FP8
  int64_t fp8_products = 0;    // matrix products computed in FP8
  int64_t total_products = 0;  // all products of the converted layers
  int64_t grouped_products = 0;  // expert products run inside grouped ones
  // The step's largest amax per tensor group ("attention.input",
  // "ffn.grad", ...): NaN when any of the group's casts saw one.
  std::map<std::string, double> amax;
};

// One converted linear's scaling entries in the converter's ScalingTable:
// its input (x), weight (w) and output gradient (g). `group` is "ffn" for
// feed-forward sites (.w1, .w2, .w3), else "attention". A w3's input entry
// is its w1's (both read the same h).
struct Fp8Layer {
  std::string site;
  std::string group;
  int64_t x = -1, w = -1, g = -1;
  // A w1 or w3 computed as a product of its own (an expert's, or a dense
  // feed-forward's without the joint product): the other reads the same
  // input just before or after, so the first one's input cast is kept until
  // the second takes it.
  bool input_read_again = false;
};

// A tensor cast to FP8 for products: the bytes the products read, the scale
// they were cast with, and (CPU) their FP32 values dequantized.
struct Fp8Image {
  at::Tensor data;         // [M, K] row-major
  at::Tensor data_t;       // [K, M] (CUDA)
  Scale scale;
  at::Tensor dequantized;  // [M, K] FP32 (CPU)
  // CPU, RecipeConfig::emulate_bf16_intermediates: products of this image
  // round their output to BF16, as CUDA's do.
  bool bf16_outputs = false;
};

class Fp8Linears;

// x [..., K] times w [N, K]^T in FP8, [..., N], differentiable in x and w.
// `layer` and `linears` must outlive the autograd graph this call builds.
at::Tensor Fp8Linear(const at::Tensor& x, const at::Tensor& w, const Fp8Layer* layer,
                     Fp8Linears* linears);

// A feed-forward's w1 and w3 (each [F, K]) as one product: x [..., K] times
// [w1; w3]^T, [..., 2F] (w1's outputs first), differentiable in x, w1 and
// w3. x is cast once; each weight keeps its own scale (its layer's
// entries), so the numbers are those of the two separate FP8 linears. CUDA:
// one row-wise at::_scaled_mm over both weights' bytes (x's inverse scale
// on every row, each weight's on its output channels). Backward: the
// output gradient's halves are cast under w1's and w3's gradient scales and
// each half takes its two products. Per-tensor recipes only.
at::Tensor Fp8GateUpLinear(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3,
                           const Fp8Layer* layer1, const Fp8Layer* layer3, Fp8Linears* linears);

// A feed-forward's fused SwiGLU and w2: silu(a) * b for y13 = [a | b]
// ([..., 2F], w1|w3's output) times w2 [N, F]^T, [..., N], differentiable
// in y13 and w2. Where the scale of w2's input is known ahead (delayed
// scaling with a history) the SwiGLU and its FP8 cast are one pass
// (kernels/fused_cast.h), so the SwiGLU's output is never written; the
// backward runs w2's two products and the SwiGLU's backward on y13 (what
// the fused SwiGLU keeps anyway). Otherwise: the fused SwiGLU, then
// Fp8Linear.
at::Tensor Fp8SwiGluLinear(const at::Tensor& y13, const at::Tensor& w2, const Fp8Layer* layer,
                           Fp8Linears* linears);

// Shared by the files of worker/precision only; not for callers.
namespace internal {

// Whether at::_scaled_mm takes an [m, k] x [k, n] product.
bool ScaledMmShapeOk(int64_t m, int64_t k, int64_t n);

// An image's FP32 values from its row-major bytes: data / scale, as the
// cast that made them divides (CPU).
at::Tensor Dequantized(const at::Tensor& data, const at::Tensor& scale);

// Tests only (RecipeConfig::test_overflow_fraction): a copy of x2 with every
// round(1/fraction)-th value set to 16 times the E4M3 range under `scale`
// (on the device), its sign kept, so each of them overflows and is clamped.
at::Tensor ForceOverflows(const at::Tensor& x2, const at::Tensor& scale, double fraction);

// The per-tensor recipes' products on images (x [M, K], w [N, K], g
// [M, N]): y = x w^T, dX = g w, dW = g^T x. CUDA: at::_scaled_mm on the
// bytes (every dimension a multiple of 16), BF16 out; CPU: FP32 products of
// the dequantized images.
at::Tensor ForwardProduct(const Fp8Image& x, const Fp8Image& w);
at::Tensor InputGradProduct(const Fp8Image& g, const Fp8Image& w);
at::Tensor WeightGradProduct(const Fp8Image& g, const Fp8Image& x);

// A row-wise cast (rowwise_recipe.cc): a [R, C] in FP8, each row scaled
// from its own amax; scale [R, 1] FP32 is the factor the cast applied and
// inv_scale its inverse (what a product dequantizes with); dequantized
// (CPU) is data / scale in FP32.
struct RowwiseImage {
  at::Tensor data, scale, inv_scale, dequantized;
};
// A weight w [N, K] cast once per optimizer step both ways the row-wise
// products read it: per row (the forward) and w^T [K, N] per row, i.e. per
// column of w (the input gradient).
struct RowwiseWeight {
  RowwiseImage rows, cols;
};
// One row-wise cast of a [R, C] (FP32 or BF16; others as FP32) to
// `format`, per row, or with `columns` per column into the transposed
// image [C, R] (a^T per row, without a transposed copy); one pass of
// kernels/rowwise_cast.h. Its counts are added to the converter's
// statistics and its amax reported under `group` (empty: not reported).
RowwiseImage RowwiseCast(Fp8Linears* linears, const at::Tensor& a, Fp8Format format,
                         const std::string& group, bool columns);

// The row-wise recipe's forward and backward (rowwise_recipe.cc). The
// forward returns y and, in *x_cols, the image its weight gradient reads:
// x^T [K, M] per row (x per column), so the backward never needs x.
at::Tensor RowwiseForward(Fp8Linears* linears, const Fp8Layer& layer, const at::Tensor& x2,
                          const at::Tensor& w, RowwiseImage* x_cols);
std::pair<at::Tensor, at::Tensor> RowwiseBackward(Fp8Linears* linears, const Fp8Layer& layer,
                                                  const at::Tensor& g2,
                                                  const RowwiseImage& x_cols,
                                                  const at::Tensor& w);

}  // namespace internal
}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_LINEAR_H_
