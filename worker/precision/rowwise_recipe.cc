// Row-wise scaling (torchao's row-wise recipe): current scaling per row
// instead of per tensor. Forward: Y [M, N] = X [M, K] W [N, K]^T with a
// scale per row of X (token) and per row of W (output channel). Backward:
// dX = dY W scales dY per row and W per column (K); dW = dY^T X scales dY
// per column (N) and X per column (K). On CUDA each is one row-wise
// _scaled_mm. Every scale comes from its own rows, on the device: nothing
// carries over, nothing is checkpointed.
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

using internal::QuantizeDequantizeAlongLater;
using internal::ScaledMmShapeOk;

// a [M, K] (scaled along a_dim) x b [N, K] (scaled along b_dim)^T.
at::Tensor RowwiseProduct(Fp8Linears* linears, const at::Tensor& a, int64_t a_dim, Fp8Format fa,
                          const at::Tensor& b, int64_t b_dim, Fp8Format fb, bool* in_fp8) {
  const int margin = linears->config().margin;
  QuantStats qa, qb;
  at::Tensor y;
  const bool cuda = a.is_cuda();
  if (cuda && !ScaledMmShapeOk(a.size(0), a.size(1), b.size(0))) {
    *in_fp8 = false;
    y = at::matmul(a.to(at::kBFloat16), b.to(at::kBFloat16).t());
  } else if (cuda) {
    *in_fp8 = true;
    at::Tensor sa, sb;
    QuantizeDequantizeAlongLater(a, a_dim, fa, margin, &qa, &sa);
    QuantizeDequantizeAlongLater(b, b_dim, fb, margin, &qb, &sb);
    const double max_a = Fp8Max(fa), max_b = Fp8Max(fb);
    at::Tensor a8 = (a.to(at::kFloat) * sa).clamp(-max_a, max_a).to(Fp8Dtype(fa));
    at::Tensor b8 = (b.to(at::kFloat) * sb).clamp(-max_b, max_b).to(Fp8Dtype(fb));
    // Row-wise _scaled_mm: scale_a [M, 1], scale_b [1, N], both FP32.
    y = at::_scaled_mm(a8, b8.t(), (1.0 / sa).reshape({-1, 1}).contiguous(),
                       (1.0 / sb).reshape({1, -1}).contiguous(), {}, {}, at::kBFloat16);
  } else {
    *in_fp8 = true;
    y = at::matmul(QuantizeDequantizeAlongLater(a, a_dim, fa, margin, &qa, nullptr),
                   QuantizeDequantizeAlongLater(b, b_dim, fb, margin, &qb, nullptr).t());
  }
  linears->AddRowwise(qa);
  linears->AddRowwise(qb);
  return y;
}

}  // namespace

std::unique_ptr<Fp8Recipe> MakeRowwiseRecipe() { return std::make_unique<RowwiseRecipe>(); }

namespace internal {

at::Tensor RowwiseForward(Fp8Linears* linears, const Fp8Layer& layer, const at::Tensor& x2,
                          const at::Tensor& w) {
  linears->ReportRowwiseAmax(layer.group + ".input", x2.detach().abs().max());
  linears->ReportRowwiseAmax(layer.group + ".weight", w.detach().abs().max());
  bool fp8 = false;
  at::Tensor y = RowwiseProduct(linears, x2, 1, Fp8Format::kE4M3, w, 1, Fp8Format::kE4M3, &fp8);
  linears->CountProducts(1, fp8);
  return y;
}

std::pair<at::Tensor, at::Tensor> RowwiseBackward(Fp8Linears* linears, const Fp8Layer& layer,
                                                  const at::Tensor& g2, const at::Tensor& x2,
                                                  const at::Tensor& w) {
  linears->ReportRowwiseAmax(layer.group + ".grad", g2.detach().abs().max());
  bool fp8_x = false, fp8_w = false;
  // dX [M, K] = dY [M, N] x (W^T [K, N])^T: dY per row, W^T per row (W per column).
  at::Tensor wt = w.t().contiguous();
  at::Tensor gx = RowwiseProduct(linears, g2, 1, Fp8Format::kE5M2, wt, 1, Fp8Format::kE4M3, &fp8_x);
  // dW [N, K] = dY^T [N, M] x (X^T [K, M])^T: both along M.
  at::Tensor gw = RowwiseProduct(linears, g2.t().contiguous(), 1, Fp8Format::kE5M2,
                                 x2.t().contiguous(), 1, Fp8Format::kE4M3, &fp8_w);
  linears->CountProducts(2, fp8_x + fp8_w);
  return {gx, gw};
}

}  // namespace internal

}  // namespace tally::precision
