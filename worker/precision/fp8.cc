#include "worker/precision/fp8.h"

#include <torch/csrc/autograd/custom_function.h>
#if defined(TALLY_WITH_CUDA) && defined(TALLY_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/fp8_cast.h"
#define TALLY_FUSED_FP8_CAST 1
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>

#include "absl/strings/str_cat.h"

namespace tally::precision {

double Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.0 : 57344.0; }

at::ScalarType Fp8Dtype(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

namespace {

std::atomic<int64_t> host_reads{0};

// The values of a small device tensor, as doubles on the host: one read.
std::vector<double> ReadHost(const at::Tensor& t) {
  ++host_reads;
  at::Tensor h = t.to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
}

// Leaves one quantization's counts on the device, in stats->pending.
void CountLater(QuantStats* stats, const at::Tensor& overflows, const at::Tensor& underflows,
                int64_t elements) {
  at::Tensor c = at::stack({overflows.sum(), underflows.sum()}).to(at::kLong);
  stats->pending = stats->pending.defined() ? stats->pending + c : c;
  stats->elements += elements;
}

void ResolveCounts(QuantStats* stats) {
  if (stats == nullptr || !stats->pending.defined()) return;
  const std::vector<double> c = ReadHost(stats->pending);
  stats->overflows += static_cast<int64_t>(c[0]);
  stats->underflows += static_cast<int64_t>(c[1]);
  stats->pending = at::Tensor();
}

// QuantizeScaled with the counts left on the device.
at::Tensor QuantizeScaledLater(const at::Tensor& x, double scale, Fp8Format f,
                               QuantStats* stats) {
  const double max = Fp8Max(f);
  at::Tensor scaled = x.to(at::kFloat) * scale;
  at::Tensor q = scaled.clamp(-max, max).to(Fp8Dtype(f)).to(at::kFloat);
  if (stats != nullptr) {
    // A value scaled exactly to the limit can land an ulp past it: not an
    // overflow.
    CountLater(stats, scaled.abs().gt(max * (1 + 1e-6)), x.ne(0).logical_and(q.eq(0)),
               x.numel());
  }
  return q;
}

at::Tensor QuantizeDequantizeLater(const at::Tensor& x, double scale, Fp8Format f,
                                   QuantStats* stats) {
  return QuantizeScaledLater(x, scale, f, stats) / scale;
}

at::Tensor QuantizeDequantizeAlongLater(const at::Tensor& x, int64_t dim, Fp8Format f, int margin,
                                        QuantStats* stats, at::Tensor* scales_out) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor amax = xf.abs().amax({dim}, /*keepdim=*/true);
  at::Tensor scales =
      at::where(amax.gt(0).logical_and(at::isfinite(amax)),
                Fp8Max(f) / amax / std::pow(2.0, margin), at::ones_like(amax));
  at::Tensor scaled = xf * scales;
  const double max = Fp8Max(f);
  at::Tensor q = scaled.clamp(-max, max).to(Fp8Dtype(f)).to(at::kFloat);
  if (stats != nullptr) {
    CountLater(stats, scaled.abs().gt(max * (1 + 1e-6)), xf.ne(0).logical_and(q.eq(0)),
               x.numel());
  }
  if (scales_out != nullptr) *scales_out = scales;
  return q / scales;
}

// The public functions count at once.
at::Tensor Counted(at::Tensor q, QuantStats* stats) {
  ResolveCounts(stats);
  return q;
}

}  // namespace

int64_t Fp8HostReads() { return host_reads.load(); }

at::Tensor QuantizeScaled(const at::Tensor& x, double scale, Fp8Format f, QuantStats* stats) {
  return Counted(QuantizeScaledLater(x, scale, f, stats), stats);
}

at::Tensor QuantizeDequantize(const at::Tensor& x, double scale, Fp8Format f,
                              QuantStats* stats) {
  return Counted(QuantizeDequantizeLater(x, scale, f, stats), stats);
}

at::Tensor QuantizeDequantizeAlong(const at::Tensor& x, int64_t dim, Fp8Format f, int margin,
                                   QuantStats* stats, at::Tensor* scales_out) {
  return Counted(QuantizeDequantizeAlongLater(x, dim, f, margin, stats, scales_out), stats);
}

double ScaleForAmax(double amax, Fp8Format f, int margin, double previous) {
  if (!(amax > 0) || !std::isfinite(amax)) return previous;
  const double s = Fp8Max(f) / amax / std::pow(2.0, margin);
  return std::isfinite(s) ? s : previous;
}

TensorScaling::TensorScaling(Fp8Format format, const RecipeConfig& config)
    : format_(format), config_(config) {}

double TensorScaling::ScaleFor(const at::Tensor& x, bool record) {
  if (ScaleKnownAhead()) {  // nothing needs the amax now
    if (record) RecordAmax(x.detach().abs().max());
    return scale_;
  }
  const double amax = ReadHost(x.detach().abs().max())[0];
  if (record) {
    last_amax_ = amax;
    if (std::isfinite(amax)) step_amax_ = std::max(step_amax_, amax);
  }
  if (config_.recipe == Recipe::kCurrent || history_.empty()) {
    return ScaleForAmax(amax, format_, config_.margin, scale_);
  }
  return scale_;
}

bool TensorScaling::ScaleKnownAhead() const {
  return config_.recipe == Recipe::kDelayed && !history_.empty();
}

void TensorScaling::RecordAmax(const at::Tensor& amax) {
  at::Tensor a = amax.detach().reshape({}).to(at::kDouble);
  pending_last_ = a;
  at::Tensor finite = at::where(at::isfinite(a), a, at::zeros_like(a));
  pending_step_ = pending_step_.defined() ? at::maximum(pending_step_, finite) : finite;
}

void TensorScaling::Resolve(double last, double step) {
  last_amax_ = last;
  step_amax_ = std::max(step_amax_, step);
  pending_last_ = at::Tensor();
  pending_step_ = at::Tensor();
}

void TensorScaling::Step() {
  if (pending_last_.defined()) {  // Fp8Linears reads them all at once first
    const std::vector<double> v = ReadHost(at::stack({pending_last_, pending_step_}));
    Resolve(v[0], v[1]);
  }
  ++steps_;
  if (config_.recipe == Recipe::kCurrent) {
    step_amax_ = 0;
    return;
  }
  // A tensor that has never seen a value (a declared layer not yet called)
  // starts its history when it first does, as an undeclared one would.
  if (history_.empty() && step_amax_ == 0) return;
  history_.push_back(step_amax_);
  if (static_cast<int>(history_.size()) > config_.history_len) history_.erase(history_.begin());
  const double amax = config_.history_max
                          ? *std::max_element(history_.begin(), history_.end())
                          : history_.back();
  scale_ = ScaleForAmax(amax, format_, config_.margin, scale_);
  step_amax_ = 0;
}

at::Tensor TensorScaling::State() const {
  std::vector<double> v(config_.history_len + 3, 0.0);
  // Oldest first, right-aligned, with the count so a short history is exact.
  for (size_t i = 0; i < history_.size(); ++i) v[i] = history_[i];
  v[config_.history_len] = scale_;
  v[config_.history_len + 1] = static_cast<double>(history_.size());
  v[config_.history_len + 2] = static_cast<double>(steps_);
  return at::tensor(v, at::kDouble);
}

bool TensorScaling::LoadState(const at::Tensor& state) {
  if (state.numel() != config_.history_len + 3 || state.scalar_type() != at::kDouble) {
    return false;
  }
  const double* v = state.data_ptr<double>();
  const int n = static_cast<int>(v[config_.history_len + 1]);
  if (n < 0 || n > config_.history_len) return false;
  history_.assign(v, v + n);
  scale_ = v[config_.history_len];
  steps_ = static_cast<int64_t>(v[config_.history_len + 2]);
  step_amax_ = 0;
  pending_last_ = at::Tensor();
  pending_step_ = at::Tensor();
  return true;
}

struct Fp8Linears::Layer {
  Layer(const std::string& site, const RecipeConfig& c)
      : group(site.find(".w1") != std::string::npos || site.find(".w2") != std::string::npos ||
                      site.find(".w3") != std::string::npos
                  ? "ffn"
                  : "attention"),
        x(Fp8Format::kE4M3, c),
        w(Fp8Format::kE4M3, c),
        g(Fp8Format::kE5M2, c) {}
  std::string group;
  TensorScaling x, w, g;
};

namespace {

using Context = Fp8Linears::Context;

void Account(Fp8Stats* s, const QuantStats& q) {
  s->overflows += q.overflows;
  s->underflows += q.underflows;
  s->elements += q.elements;
  if (q.pending.defined()) {
    s->pending_counts = s->pending_counts.defined() ? s->pending_counts + q.pending : q.pending;
  }
}

// The latest amax of a tensor group for the statistics: read already, or
// still on the device.
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

// Tests only (RecipeConfig::test_overflow_fraction): a copy of x2 with every
// round(1/fraction)-th value set to 16 times the E4M3 range under `scale`,
// its sign kept, so each of them overflows and is clamped.
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

#if defined(TALLY_FUSED_FP8_CAST)
// E4M3 image of an FP32 tensor under a known scale, with its amax and the
// clamped/flushed counts, in one pass over memory (kernels/fp8_cast.h)
// instead of an amax pass, a cast and two counting passes.
at::Tensor FusedCastE4M3(const at::Tensor& x, double scale, at::Tensor* amax, QuantStats* q) {
  at::Tensor xf = x.contiguous();
  at::Tensor y = at::empty(xf.sizes(), xf.options().dtype(at::kByte));
  at::Tensor amax_dev = at::zeros({1}, xf.options());
  at::Tensor counts = at::zeros({2}, xf.options().dtype(at::kLong));
  const std::string err = kernels::CastToE4M3Cuda(
      xf.data_ptr<float>(), xf.numel(), static_cast<float>(scale), y.data_ptr<uint8_t>(),
      amax_dev.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream(),
      reinterpret_cast<uint64_t*>(counts.data_ptr<int64_t>()));
  TORCH_CHECK(err.empty(), "fused FP8 cast: ", err);
  // Both stay on the device: the step reads them with everything else.
  *amax = amax_dev;
  q->pending = q->pending.defined() ? q->pending + counts : counts;
  q->elements += x.numel();
  return y.view(at::kFloat8_e4m3fn);
}
#endif

// An E4M3 weight (FP32 master) for a CUDA product: fused when the scale is
// known ahead, else the plain cast after ScaleFor. Sets *scale.
at::Tensor WeightE4M3(const at::Tensor& w, TensorScaling* s, bool record, double* scale,
                      QuantStats* q) {
#if defined(TALLY_FUSED_FP8_CAST)
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

// Per-tensor recipes' backward of y = x w^T (x2 [M, K] scaled by sx, w
// [N, K] by sw in the forward): dX and dW from the output gradient g2
// [M, N] in E5M2, both in FP8 where the shapes allow.
std::pair<at::Tensor, at::Tensor> TensorwiseBackward(Context* c, const at::Tensor& g2,
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

Fp8Linears::Fp8Linears(RecipeConfig config) : config_(config) {}
Fp8Linears::~Fp8Linears() = default;

Fp8Linears::Layer& Fp8Linears::LayerFor(const std::string& site) {
  auto& slot = layers_[site];
  if (!slot) slot = std::make_unique<Layer>(site, config_);
  return *slot;
}

at::Tensor Fp8Linears::Linear(const at::Tensor& x, const at::Tensor& w,
                              const std::string& site) {
  // The context outlives the autograd graph: it lives in the layer map.
  Layer& layer = LayerFor(site);
  auto& context = contexts_[site];
  context = {&layer, &stats_, &training_, &config_};
  return Fp8LinearFunction::apply(x, w, reinterpret_cast<int64_t>(&context));
}

bool Fp8Linears::Groups(const at::Tensor& x, int64_t out, int64_t in) const {
  if (!config_.grouped_experts || config_.recipe == Recipe::kRowwise || !grouped_off_.empty()) {
    return false;
  }
  return x.is_cuda() ? out % 16 == 0 && in % 16 == 0 : config_.grouped_on_cpu;
}

at::Tensor Fp8Linears::GroupedLinear(const at::Tensor& x_RI, const std::vector<int64_t>& counts,
                                     const std::vector<int64_t>& ends, const at::Tensor& w_EOI,
                                     const std::vector<std::string>& sites) {
  TORCH_CHECK(counts.size() == sites.size() && ends.size() == sites.size() &&
                  static_cast<int64_t>(sites.size()) == w_EOI.size(0),
              "GroupedLinear: ", sites.size(), " sites for ", w_EOI.size(0), " experts");
  std::vector<int64_t> contexts;
  for (const std::string& site : sites) {
    Layer& layer = LayerFor(site);
    auto& context = contexts_[site];
    context = {&layer, &stats_, &training_, &config_};
    contexts.push_back(reinterpret_cast<int64_t>(&context));
  }
  return Fp8GroupedFunction::apply(x_RI, w_EOI, reinterpret_cast<int64_t>(this), contexts,
                                   counts, ends);
}

void Fp8Linears::TurnGroupedOff(std::string why) {
  if (!grouped_off_.empty()) return;
  grouped_off_ = std::move(why);
  std::cerr << "tally: FP8 grouped expert products are off for this run: " << grouped_off_
            << "; the experts run one by one\n";
}

void Fp8Linears::ResolvePending() {
  std::vector<TensorScaling*> which;
  std::vector<at::Tensor> parts;
  for (auto& [site, layer] : layers_) {
    for (TensorScaling* t : {&layer->x, &layer->w, &layer->g}) {
      if (!t->pending_last().defined()) continue;
      which.push_back(t);
      parts.push_back(t->pending_last());
      parts.push_back(t->pending_step());
    }
  }
  if (parts.empty()) return;
  const std::vector<double> v = ReadHost(at::stack(parts));
  for (size_t i = 0; i < which.size(); ++i) which[i]->Resolve(v[2 * i], v[2 * i + 1]);
}

void Fp8Linears::OnOptimizerStep() {
  ResolvePending();
  for (auto& [site, layer] : layers_) {
    layer->x.Step();
    layer->w.Step();
    layer->g.Step();
  }
}

Fp8Stats Fp8Linears::TakeStats() {
  Fp8Stats out = std::move(stats_);
  stats_ = Fp8Stats{};
  // Everything the step left on the device, in one read.
  std::vector<at::Tensor> parts;
  if (out.pending_counts.defined()) parts.push_back(out.pending_counts.to(at::kDouble));
  for (const auto& [group, amax] : out.pending_amax) parts.push_back(amax.reshape({1}));
  if (!parts.empty()) {
    const std::vector<double> v = ReadHost(at::cat(parts));
    size_t i = 0;
    if (out.pending_counts.defined()) {
      out.overflows += static_cast<int64_t>(v[i++]);
      out.underflows += static_cast<int64_t>(v[i++]);
    }
    for (const auto& [group, amax] : out.pending_amax) out.amax[group] = v[i++];
  }
  out.pending_counts = at::Tensor();
  out.pending_amax.clear();
  return out;
}

void Fp8Linears::Declare(const std::vector<std::string>& sites) {
  for (const auto& site : sites) LayerFor(site);
}

std::vector<double> Fp8Linears::StepAmax() {
  ResolvePending();
  std::vector<double> out;
  for (const auto& [site, layer] : layers_) {
    out.push_back(layer->x.step_amax());
    out.push_back(layer->w.step_amax());
    out.push_back(layer->g.step_amax());
  }
  return out;
}

void Fp8Linears::SetStepAmax(const std::vector<double>& amax) {
  size_t i = 0;
  for (auto& [site, layer] : layers_) {
    if (i + 3 > amax.size()) return;
    layer->x.set_step_amax(amax[i++]);
    layer->w.set_step_amax(amax[i++]);
    layer->g.set_step_amax(amax[i++]);
  }
}

std::vector<std::pair<std::string, at::Tensor>> Fp8Linears::State() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  if (config_.recipe == Recipe::kRowwise) return out;  // nothing carries over
  for (const auto& [site, layer] : layers_) {
    out.emplace_back("fp8." + site + ".input", layer->x.State());
    out.emplace_back("fp8." + site + ".weight", layer->w.State());
    out.emplace_back("fp8." + site + ".grad", layer->g.State());
  }
  return out;
}

bool Fp8Linears::LoadState(const std::map<std::string, at::Tensor>& tensors,
                           std::string* missing) {
  for (const auto& [name, t] : tensors) {
    if (name.rfind("fp8.", 0) != 0) continue;
    const size_t dot = name.rfind('.');
    const std::string site = name.substr(4, dot - 4), which = name.substr(dot + 1);
    Layer& layer = LayerFor(site);
    TensorScaling* s = which == "input" ? &layer.x : which == "weight" ? &layer.w : &layer.g;
    if (!s->LoadState(t)) {
      *missing = name;
      return false;
    }
  }
  return true;
}

}  // namespace tally::precision
