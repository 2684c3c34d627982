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
// Every cast is one pass of kernels/rowwise_cast.h (each row's or column's
// amax, its scale, the cast, the counts and the tensor's amax; the column
// form writes the transposed operand, so nothing is transposed first): the
// CUDA kernel on a GPU, its reference on the CPU, bit for bit.
#include <string>
#include <utility>

#if defined(TALLY_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include "kernels/rowwise_cast.h"
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
                         const std::string& group, bool columns) {
  TORCH_CHECK(a.dim() == 2, "row-wise FP8 cast: a must be 2-D, got ", a.dim(), "-D");
  const at::Tensor x = a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kFloat
                           ? a.contiguous()
                           : a.to(at::kFloat).contiguous();
  const int64_t R = columns ? x.size(1) : x.size(0), C = columns ? x.size(0) : x.size(1);
  const auto f32 = x.options().dtype(at::kFloat);
  RowwiseImage image;
  image.data = at::empty({R, C}, x.options().dtype(at::kByte));
  image.scale = at::empty({R, 1}, f32);
  image.inv_scale = at::empty({R, 1}, f32);
  const at::Tensor amax = group.empty() ? at::Tensor() : at::zeros({1}, f32);
  const at::Tensor counts = at::zeros({2}, x.options().dtype(at::kLong));
  kernels::RowwiseCastArgs args;
  args.x = x.data_ptr();
  args.source = x.scalar_type() == at::kBFloat16 ? kernels::SourceKind::kBFloat16
                                                 : kernels::SourceKind::kFloat32;
  args.rows = x.size(0);
  args.cols = x.size(1);
  args.axis = columns ? kernels::RowwiseAxis::kColumns : kernels::RowwiseAxis::kRows;
  args.format = format == Fp8Format::kE4M3 ? kernels::Fp8Kind::kE4M3 : kernels::Fp8Kind::kE5M2;
  args.margin = linears->config().margin;
  args.out = image.data.data_ptr<uint8_t>();
  args.scale = image.scale.data_ptr<float>();
  args.inv_scale = image.inv_scale.data_ptr<float>();
  args.amax = amax.defined() ? amax.data_ptr<float>() : nullptr;
  args.counts = static_cast<uint64_t*>(counts.data_ptr());
  if (x.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
    const std::string err =
        kernels::RowwiseCastCuda(args, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err.empty(), "row-wise FP8 cast: ", err);
#else
    TORCH_CHECK(false, "row-wise FP8 cast: this build has no CUDA");
#endif
  } else {
    kernels::RowwiseCastReference(args);
  }
  image.data = image.data.view(Fp8Dtype(format));
  QuantStats q;
  q.elements = x.numel();
  q.pending = counts;
  linears->AddRowwise(q);
  if (amax.defined()) linears->ReportRowwiseAmax(group, amax);
  return image;
}

at::Tensor RowwiseForward(Fp8Linears* linears, const Fp8Layer& layer, const at::Tensor& x2,
                          const at::Tensor& w, RowwiseImage* x_cols) {
  const RowwiseWeight& wi = linears->RowwiseWeightImage(layer, w);
  const RowwiseImage xi =
      RowwiseCast(linears, x2, Fp8Format::kE4M3, layer.group + ".input", /*columns=*/false);
  // The weight gradient's operand, x^T [K, M] per row (x per column): cast
  // now, so the backward needs no copy of x (the same amax as x's, not
  // reported twice).
  *x_cols = RowwiseCast(linears, x2, Fp8Format::kE4M3, "", /*columns=*/true);
  linears->CountProducts(1, 1);
  return RowwiseProduct(xi, wi.rows, /*fast_accum=*/true);
}

std::pair<at::Tensor, at::Tensor> RowwiseBackward(Fp8Linears* linears, const Fp8Layer& layer,
                                                  const at::Tensor& g2, const RowwiseImage& x_cols,
                                                  const at::Tensor& w) {
  const RowwiseWeight& wi = linears->RowwiseWeightImage(layer, w);
  // dX [M, K] = dY [M, N] x (W^T [K, N])^T: dY per row, W^T per row (W per column).
  const RowwiseImage gi =
      RowwiseCast(linears, g2, Fp8Format::kE5M2, layer.group + ".grad", /*columns=*/false);
  const at::Tensor gx = RowwiseProduct(gi, wi.cols, /*fast_accum=*/false);
  // dW [N, K] = dY^T [N, M] x (X^T [K, M])^T: both along M.
  const RowwiseImage gti = RowwiseCast(linears, g2, Fp8Format::kE5M2, "", /*columns=*/true);
  const at::Tensor gw = RowwiseProduct(gti, x_cols, /*fast_accum=*/false);
  linears->CountProducts(2, 2);
  return {gx, gw};
}

}  // namespace internal

}  // namespace tally::precision
