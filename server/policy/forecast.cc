#include "server/policy/forecast.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tally::policy {
namespace {

constexpr double kMinC = 0.05;
constexpr double kMaxC = 2.0;
constexpr int kGridSize = 121;
constexpr double kHuberTuning = 1.345;
constexpr int kMaxHuberIterations = 30;

// A fitted point: x = tokens / t_ref (t_ref = the last fitted tokens keeps
// x^(-c) within [1, (t_last / t_first)^c] whatever the token scale).
struct Sample {
  double x = 0;
  double y = 0;
  double w = 1;
  int64_t step = 0;
};

struct LinearFit {
  double a = 0;
  double b = 0;
  double sse = std::numeric_limits<double>::infinity();
  // Inverse of the weighted normal matrix, for the leverage of a new point;
  // which parameters were free decides its form.
  enum class Free { kBoth, kAOnly, kBOnly } free = Free::kBoth;
  double sw = 0, sx = 0, sxx = 0, det = 0;
};

struct Fit {
  double c = 1;
  LinearFit lin;
};

double InvPow(double x, double c) { return std::pow(x, -c); }

double Sse(const std::vector<Sample>& s, double c, double a, double b) {
  double sse = 0;
  for (const Sample& p : s) {
    const double r = p.y - a - b * InvPow(p.x, c);
    sse += p.w * r * r;
  }
  return sse;
}

// Weighted least squares for (a, b) at fixed c with a >= 0, b >= 0. The
// objective is convex, so the constrained optimum is the unconstrained one
// when feasible, else the better of the two edges a = 0 and b = 0.
LinearFit FitAtC(const std::vector<Sample>& s, double c) {
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const Sample& p : s) {
    const double x = InvPow(p.x, c);
    sw += p.w;
    sx += p.w * x;
    sy += p.w * p.y;
    sxx += p.w * x * x;
    sxy += p.w * x * p.y;
  }
  LinearFit best;
  best.sw = sw;
  best.sx = sx;
  best.sxx = sxx;
  const double det = sw * sxx - sx * sx;
  best.det = det;
  if (det > 1e-12 * sw * sxx) {
    const double b = (sw * sxy - sx * sy) / det;
    const double a = (sy - b * sx) / sw;
    if (a >= 0 && b >= 0) {
      best.a = a;
      best.b = b;
      best.sse = Sse(s, c, a, b);
      best.free = LinearFit::Free::kBoth;
      return best;
    }
  }
  // Edge b = 0: a constant.
  {
    const double a = std::max(0.0, sy / sw);
    const double sse = Sse(s, c, a, 0);
    if (sse < best.sse) {
      best.a = a;
      best.b = 0;
      best.sse = sse;
      best.free = LinearFit::Free::kAOnly;
    }
  }
  // Edge a = 0: a pure power law.
  if (sxx > 0) {
    const double b = std::max(0.0, sxy / sxx);
    const double sse = Sse(s, c, 0, b);
    if (sse < best.sse) {
      best.a = 0;
      best.b = b;
      best.sse = sse;
      best.free = LinearFit::Free::kBOnly;
    }
  }
  return best;
}

// Leverage of a point at x (relative tokens) in the fit at c: the variance
// of the fitted value there in units of the residual variance.
double Leverage(const LinearFit& f, double x, double c) {
  const double u = InvPow(x, c);
  switch (f.free) {
    case LinearFit::Free::kBoth:
      return (f.sxx - 2 * u * f.sx + u * u * f.sw) / f.det;
    case LinearFit::Free::kAOnly:
      return 1 / f.sw;
    case LinearFit::Free::kBOnly:
      return u * u / f.sxx;
  }
  return 0;
}

std::vector<double> Grid() {
  std::vector<double> g(kGridSize);
  for (int i = 0; i < kGridSize; ++i) {
    g[i] = kMinC * std::pow(kMaxC / kMinC, static_cast<double>(i) / (kGridSize - 1));
  }
  return g;
}

// The best c on the grid, refined by golden-section search between its
// neighbours.
Fit FitCurve(const std::vector<Sample>& s, const std::vector<double>& grid) {
  int best_i = 0;
  double best_sse = std::numeric_limits<double>::infinity();
  for (int i = 0; i < kGridSize; ++i) {
    const double sse = FitAtC(s, grid[i]).sse;
    if (sse < best_sse) {
      best_sse = sse;
      best_i = i;
    }
  }
  double lo = grid[std::max(0, best_i - 1)];
  double hi = grid[std::min(kGridSize - 1, best_i + 1)];
  const double phi = (std::sqrt(5.0) - 1) / 2;
  double x1 = hi - phi * (hi - lo), x2 = lo + phi * (hi - lo);
  double f1 = FitAtC(s, x1).sse, f2 = FitAtC(s, x2).sse;
  for (int it = 0; it < 60 && hi - lo > 1e-10; ++it) {
    if (f1 < f2) {
      hi = x2;
      x2 = x1;
      f2 = f1;
      x1 = hi - phi * (hi - lo);
      f1 = FitAtC(s, x1).sse;
    } else {
      lo = x1;
      x1 = x2;
      f1 = f2;
      x2 = lo + phi * (hi - lo);
      f2 = FitAtC(s, x2).sse;
    }
  }
  Fit fit;
  fit.c = grid[best_i];
  fit.lin = FitAtC(s, fit.c);
  const double c_refined = f1 < f2 ? x1 : x2;
  LinearFit refined = FitAtC(s, c_refined);
  if (refined.sse < fit.lin.sse) {
    fit.c = c_refined;
    fit.lin = refined;
  }
  return fit;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  double m = v[mid];
  if (v.size() % 2 == 0) {
    m = (m + *std::max_element(v.begin(), v.begin() + mid)) / 2;
  }
  return m;
}

// Huber IRLS: refits until the weights settle.
Fit RobustFit(std::vector<Sample>* s, const std::vector<double>& grid, double scale_floor) {
  Fit fit = FitCurve(*s, grid);
  for (int it = 0; it < kMaxHuberIterations; ++it) {
    std::vector<double> abs_r;
    abs_r.reserve(s->size());
    for (const Sample& p : *s) {
      abs_r.push_back(std::abs(p.y - fit.lin.a - fit.lin.b * InvPow(p.x, fit.c)));
    }
    const double scale = std::max(1.4826 * Median(abs_r), scale_floor);
    double change = 0;
    for (size_t i = 0; i < s->size(); ++i) {
      const double limit = kHuberTuning * scale;
      const double w = abs_r[i] <= limit ? 1.0 : limit / abs_r[i];
      change = std::max(change, std::abs(w - (*s)[i].w));
      (*s)[i].w = w;
    }
    if (change < 1e-6) break;
    fit = FitCurve(*s, grid);
  }
  return fit;
}

double Predict(const Fit& f, double x) { return f.lin.a + f.lin.b * InvPow(x, f.c); }

std::string Num(double v) { return absl::StrFormat("%.4g", v); }

LossForecast Invalid(std::string reason) {
  LossForecast f;
  f.status = ForecastStatus::kInvalidInput;
  f.reason = "forecast: " + std::move(reason);
  return f;
}

}  // namespace

const char* ForecastStatusName(ForecastStatus status) {
  switch (status) {
    case ForecastStatus::kOk:
      return "ok";
    case ForecastStatus::kInvalidInput:
      return "invalid_input";
    case ForecastStatus::kTooFewEvals:
      return "too_few_evals";
    case ForecastStatus::kRising:
      return "rising";
  }
  return "?";
}

namespace {

// Why `run` and `options` cannot be forecast from; nullopt when they can.
std::optional<std::string> InputProblem(const ForecastRun& run, const ForecastOptions& options) {
  if (run.max_steps <= 0) {
    return absl::StrFormat("max_steps must be positive, got %d", run.max_steps);
  }
  if (!std::isfinite(run.tokens_per_step) || run.tokens_per_step <= 0) {
    return absl::StrFormat("tokens_per_step must be a positive number, got %g",
                           run.tokens_per_step);
  }
  if (run.warmup_steps < 0) {
    return absl::StrFormat("warmup_steps must be >= 0, got %d", run.warmup_steps);
  }
  if (!(run.min_lr_ratio >= 0 && run.min_lr_ratio <= 1)) {
    return absl::StrFormat("min_lr_ratio must be in [0, 1], got %g", run.min_lr_ratio);
  }
  if (!(std::isfinite(options.settle_warmups) && options.settle_warmups >= 1 &&
        options.settle_warmups <= 100)) {
    return absl::StrFormat("settle_warmups must be in [1, 100], got %g", options.settle_warmups);
  }
  if (!(std::isfinite(options.band_k) && options.band_k >= 0)) {
    return absl::StrFormat("band_k must be a number >= 0, got %g", options.band_k);
  }
  if (!(options.min_rel_std >= 0 && options.min_rel_std < 1)) {
    return absl::StrFormat("min_rel_std must be in [0, 1), got %g", options.min_rel_std);
  }
  if (!(options.lr_decay_allowance >= 0 && options.lr_decay_allowance <= 1)) {
    return absl::StrFormat("lr_decay_allowance must be in [0, 1], got %g",
                           options.lr_decay_allowance);
  }
  return std::nullopt;
}

// The first evaluation of each step, in step order, into `by_step`; why the
// curve cannot be forecast from, or nullopt.
std::optional<std::string> FirstEvalPerStep(const std::vector<ForecastPoint>& curve,
                                            const ForecastRun& run,
                                            std::map<int64_t, const ForecastPoint*>* by_step) {
  for (const ForecastPoint& p : curve) {
    if (p.step < 0) {
      return absl::StrFormat("an evaluation has a negative step %d", p.step);
    }
    if (p.step > run.max_steps) {
      return absl::StrFormat("an evaluation at step %d is past max_steps %d", p.step,
                             run.max_steps);
    }
    if (std::isfinite(p.val_loss) && p.val_loss < 0) {
      return absl::StrFormat(
          "the validation loss at step %d is negative (%g); a cross-entropy is >= 0", p.step,
          p.val_loss);
    }
    by_step->emplace(p.step, &p);
  }
  return std::nullopt;
}

// Rising: a line in log tokens whose rise over the span is beyond noise.
bool RisesBeyondNoise(const std::vector<Sample>& samples, double t_ref, double t_first,
                      double band_k, double mean_abs) {
  const double n = static_cast<double>(samples.size());
  double sl = 0, sy = 0, sll = 0, sly = 0;
  for (const Sample& p : samples) {
    const double l = std::log(p.x);
    sl += l;
    sy += p.y;
    sll += l * l;
    sly += l * p.y;
  }
  const double det = n * sll - sl * sl;
  if (!(det > 0)) return false;
  const double slope = (n * sly - sl * sy) / det;
  const double icept = (sy - slope * sl) / n;
  double sse = 0;
  for (const Sample& p : samples) {
    const double r = p.y - icept - slope * std::log(p.x);
    sse += r * r;
  }
  const double std_line = std::sqrt(sse / std::max(n - 2, 1.0));
  const double rise = slope * std::log(t_ref / t_first);
  return slope > 0 && rise > band_k * std_line && rise > 1e-9 * mean_abs;
}

struct Band {
  double low = 0;
  double high = 0;
};

// The band around `predicted` (at `x_final`) before the decay allowance: the
// union of (1) the prediction intervals over the profile-likelihood set of c
// and (2) the forecast one evaluation ago. `s` is the residual scale.
Band PredictionBand(const std::vector<Sample>& samples, const Fit& fit,
                    const std::vector<double>& grid, double x_final, double predicted, double s,
                    double k, double mean_abs) {
  const double n = static_cast<double>(samples.size());
  const double dof = std::max(n - 3, 1.0);
  // 1. Union of prediction intervals over the profile-likelihood set of c.
  double low = predicted - k * s * std::sqrt(1 + Leverage(fit.lin, x_final, fit.c));
  double high = predicted + k * s * std::sqrt(1 + Leverage(fit.lin, x_final, fit.c));
  const double sse_limit = fit.lin.sse * (1 + k * k / dof) + 1e-24 * mean_abs * mean_abs * n;
  for (double c : grid) {
    const LinearFit lin = FitAtC(samples, c);
    if (!(lin.sse <= sse_limit)) continue;
    const double pred = lin.a + lin.b * InvPow(x_final, c);
    const double half = k * s * std::sqrt(1 + Leverage(lin, x_final, c));
    low = std::min(low, pred - half);
    high = std::max(high, pred + half);
  }
  // 2. Leave-last-out: the forecast one evaluation ago.
  if (samples.size() - 1 >= 3) {
    std::vector<Sample> head(samples.begin(), samples.end() - 1);
    for (Sample& p : head) p.w = 1;
    const Fit prev = RobustFit(&head, grid, 1e-9 * std::max(mean_abs, 1e-300));
    const double pred_prev = Predict(prev, x_final);
    low = std::min(low, pred_prev - k * s);
    high = std::max(high, pred_prev + k * s);
  }
  return Band{low, high};
}

// The share of the learning rate's cosine decay still ahead after step
// `s_last`.
double RemainingDecay(const ForecastRun& run, int64_t s_last) {
  double remaining_decay = 0;
  if (run.max_steps > run.warmup_steps) {
    const double progress = std::clamp(static_cast<double>(s_last - run.warmup_steps) /
                                           static_cast<double>(run.max_steps - run.warmup_steps),
                                       0.0, 1.0);
    remaining_decay = (1 - run.min_lr_ratio) * 0.5 * (1 + std::cos(M_PI * progress));
  }
  return remaining_decay;
}

}  // namespace

LossForecast ForecastFinalLoss(const std::vector<ForecastPoint>& curve, const ForecastRun& run,
                               const ForecastOptions& options) {
  if (std::optional<std::string> why = InputProblem(run, options)) return Invalid(*why);
  const int min_evals = std::max(3, options.min_evals);
  const int64_t fit_after = static_cast<int64_t>(
      std::floor(options.settle_warmups * static_cast<double>(run.warmup_steps)));

  std::map<int64_t, const ForecastPoint*> by_step;
  if (std::optional<std::string> why = FirstEvalPerStep(curve, run, &by_step)) {
    return Invalid(*why);
  }

  LossForecast f;
  f.metric = options.metric;
  f.at_step = run.max_steps;
  f.at_tokens = static_cast<double>(run.max_steps) * run.tokens_per_step;
  std::vector<ForecastPoint> fitted;
  std::vector<int64_t> non_finite_steps;
  for (const auto& [step, p] : by_step) {
    if (!std::isfinite(p->val_loss)) {
      ++f.evals_non_finite;
      non_finite_steps.push_back(step);
    } else if (step <= fit_after || p->tokens <= 0) {
      ++f.evals_before_fit;
    } else {
      fitted.push_back(*p);
    }
  }
  f.evals_used = static_cast<int>(fitted.size());
  const std::string excluded =
      f.evals_non_finite == 0
          ? ""
          : absl::StrFormat("; %d non-finite excluded (step %s)", f.evals_non_finite,
                            absl::StrJoin(non_finite_steps, ", "));
  if (f.evals_used < min_evals) {
    f.status = ForecastStatus::kTooFewEvals;
    f.reason = absl::StrFormat(
        "forecast: needs %d evaluations after warm-up (step > %d), has %d (%d in warm-up or "
        "at 0 tokens%s)",
        min_evals, fit_after, f.evals_used, f.evals_before_fit, excluded);
    return f;
  }

  const double t_ref = static_cast<double>(fitted.back().tokens);
  const double t_first = static_cast<double>(fitted.front().tokens);
  const double x_final = f.at_tokens / t_ref;
  std::vector<Sample> samples;
  samples.reserve(fitted.size());
  double mean_abs = 0;
  for (const ForecastPoint& p : fitted) {
    samples.push_back(Sample{static_cast<double>(p.tokens) / t_ref, p.val_loss, 1.0, p.step});
    mean_abs += std::abs(p.val_loss);
  }
  mean_abs /= static_cast<double>(fitted.size());
  const double n = static_cast<double>(fitted.size());
  const double last_loss = fitted.back().val_loss;

  if (RisesBeyondNoise(samples, t_ref, t_first, options.band_k, mean_abs)) {
    f.status = ForecastStatus::kRising;
    f.reason = absl::StrFormat(
        "forecast: the %s rises, from %s at step %d to %s at step %d over "
        "%d evaluations after warm-up; a rising curve has no forecast%s",
        f.metric == "val_loss" ? std::string("validation loss") : f.metric, Num(fitted.front().val_loss), fitted.front().step, Num(last_loss), fitted.back().step,
        f.evals_used, excluded);
    return f;
  }

  const std::vector<double> grid = Grid();
  const Fit fit = RobustFit(&samples, grid, 1e-9 * std::max(mean_abs, 1e-300));
  for (const Sample& p : samples) f.evals_outliers += p.w < 0.5 ? 1 : 0;
  const double dof = std::max(n - 3, 1.0);
  const double k = options.band_k;
  const double s =
      std::max(std::sqrt(fit.lin.sse / dof), options.min_rel_std * std::abs(last_loss));
  f.residual_std = s;
  f.predicted = Predict(fit, x_final);
  f.a = fit.lin.a;
  f.c = fit.c;
  // b for tokens in their own unit: b_ref x^(-c) = b_ref t_ref^c t^(-c).
  f.b = fit.lin.b * std::pow(t_ref, fit.c);

  // The band: (1) and (2) in PredictionBand; (3) the cosine decay still
  // ahead lowers the optimistic edge.
  const Band band = PredictionBand(samples, fit, grid, x_final, f.predicted, s, k, mean_abs);
  double low = band.low;
  const double high = band.high;
  const int64_t s_last = fitted.back().step;
  const double remaining_decay = RemainingDecay(run, s_last);
  f.decay_allowance = options.lr_decay_allowance * remaining_decay * std::abs(f.predicted);
  low -= f.decay_allowance;
  f.low = std::max(0.0, low);
  f.high = high;

  f.status = ForecastStatus::kOk;
  f.reason = absl::StrFormat(
      "forecast: final %s %s (band %s to %s) at step %d from %d evals "
      "(steps %d to %d; L = %s + %s t^-%.3f)%s%s",
      f.metric, Num(f.predicted), Num(f.low), Num(f.high), f.at_step, f.evals_used, fitted.front().step,
      s_last, Num(f.a), Num(f.b), f.c,
      f.evals_outliers > 0 ? absl::StrFormat("; %d outlier(s) down-weighted", f.evals_outliers)
                           : "",
      excluded);
  return f;
}

namespace {

std::string Summary(const LossForecast& f) {
  return absl::StrFormat("forecast: final %s %s (%s to %s) at step %d from %d evals",
                         f.metric, Num(f.predicted), Num(f.low), Num(f.high), f.at_step, f.evals_used);
}

}  // namespace

ForecastDecision CannotReach(const LossForecast& f, double target) {
  ForecastDecision d;
  if (!std::isfinite(target)) {
    d.reason = absl::StrFormat("forecast: no decision, the target %g is not finite", target);
    return d;
  }
  if (!f.ok()) {
    d.reason = f.reason;
    return d;
  }
  d.stop = f.low > target;
  d.reason = absl::StrFormat("%s %s the target %s", Summary(f),
                             d.stop ? "cannot reach" : "may reach", Num(target));
  return d;
}

ForecastDecision CannotImproveBy(const LossForecast& f, double best, double min_rel_delta) {
  ForecastDecision d;
  if (!std::isfinite(best) || !(min_rel_delta >= 0 && min_rel_delta < 1)) {
    d.reason = absl::StrFormat(
        "forecast: no decision, the best %g must be finite and min_rel_delta %g in [0, 1)", best,
        min_rel_delta);
    return d;
  }
  if (!f.ok()) {
    d.reason = f.reason;
    return d;
  }
  const double threshold = best * (1 - min_rel_delta);
  d.stop = !(f.low < threshold);
  d.reason = absl::StrFormat("%s %s the best %s by %g%% (below %s)", Summary(f),
                             d.stop ? "cannot improve on" : "may improve on", Num(best),
                             100 * min_rel_delta, Num(threshold));
  return d;
}

}  // namespace tally::policy
