#include "worker/precision/linear.h"

#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace tally::precision {

Fp8Layer::Fp8Layer(const std::string& site, const RecipeConfig& c)
    : group(site.find(".w1") != std::string::npos || site.find(".w2") != std::string::npos ||
                    site.find(".w3") != std::string::npos
                ? "ffn"
                : "attention"),
      x(Fp8Format::kE4M3, c),
      w(Fp8Format::kE4M3, c),
      g(Fp8Format::kE5M2, c) {}

namespace {

using internal::QuantizeScaledLater;

// a [M, K] x b [N, K]^T in FP8 on CUDA with FP32 accumulation; BF16 output.
at::Tensor ScaledMm(const at::Tensor& a, double sa, Fp8Format fa, const at::Tensor& b, double sb,
                    Fp8Format fb, QuantStats* qa, QuantStats* qb) {
  at::Tensor a8 = QuantizeScaledLater(a, sa, fa, qa).to(Fp8Dtype(fa));
  at::Tensor b8 = QuantizeScaledLater(b, sb, fb, qb).to(Fp8Dtype(fb));
  auto inv = [&](double s) { return at::tensor(1.0 / s, a.options().dtype(at::kFloat)); };
  // The second operand must be column-major: b8 is [N, K] row-major, so
  // b8.t() is [K, N] column-major.
  return at::_scaled_mm(a8, b8.t(), inv(sa), inv(sb), {}, {}, at::kBFloat16);
}

}  // namespace

namespace internal {

void Account(Fp8Stats* s, const QuantStats& q) {
  s->overflows += q.overflows;
  s->underflows += q.underflows;
  s->elements += q.elements;
  if (q.pending.defined()) {
    s->pending_counts = s->pending_counts.defined() ? s->pending_counts + q.pending : q.pending;
  }
}

void ReportAmax(Fp8Stats* s, const std::string& group, const TensorScaling& t) {
  if (t.pending_last().defined()) {
    s->pending_amax[group] = t.pending_last();
    s->amax.erase(group);
  } else {
    s->amax[group] = t.last_amax();
    s->pending_amax.erase(group);
  }
}

void ReportAmax(Fp8Stats* s, const std::string& group, const at::Tensor& amax) {
  s->pending_amax[group] = amax.detach().reshape({}).to(at::kDouble);
  s->amax.erase(group);
}

at::Tensor ForceOverflows(const at::Tensor& x2, double scale, double fraction) {
  const int64_t stride = std::max<int64_t>(1, std::llround(1.0 / fraction));
  const double beyond = 16 * Fp8Max(Fp8Format::kE4M3) / scale;
  at::Tensor flat = x2.reshape({-1}).clone();
  at::Tensor picked = flat.slice(0, 0, flat.numel(), stride);
  picked.copy_(picked.ge(0).to(picked.scalar_type()) * (2 * beyond) - beyond);
  return flat.view(x2.sizes());
}

bool ScaledMmShapeOk(int64_t m, int64_t k, int64_t n) {
  return m % 16 == 0 && k % 16 == 0 && n % 16 == 0;
}

at::Tensor WeightE4M3(const at::Tensor& w, TensorScaling* s, bool record, double* scale,
                      QuantStats* q) {
#if defined(TALLY_WITH_CUDA) && defined(TALLY_HAVE_CUDA)
  if (w.is_cuda() && w.scalar_type() == at::kFloat && s->ScaleKnownAhead()) {
    *scale = s->scale();
    at::Tensor amax;
    at::Tensor w8 = FusedCastE4M3(w.detach(), *scale, &amax, q);
    if (record) s->RecordAmax(amax);
    return w8;
  }
#endif
  *scale = s->ScaleFor(w, record);
  return QuantizeScaledLater(w, *scale, Fp8Format::kE4M3, q).to(Fp8Dtype(Fp8Format::kE4M3));
}

std::pair<at::Tensor, at::Tensor> TensorwiseBackward(Fp8Context* c, const at::Tensor& g2,
                                                     const at::Tensor& x2, const at::Tensor& w,
                                                     double sx, double sw) {
  const double sg = c->layer->g.ScaleFor(g2);
  ReportAmax(c->stats, c->layer->group + ".grad", c->layer->g);
  QuantStats qg;  // the gradient's counts (the operands' were counted forward)
  at::Tensor gx, gw;
  c->stats->total_products += 2;
  const bool cuda = g2.is_cuda();
  if (cuda && !(ScaledMmShapeOk(g2.size(0), w.size(0), w.size(1)) &&
                ScaledMmShapeOk(w.size(0), g2.size(0), x2.size(1)))) {
    gx = g2.to(at::kBFloat16).matmul(w.to(at::kBFloat16));
    gw = g2.t().to(at::kBFloat16).matmul(x2.to(at::kBFloat16));
  } else if (cuda) {
    c->stats->fp8_products += 2;
    // gx [M, K] = g [M, N] x w [N, K]; gw [N, K] = g^T [N, M] x x [M, K].
    gx = ScaledMm(g2, sg, Fp8Format::kE5M2, w.t().contiguous(), sw, Fp8Format::kE4M3, &qg,
                  nullptr);
    gw = ScaledMm(g2.t().contiguous(), sg, Fp8Format::kE5M2, x2.t().contiguous(), sx,
                  Fp8Format::kE4M3, nullptr, nullptr);
  } else {
    c->stats->fp8_products += 2;
    at::Tensor gq = QuantizeDequantizeLater(g2, sg, Fp8Format::kE5M2, &qg);
    at::Tensor xq = QuantizeDequantizeLater(x2, sx, Fp8Format::kE4M3, nullptr);
    at::Tensor wq = QuantizeDequantizeLater(w, sw, Fp8Format::kE4M3, nullptr);
    gx = gq.matmul(wq);
    gw = gq.t().matmul(xq);
  }
  Account(c->stats, qg);
  return {gx, gw};
}

}  // namespace internal

namespace {

using Context = Fp8Context;
using internal::Account;
using internal::ForceOverflows;
using internal::QuantizeDequantizeAlongLater;
using internal::QuantizeDequantizeLater;
using internal::ReportAmax;
using internal::ScaledMmShapeOk;
using internal::TensorwiseBackward;
using internal::WeightE4M3;

// Row-wise scaling. Forward: Y [M, N] = X [M, K] W [N, K]^T with a scale per
// row of X (token) and per row of W (output channel). Backward: dX = dY W
// scales dY per row and W per column (K); dW = dY^T X scales dY per column
// (N) and X per column (K). On CUDA each is one row-wise _scaled_mm.
at::Tensor RowwiseProduct(const at::Tensor& a, int64_t a_dim, Fp8Format fa, const at::Tensor& b,
                          int64_t b_dim, Fp8Format fb, int margin, Fp8Stats* stats,
                          bool* in_fp8) {
  // a [M, K] (scaled along a_dim), b [N, K] (scaled along b_dim); a x b^T.
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
  Account(stats, qa);
  Account(stats, qb);
  return y;
}

at::Tensor RowwiseForward(Context* c, Fp8Stats* stats, bool record, const at::Tensor& x2,
                          const at::Tensor& w) {
  if (record) {
    ReportAmax(stats, c->layer->group + ".input", x2.detach().abs().max());
    ReportAmax(stats, c->layer->group + ".weight", w.detach().abs().max());
  }
  bool fp8 = false;
  at::Tensor y = RowwiseProduct(x2, 1, Fp8Format::kE4M3, w, 1, Fp8Format::kE4M3,
                                c->config->margin, stats, &fp8);
  ++stats->total_products;
  stats->fp8_products += fp8;
  return y;
}

std::pair<at::Tensor, at::Tensor> RowwiseBackward(Context* c, const at::Tensor& g2,
                                                  const at::Tensor& x2, const at::Tensor& w) {
  Fp8Stats* stats = c->stats;
  ReportAmax(stats, c->layer->group + ".grad", g2.detach().abs().max());
  const int margin = c->config->margin;
  bool fp8_x = false, fp8_w = false;
  // dX [M, K] = dY [M, N] x (W^T [K, N])^T: dY per row, W^T per row (W per column).
  at::Tensor wt = w.t().contiguous();
  at::Tensor gx = RowwiseProduct(g2, 1, Fp8Format::kE5M2, wt, 1, Fp8Format::kE4M3, margin, stats,
                                 &fp8_x);
  // dW [N, K] = dY^T [N, M] x (X^T [K, M])^T: both along M.
  at::Tensor gw = RowwiseProduct(g2.t().contiguous(), 1, Fp8Format::kE5M2, x2.t().contiguous(), 1,
                                 Fp8Format::kE4M3, margin, stats, &fp8_w);
  stats->total_products += 2;
  stats->fp8_products += fp8_x + fp8_w;
  return {gx, gw};
}

class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, int64_t context) {
    auto* c = reinterpret_cast<Context*>(context);
    const bool record = *c->training;
    Fp8Stats scratch;
    Fp8Stats* stats = record ? c->stats : &scratch;
    at::Tensor x2 = x.reshape({-1, x.size(-1)});
    if (c->config->recipe == Recipe::kRowwise) {
      ctx->save_for_backward({x2, w});
      ctx->saved_data["context"] = context;
      std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
      shape.back() = w.size(0);
      return RowwiseForward(c, stats, record, x2, w).reshape(shape);
    }
    const double sx = c->layer->x.ScaleFor(x2, record);
    if (record && c->config->test_overflow_fraction > 0) {  // training passes only
      x2 = ForceOverflows(x2, sx, c->config->test_overflow_fraction);
    }
    const bool cuda_fp8 = x.is_cuda() && ScaledMmShapeOk(x2.size(0), x2.size(1), w.size(0));
    QuantStats qx, qw;
    // On CUDA the weight's cast and amax may come from one fused pass.
    at::Tensor w8;
    double sw = 0;
    if (cuda_fp8) {
      w8 = WeightE4M3(w, &c->layer->w, record, &sw, &qw);
    } else {
      sw = c->layer->w.ScaleFor(w, record);
    }
    if (record) {
      ReportAmax(stats, c->layer->group + ".input", c->layer->x);
      ReportAmax(stats, c->layer->group + ".weight", c->layer->w);
    }
    at::Tensor y;
    ++stats->total_products;
    if (x.is_cuda() && !cuda_fp8) {
      y = at::linear(x2.to(at::kBFloat16), w.to(at::kBFloat16));  // counted as not FP8
    } else {
      ++stats->fp8_products;
      if (x.is_cuda()) {
        at::Tensor x8 =
            QuantizeScaledLater(x2, sx, Fp8Format::kE4M3, &qx).to(at::kFloat8_e4m3fn);
        auto inv = [&](double s) { return at::tensor(1.0 / s, x2.options().dtype(at::kFloat)); };
        y = at::_scaled_mm(x8, w8.t(), inv(sx), inv(sw), {}, {}, at::kBFloat16);
      } else {
        y = at::matmul(QuantizeDequantizeLater(x2, sx, Fp8Format::kE4M3, &qx),
                       QuantizeDequantizeLater(w, sw, Fp8Format::kE4M3, &qw).t());
      }
    }
    Account(stats, qx);
    Account(stats, qw);
    ctx->save_for_backward({x2, w});
    ctx->saved_data["context"] = context;
    ctx->saved_data["sx"] = sx;
    ctx->saved_data["sw"] = sw;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = w.size(0);
    return y.reshape(shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* c = reinterpret_cast<Context*>(ctx->saved_data["context"].toInt());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x2 = saved[0];
    const at::Tensor& w = saved[1];
    if (c->config->recipe == Recipe::kRowwise) {
      auto [gx, gw] = RowwiseBackward(c, grads[0].reshape({-1, w.size(0)}), x2, w);
      std::vector<int64_t> shape(grads[0].sizes().begin(), grads[0].sizes().end());
      shape.back() = w.size(1);
      return {gx.reshape(shape).to(grads[0].scalar_type()), gw.to(w.scalar_type()), at::Tensor()};
    }
    const double sx = ctx->saved_data["sx"].toDouble(), sw = ctx->saved_data["sw"].toDouble();
    auto [gx, gw] = TensorwiseBackward(c, grads[0].reshape({-1, w.size(0)}), x2, w, sx, sw);
    std::vector<int64_t> shape(grads[0].sizes().begin(), grads[0].sizes().end());
    shape.back() = w.size(1);
    return {gx.reshape(shape).to(grads[0].scalar_type()), gw.to(w.scalar_type()), at::Tensor()};
  }
};

}  // namespace

at::Tensor Fp8Linear(const at::Tensor& x, const at::Tensor& w, Fp8Context* context) {
  return Fp8LinearFunction::apply(x, w, reinterpret_cast<int64_t>(context));
}

}  // namespace tally::precision
