// Row-wise scaling (torchao's row-wise recipe): current scaling per row
// instead of per tensor. Forward: Y [M, N] = X [M, K] W [N, K]^T with a
// scale per row of X (token) and per row of W (output channel). Backward:
// dX = dY W scales dY per row and W per column (K); dW = dY^T X scales dY
// per column (N) and X per column (K). On CUDA each is one row-wise
// _scaled_mm. Every scale comes from its own rows, on the device: nothing
// carries over, nothing is checkpointed.
//
// Each weight is cast both ways once per optimizer step (the converter's
// cache); the forward casts x per row for its product and per column for
// the weight gradient, and keeps only the latter (FP8) for the backward.
// The casts are ATen passes (an amax, a scale, a clamp-and-cast and the
// counts), not yet a fused kernel: kernels/ has no row-wise cast.
#include <string>
#include <utility>

#include "worker/precision/converter.h"
#include "worker/precision/fp8_recipe.h"
#include "worker/precision/linear.h"

namespace tally::precision {
namespace {

class RowwiseRecipe final : public Fp8Recipe {
 public:
  Recipe kind() const override { return Recipe::kRowwise; }
  bool KeepsState() const override { return false; }
  bool PerTensor() const override { return false; }
  Scale ScaleFor(ScalingTable*, int64_t, const at::Tensor&, bool, bool*) const override {
    TORCH_CHECK(false, "the row-wise recipe has no per-tensor scales");
  }
  void OnOptimizerStep(ScalingTable* table) const override { table->StepCurrent(); }
};

using internal::RowwiseImage;

// The FP32 values of an image (CPU): its own when it keeps them.
at::Tensor DequantizedOf(const RowwiseImage& a) {
  return a.dequantized.defined() ? a.dequantized : internal::Dequantized(a.data, a.scale);
}

// a [M, K] times b [N, K]^T, each scaled per row: CUDA one row-wise
// _scaled_mm (scale_a [M, 1], scale_b [1, N], FP32), BF16 out, fast
// accumulation for the forward product only (linear.cc says why); CPU FP32.
at::Tensor RowwiseProduct(const RowwiseImage& a, const RowwiseImage& b, bool fast_accum) {
  if (a.data.is_cuda()) {
    return at::_scaled_mm(a.data, b.data.t(), a.inv_scale, b.inv_scale.reshape({1, -1}), {}, {},
                          at::kBFloat16, fast_accum);
  }
  return at::matmul(DequantizedOf(a), DequantizedOf(b).t());
}

}  // namespace

std::unique_ptr<Fp8Recipe> MakeRowwiseRecipe() { return std::make_unique<RowwiseRecipe>(); }

namespace internal {

RowwiseImage RowwiseCast(Fp8Linears* linears, const at::Tensor& a, Fp8Format format,
                         const std::string& group) {
  QuantStats q;
  RowwiseImage image;
  at::Tensor amax;
  image.data =
      QuantizeAlongLater(a, 1, format, linears->config().margin, &q, &image.scale, &amax);
  image.inv_scale = 1.0 / image.scale;
  linears->AddRowwise(q);
  if (!group.empty()) linears->ReportRowwiseAmax(group, amax.max());
  return image;
}

at::Tensor RowwiseForward(Fp8Linears* linears, const Fp8Layer& layer, const at::Tensor& x2,
                          const at::Tensor& w, RowwiseImage* x_cols) {
  const RowwiseWeight& wi = linears->RowwiseWeightImage(layer, w);
  const RowwiseImage xi = RowwiseCast(linears, x2, Fp8Format::kE4M3, layer.group + ".input");
  // The weight gradient's operand, x^T [K, M] per row: cast now, so the
  // backward needs no copy of x (the same amax as x's, not reported twice).
  *x_cols = RowwiseCast(linears, x2.t().contiguous(), Fp8Format::kE4M3, "");
  linears->CountProducts(1, 1);
  return RowwiseProduct(xi, wi.rows, /*fast_accum=*/true);
}

std::pair<at::Tensor, at::Tensor> RowwiseBackward(Fp8Linears* linears, const Fp8Layer& layer,
                                                  const at::Tensor& g2, const RowwiseImage& x_cols,
                                                  const at::Tensor& w) {
  const RowwiseWeight& wi = linears->RowwiseWeightImage(layer, w);
  // dX [M, K] = dY [M, N] x (W^T [K, N])^T: dY per row, W^T per row (W per column).
  const RowwiseImage gi = RowwiseCast(linears, g2, Fp8Format::kE5M2, layer.group + ".grad");
  const at::Tensor gx = RowwiseProduct(gi, wi.cols, /*fast_accum=*/false);
  // dW [N, K] = dY^T [N, M] x (X^T [K, M])^T: both along M.
  const RowwiseImage gti = RowwiseCast(linears, g2.t().contiguous(), Fp8Format::kE5M2, "");
  const at::Tensor gw = RowwiseProduct(gti, x_cols, /*fast_accum=*/false);
  linears->CountProducts(2, 2);
  return {gx, gw};
}

}  // namespace internal

}  // namespace tally::precision
