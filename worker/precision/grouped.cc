#include "worker/precision/grouped.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/precision/converter.h"

namespace tally::precision {
namespace {

// The grouped product of per-expert FP8 operands: x8 [R, I] E4M3 with a
// dequantising scale per row (sa_R), w8 [E, O, I] E4M3 with one per output
// row of each expert (sb_EO); group e is rows [ends[e - 1], ends[e]). CUDA:
// one at::_scaled_grouped_mm with FP32 accumulation and BF16 output; CPU
// (tests): the same arithmetic per group in FP32.
at::Tensor ScaledGroupedMm(const at::Tensor& x8, const at::Tensor& sa_R, const at::Tensor& w8,
                           const at::Tensor& sb_EO, const std::vector<int64_t>& ends,
                           bool bf16_outputs) {
  if (x8.size(0) == 0) {  // no rows at all: nothing to hand the kernel
    return at::zeros({0, w8.size(1)},
                     x8.options().dtype(x8.is_cuda() ? at::kBFloat16 : at::kFloat));
  }
  if (x8.is_cuda()) {
    // Group ends from the host: they are the host's already (the MoE layer
    // computed them), and a non-blocking copy from pinned memory does not
    // wait for the device.
    std::vector<int32_t> ends32(ends.begin(), ends.end());
    at::Tensor offs = at::tensor(ends32, at::kInt).pin_memory().to(x8.device(), true);
    // The second operand column-major per group: w8 is [E, O, I] row-major,
    // so its transpose [E, I, O] is.
    // A forward product: fast accumulation, as the dense forward (linear.cc).
    return at::_scaled_grouped_mm(x8, w8.transpose(1, 2), sa_R, sb_EO, offs, {}, {},
                                  at::kBFloat16, /*use_fast_accum=*/true);
  }
  at::Tensor y = at::zeros({x8.size(0), w8.size(1)}, x8.options().dtype(at::kFloat));
  int64_t start = 0;
  for (size_t e = 0; e < ends.size(); ++e) {
    const int64_t n = ends[e] - start;
    if (n > 0) {
      at::Tensor a = x8.narrow(0, start, n).to(at::kFloat) * sa_R.narrow(0, start, n).unsqueeze(1);
      at::Tensor b = w8[e].to(at::kFloat) * sb_EO[e].unsqueeze(1);
      y.narrow(0, start, n).copy_(a.matmul(b.t()));
    }
    start = ends[e];
  }
  return bf16_outputs ? y.to(at::kBFloat16).to(at::kFloat) : y;
}

// The same product expert by expert with per-tensor _scaled_mm (CUDA): what
// the grouped one must match, and where it falls back.
at::Tensor PerExpertScaledMm(const std::vector<Fp8Image>& x, const std::vector<Fp8Image>& w,
                             const std::vector<int64_t>& ends, int64_t R, int64_t O,
                             const at::TensorOptions& options) {
  at::Tensor y = at::zeros({R, O}, options.dtype(at::kBFloat16));
  int64_t start = 0;
  for (size_t e = 0; e < ends.size(); ++e) {
    if (x[e].data.defined()) {
      y.narrow(0, start, x[e].data.size(0)).copy_(internal::ForwardProduct(x[e], w[e]));
    }
    start = ends[e];
  }
  return y;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

c10::List<at::Tensor> ListOf(const std::vector<at::Tensor>& v) {
  c10::List<at::Tensor> l;
  for (const at::Tensor& t : v) l.push_back(t.defined() ? t : at::empty({0}));
  return l;
}

// Every expert's product for one weight: forward grouped, backward expert by
// expert. layers[e] is expert e's.
class Fp8GroupedFunction : public torch::autograd::Function<Fp8GroupedFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_RI,
                            const at::Tensor& w_EOI, int64_t linears,
                            std::vector<int64_t> layers, std::vector<int64_t> counts,
                            std::vector<int64_t> ends) {
    auto* self = reinterpret_cast<Fp8Linears*>(linears);
    const int64_t E = w_EOI.size(0), R = x_RI.size(0), O = w_EOI.size(1), I = w_EOI.size(2);
    const bool cuda = x_RI.is_cuda();
    // FP8 bytes (0 is +0 in E4M3: padding and idle experts stay zero).
    at::Tensor x8 = at::zeros({R, I}, x_RI.options().dtype(at::kByte));
    at::Tensor w8 = at::zeros({E, O, I}, w_EOI.options().dtype(at::kByte));
    const auto f32 = x_RI.options().dtype(at::kFloat);
    std::vector<at::Tensor> sa_parts, sb_parts;
    std::vector<Fp8Image> xs(E), ws(E);
    int64_t start = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows = ends[e] - start;
      if (counts[e] > 0) {
        const auto* layer = reinterpret_cast<const Fp8Layer*>(layers[e]);
        // CUDA casts the whole padded group (its backward needs rows in
        // multiples of 16); the CPU the real rows.
        const int64_t n = cuda ? rows : counts[e];
        xs[e] = self->InputImage(*layer, x_RI.narrow(0, start, n), layer->input_read_again);
        ws[e] = self->WeightImage(*layer, w_EOI[e]);
        x8.narrow(0, start, n).copy_(xs[e].data.view(at::kByte));
        w8[e].copy_(ws[e].data.view(at::kByte));
        self->CountProducts(1, 1, 1);
        sa_parts.push_back(xs[e].scale.inv_scale.expand({rows}));
        sb_parts.push_back(ws[e].scale.inv_scale);
      } else {
        sa_parts.push_back(at::ones({rows}, f32));
        sb_parts.push_back(at::ones({1}, f32));
      }
      start = ends[e];
    }
    x8 = x8.view(at::kFloat8_e4m3fn);
    w8 = w8.view(at::kFloat8_e4m3fn);
    const at::Tensor sa_R = at::cat(sa_parts);
    const at::Tensor sb_EO = at::cat(sb_parts).unsqueeze(1).expand({E, O}).contiguous();
    at::Tensor y;
    if (!cuda) {
      y = ScaledGroupedMm(x8, sa_R, w8, sb_EO, ends,
                          self->config().emulate_bf16_intermediates);
    } else {
      try {
        y = ScaledGroupedMm(x8, sa_R, w8, sb_EO, ends, false);
      } catch (const c10::Error& err) {
        self->TurnGroupedOff("at::_scaled_grouped_mm refused: " +
                             FirstLine(err.what_without_backtrace()));
      }
      if (y.defined() && R > 0 && self->FirstGroupedProduct()) {
        // Once per run (one read): the grouped product against the
        // per-expert ones.
        at::Tensor ref = PerExpertScaledMm(xs, ws, ends, R, O, x_RI.options()).to(at::kFloat);
        const std::vector<double> read = internal::ReadHost(
            at::stack({(y.to(at::kFloat) - ref).abs().max(), ref.abs().max()}));
        const double diff = read[0], top = read[1];
        if (!(diff <= 1e-2 * std::max(top, 1e-6))) {
          self->TurnGroupedOff(absl::StrCat(
              "its first product differed from the per-expert _scaled_mm by ", diff,
              " (largest value ", top, ")"));
          y = at::Tensor();
        }
      }
      if (!y.defined()) y = PerExpertScaledMm(xs, ws, ends, R, O, x_RI.options());
    }
    // Kept for the backward, per expert: x's FP8 bytes and scale (CUDA the
    // transpose and the inverse scale; CPU the row-major bytes, dequantized
    // again there), and the step's weight image (CUDA its transposed bytes,
    // CPU the FP32 values the weight cache holds anyway).
    std::vector<at::Tensor> x_bytes, x_scale, w_t, w_deq, w_inv;
    for (int64_t e = 0; e < E; ++e) {
      x_bytes.push_back(cuda ? xs[e].data_t : xs[e].data);
      x_scale.push_back(cuda ? xs[e].scale.inv_scale : xs[e].scale.scale);
      w_t.push_back(ws[e].data_t);
      w_deq.push_back(ws[e].dequantized);
      w_inv.push_back(ws[e].scale.inv_scale);
    }
    ctx->saved_data["x_bytes"] = ListOf(x_bytes);
    ctx->saved_data["x_scale"] = ListOf(x_scale);
    ctx->saved_data["w_t"] = ListOf(w_t);
    ctx->saved_data["w_deq"] = ListOf(w_deq);
    ctx->saved_data["w_inv"] = ListOf(w_inv);
    ctx->saved_data["linears"] = linears;
    ctx->saved_data["layers"] = layers;
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["ends"] = ends;
    ctx->saved_data["x_shape"] = x_RI.sizes().vec();
    ctx->saved_data["w_shape"] = w_EOI.sizes().vec();
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w_EOI.scalar_type());
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* self = reinterpret_cast<Fp8Linears*>(ctx->saved_data["linears"].toInt());
    const std::vector<int64_t> layers = ctx->saved_data["layers"].toIntVector();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const std::vector<int64_t> ends = ctx->saved_data["ends"].toIntVector();
    const std::vector<int64_t> x_shape = ctx->saved_data["x_shape"].toIntVector();
    const std::vector<int64_t> w_shape = ctx->saved_data["w_shape"].toIntVector();
    const auto w_dtype = static_cast<at::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    auto list = [&](const char* name) { return ctx->saved_data[name].toTensorList(); };
    const auto x_bytes = list("x_bytes"), x_scale = list("x_scale");
    const auto w_t = list("w_t"), w_deq = list("w_deq"), w_inv = list("w_inv");
    const at::Tensor& g_RO = grads[0];
    at::Tensor gx = at::zeros(x_shape, g_RO.options());
    at::Tensor gw = at::zeros(w_shape, g_RO.options().dtype(w_dtype));
    const bool cuda = g_RO.is_cuda();
    int64_t start = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] > 0) {
        const auto* layer = reinterpret_cast<const Fp8Layer*>(layers[e]);
        const int64_t n = cuda ? ends[e] - start : counts[e];
        Fp8Image x, w;
        if (cuda) {
          x.data_t = x_bytes.get(e);
          x.scale.inv_scale = x_scale.get(e);
        } else {
          x.dequantized = internal::Dequantized(x_bytes.get(e), x_scale.get(e));
        }
        w.data_t = w_t.get(e);
        w.dequantized = w_deq.get(e);
        w.scale.inv_scale = w_inv.get(e);
        const Fp8Image g = self->GradImage(*layer, g_RO.narrow(0, start, n));
        self->CountProducts(2, 2);
        gx.narrow(0, start, n).copy_(internal::InputGradProduct(g, w));
        gw[e].copy_(internal::WeightGradProduct(g, x));
      }
      start = ends[e];
    }
    return {gx, gw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor Fp8GroupedLinear(const at::Tensor& x_RI, const at::Tensor& w_EOI, Fp8Linears* linears,
                            const std::vector<const Fp8Layer*>& layers,
                            const std::vector<int64_t>& counts, const std::vector<int64_t>& ends) {
  std::vector<int64_t> addresses;
  for (const Fp8Layer* layer : layers) addresses.push_back(reinterpret_cast<int64_t>(layer));
  return Fp8GroupedFunction::apply(x_RI, w_EOI, reinterpret_cast<int64_t>(linears), addresses,
                                   counts, ends);
}

}  // namespace tally::precision
