#include "worker/precision/grouped.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "worker/precision/converter.h"

namespace tally::precision {
namespace {

using Context = Fp8Context;
using internal::Account;
using internal::ForceOverflows;
using internal::QuantizeScaledLater;
using internal::ReportAmax;
using internal::TensorwiseBackward;
using internal::WeightE4M3;

// The grouped product of per-expert FP8 operands: x8 [R, I] E4M3 with a
// dequantising scale per row (sa_R), w8 [E, O, I] E4M3 with one per output
// row of each expert (sb_EO); group e is rows [ends[e - 1], ends[e]). CUDA:
// one at::_scaled_grouped_mm with FP32 accumulation and BF16 output; CPU
// (tests): the same arithmetic per group in FP32.
at::Tensor ScaledGroupedMm(const at::Tensor& x8, const at::Tensor& sa_R, const at::Tensor& w8,
                           const at::Tensor& sb_EO, const std::vector<int64_t>& ends) {
  if (x8.size(0) == 0) {  // no rows at all: nothing to hand the kernel
    return at::zeros({0, w8.size(1)},
                     x8.options().dtype(x8.is_cuda() ? at::kBFloat16 : at::kFloat));
  }
  if (x8.is_cuda()) {
    std::vector<int32_t> ends32(ends.begin(), ends.end());
    at::Tensor offs = at::tensor(ends32, at::kInt).to(x8.device());
    // The second operand column-major per group: w8 is [E, O, I] row-major,
    // so its transpose [E, I, O] is.
    return at::_scaled_grouped_mm(x8, w8.transpose(1, 2), sa_R, sb_EO, offs, {}, {},
                                  at::kBFloat16);
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
  return y;
}

// The same product expert by expert with per-tensor _scaled_mm (CUDA): what
// the grouped one must match, and where it falls back.
at::Tensor PerExpertScaledMm(const at::Tensor& x8, const std::vector<double>& sx,
                             const at::Tensor& w8, const std::vector<double>& sw,
                             const std::vector<int64_t>& ends) {
  at::Tensor y = at::zeros({x8.size(0), w8.size(1)}, x8.options().dtype(at::kBFloat16));
  auto inv = [&](double s) { return at::tensor(1.0 / s, x8.options().dtype(at::kFloat)); };
  int64_t start = 0;
  for (size_t e = 0; e < ends.size(); ++e) {
    const int64_t n = ends[e] - start;
    if (n > 0 && sx[e] > 0) {
      y.narrow(0, start, n)
          .copy_(at::_scaled_mm(x8.narrow(0, start, n), w8[e].t(), inv(sx[e]), inv(sw[e]), {}, {},
                                at::kBFloat16));
    }
    start = ends[e];
  }
  return y;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

// Every expert's product for one weight: forward grouped, backward expert by
// expert. contexts[e] is expert e's (its site's scaling state).
class Fp8GroupedFunction : public torch::autograd::Function<Fp8GroupedFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_RI,
                            const at::Tensor& w_EOI, int64_t linears,
                            std::vector<int64_t> contexts, std::vector<int64_t> counts,
                            std::vector<int64_t> ends) {
    auto* self = reinterpret_cast<Fp8Linears*>(linears);
    const int64_t E = w_EOI.size(0), R = x_RI.size(0), O = w_EOI.size(1), I = w_EOI.size(2);
    auto* first = reinterpret_cast<Context*>(contexts[0]);
    const bool record = *first->training;
    Fp8Stats scratch;
    Fp8Stats* stats = record ? first->stats : &scratch;
    // FP8 bytes (0 is +0 in E4M3: padding and idle experts stay zero).
    at::Tensor x8 = at::zeros({R, I}, x_RI.options().dtype(at::kByte));
    at::Tensor w8 = at::zeros({E, O, I}, w_EOI.options().dtype(at::kByte));
    std::vector<float> sa(R, 1.0f), sb(E, 1.0f);
    std::vector<double> sx(E, 0.0), sw(E, 0.0);
    int64_t start = 0;
    for (int64_t e = 0; e < E; ++e) {
      const int64_t n = counts[e];
      if (n > 0) {
        auto* c = reinterpret_cast<Context*>(contexts[e]);
        at::Tensor x_e = x_RI.narrow(0, start, n);
        QuantStats qx, qw;
        sx[e] = c->layer->x.ScaleFor(x_e, record);
        if (record && c->config->test_overflow_fraction > 0) {
          x_e = ForceOverflows(x_e, sx[e], c->config->test_overflow_fraction);
        }
        w8[e].copy_(WeightE4M3(w_EOI[e], &c->layer->w, record, &sw[e], &qw).view(at::kByte));
        if (record) {
          ReportAmax(stats, c->layer->group + ".input", c->layer->x);
          ReportAmax(stats, c->layer->group + ".weight", c->layer->w);
        }
        x8.narrow(0, start, n)
            .copy_(QuantizeScaledLater(x_e, sx[e], Fp8Format::kE4M3, &qx)
                       .to(at::kFloat8_e4m3fn)
                       .view(at::kByte));
        Account(stats, qx);
        Account(stats, qw);
        ++stats->total_products;
        ++stats->fp8_products;
        ++stats->grouped_products;
        std::fill(sa.begin() + start, sa.begin() + start + n, static_cast<float>(1.0 / sx[e]));
        sb[e] = static_cast<float>(1.0 / sw[e]);
      }
      start = ends[e];
    }
    x8 = x8.view(at::kFloat8_e4m3fn);
    w8 = w8.view(at::kFloat8_e4m3fn);
    const auto f32 = x_RI.options().dtype(at::kFloat);
    at::Tensor sa_R = at::tensor(sa, at::kFloat).to(f32.device());
    at::Tensor sb_EO = at::tensor(sb, at::kFloat).to(f32.device()).unsqueeze(1).expand({E, O})
                           .contiguous();
    at::Tensor y;
    if (!x_RI.is_cuda()) {
      y = ScaledGroupedMm(x8, sa_R, w8, sb_EO, ends);
    } else {
      try {
        y = ScaledGroupedMm(x8, sa_R, w8, sb_EO, ends);
      } catch (const c10::Error& err) {
        self->TurnGroupedOff("at::_scaled_grouped_mm refused: " +
                             FirstLine(err.what_without_backtrace()));
      }
      if (y.defined() && R > 0 && self->FirstGroupedProduct()) {
        at::Tensor ref = PerExpertScaledMm(x8, sx, w8, sw, ends).to(at::kFloat);
        const double diff = (y.to(at::kFloat) - ref).abs().max().item<double>();
        const double top = ref.abs().max().item<double>();
        if (!(diff <= 1e-2 * std::max(top, 1e-6))) {
          self->TurnGroupedOff(absl::StrCat(
              "its first product differed from the per-expert _scaled_mm by ", diff,
              " (largest value ", top, ")"));
          y = at::Tensor();
        }
      }
      if (!y.defined()) y = PerExpertScaledMm(x8, sx, w8, sw, ends);
    }
    ctx->save_for_backward({x_RI, w_EOI});
    ctx->saved_data["contexts"] = contexts;
    ctx->saved_data["counts"] = counts;
    ctx->saved_data["ends"] = ends;
    ctx->saved_data["sx"] = sx;
    ctx->saved_data["sw"] = sw;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x_RI = saved[0];
    const at::Tensor& w_EOI = saved[1];
    const std::vector<int64_t> contexts = ctx->saved_data["contexts"].toIntVector();
    const std::vector<int64_t> counts = ctx->saved_data["counts"].toIntVector();
    const std::vector<int64_t> ends = ctx->saved_data["ends"].toIntVector();
    const std::vector<double> sx = ctx->saved_data["sx"].toDoubleVector();
    const std::vector<double> sw = ctx->saved_data["sw"].toDoubleVector();
    const at::Tensor& g_RO = grads[0];
    at::Tensor gx = at::zeros(x_RI.sizes(), g_RO.options());
    at::Tensor gw = at::zeros_like(w_EOI);
    int64_t start = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      if (counts[e] > 0) {
        // On CUDA the whole group, padding included: zero rows change no
        // product and keep the row count a multiple of 16 for _scaled_mm.
        const int64_t n = x_RI.is_cuda() ? ends[e] - start : counts[e];
        auto [gx_e, gw_e] = TensorwiseBackward(reinterpret_cast<Context*>(contexts[e]),
                                               g_RO.narrow(0, start, n),
                                               x_RI.narrow(0, start, n), w_EOI[e], sx[e], sw[e]);
        gx.narrow(0, start, n).copy_(gx_e);
        gw[e].copy_(gw_e);
      }
      start = ends[e];
    }
    return {gx, gw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor Fp8GroupedLinear(const at::Tensor& x_RI, const at::Tensor& w_EOI, Fp8Linears* linears,
                            const std::vector<Fp8Context*>& contexts,
                            const std::vector<int64_t>& counts, const std::vector<int64_t>& ends) {
  std::vector<int64_t> addresses;
  for (Fp8Context* context : contexts) addresses.push_back(reinterpret_cast<int64_t>(context));
  return Fp8GroupedFunction::apply(x_RI, w_EOI, reinterpret_cast<int64_t>(linears), addresses,
                                   counts, ends);
}

}  // namespace tally::precision
