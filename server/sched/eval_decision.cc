#include "server/sched/eval_decision.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/policy/loss_metric.h"
#include "server/policy/stop_rules.h"

namespace tally::sched {
namespace {

using policy::LossMetric;

policy::EarlyStoppingRules Rules(const tally::v1::EarlyStoppingSpec& s) {
  policy::EarlyStoppingRules r;
  if (policy::ParseLossMetric(s.metric()) == LossMetric::kQuantizedValLoss) {
    r.metric_name = policy::kQuantizedValLossMetric;
  }
  r.patience = s.patience();
  r.min_rel_delta = s.min_rel_delta();
  r.min_delta = s.min_delta();
  r.min_evals = s.min_evals();
  r.divergence_factor = s.divergence_factor();
  r.baseline_evals = s.baseline_evals();
  r.baseline_min_rel_gain = s.baseline_min_rel_gain();
  return r;
}

policy::EarlyStoppingState FromStatus(const tally::v1::EarlyStoppingStatus& s) {
  policy::EarlyStoppingState st;
  st.evals = s.evals();
  st.last_step = s.evals() > 0 ? s.last_step() : -1;
  st.has_best = s.has_best();
  st.best = s.best_val_loss();
  st.best_step = s.best_step();
  st.evals_since_best = s.evals_since_best();
  st.has_baseline = s.has_baseline();
  st.baseline = s.baseline_val_loss();
  return st;
}

void ToStatus(const policy::EarlyStoppingState& st, tally::v1::EarlyStoppingStatus* s) {
  s->set_evals(st.evals);
  s->set_last_step(st.last_step);
  s->set_has_best(st.has_best);
  s->set_best_val_loss(st.best);
  s->set_best_step(st.best_step);
  s->set_evals_since_best(st.evals_since_best);
  s->set_has_baseline(st.has_baseline);
  s->set_baseline_val_loss(st.baseline);
}

}  // namespace

EvalDecision DecideEval(const tally::v1::Job& job, const tally::v1::EvalResult& eval,
                        bool routing_collapsed) {
  EvalDecision out;
  out.early_stopping = job.early_stopping();
  const LossMetric metric = MetricOf(job);
  out.early_stopping.set_metric(policy::LossMetricName(metric));
  policy::EarlyStoppingDecision d;
  // An evaluation without the judged loss (reports checks refuse one for a
  // job evaluated quantized) is not judged.
  if (metric == LossMetric::kValLoss || eval.has_quantized_val_loss()) {
    policy::EarlyStoppingState state = FromStatus(job.early_stopping());
    d = policy::ObserveEval(Rules(job.spec().early_stopping()), &state, eval.step(),
                            policy::LossOf(metric, eval));
    ToStatus(state, &out.early_stopping);
  } else {
    d.patience_left = policy::PatienceLeft(Rules(job.spec().early_stopping()),
                                           FromStatus(job.early_stopping()));
  }
  out.early_stopping.set_patience_left(d.patience_left);

  out.routing = job.routing();
  out.routing.set_collapsed_evals(routing_collapsed ? out.routing.collapsed_evals() + 1 : 0);
  out.warn_collapse =
      out.routing.collapsed_evals() >= kCollapseEvals && !out.routing.collapse_warned();
  if (out.warn_collapse) out.routing.set_collapse_warned(true);

  if (d.rule != policy::StopRule::kNone && eval.step() < job.spec().training().max_steps()) {
    out.rule = d.rule;
    out.reason = d.reason;
  }
  return out;
}

policy::LossMetric MetricOf(const tally::v1::Job& job) {
  return policy::ParseLossMetric(job.spec().early_stopping().metric());
}

std::vector<policy::CurvePoint> CurveOf(const tally::v1::Job& job) {
  return CurveOf(job, MetricOf(job));
}

std::vector<policy::CurvePoint> CurveOf(const tally::v1::Job& job, policy::LossMetric metric) {
  std::vector<policy::CurvePoint> out;
  out.reserve(job.curve_size());
  for (const auto& e : job.curve()) {
    out.push_back(
        {e.step(), e.tokens(), e.cost_usd(), e.gpu_seconds(), policy::LossOf(metric, e)});
  }
  return out;
}

policy::LossForecast ForecastOf(const tally::v1::Job& j) {
  // The fit runs under the scheduler's lock after every evaluation and costs
  // time linear in its points (about 9 ms for 512, 2 ms for 128 here): a
  // long curve is fitted on 128 evenly spread points, its latest included.
  constexpr int kMaxFitPoints = 128;
  const LossMetric metric = MetricOf(j);
  const int n = j.curve_size();
  const int stride = (n + kMaxFitPoints - 1) / kMaxFitPoints;
  std::vector<policy::ForecastPoint> points;
  points.reserve(std::min(n, kMaxFitPoints + 1));
  double tokens_per_step = 0;
  for (int i = 0; i < n; ++i) {
    const auto& e = j.curve(i);
    // Tokens as the evaluations count them (document tokens), per step.
    if (e.step() > 0 && e.tokens() > 0) {
      tokens_per_step = static_cast<double>(e.tokens()) / static_cast<double>(e.step());
    }
    // A point without the judged loss (not evaluated quantized) is none.
    if ((n - 1 - i) % stride == 0 &&
        (metric == LossMetric::kValLoss || e.has_quantized_val_loss())) {
      points.push_back({e.step(), e.tokens(), policy::LossOf(metric, e)});
    }
  }
  const auto& spec = j.spec();
  policy::ForecastRun run;
  run.max_steps = spec.training().max_steps();
  run.tokens_per_step = tokens_per_step > 0
                            ? tokens_per_step
                            : static_cast<double>(spec.training().global_batch_tokens());
  run.warmup_steps = spec.optimizer().warmup_steps();
  run.min_lr_ratio = spec.optimizer().lr() > 0 ? spec.optimizer().min_lr() / spec.optimizer().lr()
                                               : 1.0;
  policy::ForecastOptions options;
  options.metric = policy::LossMetricName(metric);
  if (spec.early_stopping().forecast_min_evals() > 0) {
    options.min_evals = spec.early_stopping().forecast_min_evals();
  }
  return policy::ForecastFinalLoss(points, run, options);
}

void AddCurvePoint(tally::v1::Job& j, const tally::v1::EvalResult& ev) {
  constexpr int kMaxCurvePoints = 512;
  // A resumed attempt evaluates steps already on the curve again.
  if (j.curve_size() > 0 && ev.step() <= j.curve(j.curve_size() - 1).step()) return;
  if (j.curve_size() >= kMaxCurvePoints) {
    // Thin out every other point, keeping the first (the baseline) and the
    // latest: the curve's shape survives, its size stays bounded.
    google::protobuf::RepeatedPtrField<tally::v1::EvalPoint> kept;
    for (int i = 0; i < j.curve_size(); ++i) {
      if (i % 2 == 0 || i == j.curve_size() - 1) *kept.Add() = j.curve(i);
    }
    j.mutable_curve()->Swap(&kept);
  }
  tally::v1::EvalPoint& e = *j.add_curve();
  e.set_attempt(ev.attempt());
  e.set_step(ev.step());
  e.set_tokens(ev.tokens());
  e.set_cost_usd(j.cost().cost_usd());
  e.set_gpu_seconds(j.cost().gpu_seconds());
  e.set_val_loss(ev.val_loss());
  if (ev.has_quantized_val_loss()) e.set_quantized_val_loss(ev.quantized_val_loss());
}

std::optional<EvalEvent> RecordTargetReached(tally::v1::Job& j) {
  if (j.target_val_loss() <= 0 || j.has_target_reached()) return std::nullopt;
  const LossMetric metric = MetricOf(j);
  auto x = policy::FindTargetCrossing(CurveOf(j, metric), j.target_val_loss());
  if (!x) return std::nullopt;
  tally::v1::TargetReached& t = *j.mutable_target_reached();
  t.set_target_val_loss(j.target_val_loss());
  t.set_metric(policy::LossMetricName(metric));
  t.set_step(x->at.step);
  t.set_tokens(x->at.tokens);
  t.set_cost_usd(x->at.cost_usd);
  t.set_gpu_seconds(x->at.gpu_seconds);
  t.set_val_loss(x->at.val_loss);
  // The evaluation's own losses, whichever the target is of.
  for (const tally::v1::EvalPoint& p : j.curve()) {
    if (p.step() != x->at.step) continue;
    t.set_val_loss(p.val_loss());
    if (p.has_quantized_val_loss()) t.set_quantized_val_loss(p.quantized_val_loss());
    break;
  }
  t.set_cost_to_target_usd(x->cost_usd);
  t.set_tokens_to_target(x->tokens);
  t.set_gpu_seconds_to_target(x->gpu_seconds);
  EvalEvent e;
  e.type = "target_reached";
  e.reason = absl::StrFormat(
      "target reached: %s %.4f <= target %.4f at step %d ($%.4f; $%.4f to the "
      "target itself)",
      policy::LossMetricName(metric), x->at.val_loss, j.target_val_loss(), x->at.step,
      x->at.cost_usd, x->cost_usd);
  e.detail = absl::StrFormat("%.0f tokens and %.1f GPU-seconds to the target", x->tokens,
                             x->gpu_seconds);
  return e;
}

EvalOutcome DecideEval(const tally::v1::Job& job, const tally::v1::EvalResult& ev,
                      bool routing_collapsed, const std::string& collapse_where) {
  EvalOutcome o;
  o.job = job;
  tally::v1::Job& j = o.job;
  // An evaluation of an older step (sent again, or late) never moves the
  // job's shown step back.
  if (ev.step() >= j.step()) {
    j.set_step(ev.step());
    j.set_tokens(ev.tokens());
  }
  j.set_val_loss(ev.val_loss());
  if (ev.has_quantized_val_loss()) {
    j.set_quantized_val_loss(ev.quantized_val_loss());
  } else {
    j.clear_quantized_val_loss();
  }
  EvalEvent& eval_event = o.events.emplace_back();
  eval_event.type = "eval";
  eval_event.detail = absl::StrCat(ev.bits_per_byte(), " bits/byte");
  if (ev.docs() > 0) {
    absl::StrAppend(&eval_event.detail, "; document-weighted val_loss ", ev.doc_val_loss(),
                    " over ", ev.docs(), " documents");
  }
  eval_event.val_loss = ev.val_loss();
  if (ev.has_quantized_val_loss()) eval_event.quantized_val_loss = ev.quantized_val_loss();
  if (j.has_pending_stop()) {
    // Stopping already (the final evaluation of the stopped state): recorded,
    // no longer judged; but it is the run's state, and it may be its best.
    tally::v1::EarlyStoppingStatus& es = *j.mutable_early_stopping();
    const double loss = policy::LossOf(MetricOf(j), ev);
    if (std::isfinite(loss) && (!es.has_best() || loss < es.best_val_loss())) {
      es.set_has_best(true);
      es.set_best_val_loss(loss);
      es.set_best_step(ev.step());
      es.set_evals_since_best(0);
    }
    AddCurvePoint(j, ev);
    return o;
  }
  const EvalDecision d = DecideEval(j, ev, routing_collapsed);
  *j.mutable_early_stopping() = d.early_stopping;
  *j.mutable_routing() = d.routing;
  AddCurvePoint(j, ev);
  // The target in force: the spec's, or its fraction of the step-0 loss
  // once that is known.
  const auto& es = j.spec().early_stopping();
  if (j.target_val_loss() <= 0) {
    if (es.target_val_loss() > 0) {
      j.set_target_val_loss(es.target_val_loss());
    } else if (es.target_rel_to_baseline() > 0 && j.early_stopping().has_baseline() &&
               std::isfinite(j.early_stopping().baseline_val_loss())) {
      j.set_target_val_loss(es.target_rel_to_baseline() * j.early_stopping().baseline_val_loss());
    }
  }
  if (d.warn_collapse) {
    o.events.push_back({"warning",
                        absl::StrFormat("routing collapse: %s for %d evaluations in a row",
                                        collapse_where, d.routing.collapsed_evals()),
                        "raise model.moe.aux_loss_coef or set model.moe.bias_balancing",
                        std::nullopt});
  }
  const bool before_the_end = ev.step() < j.spec().training().max_steps();
  if (std::optional<EvalEvent> reached = RecordTargetReached(j)) {
    o.events.push_back(*reached);
    if (before_the_end) {
      // Good enough: the job stops, keeping the state that reached it.
      o.stop = EvalStop{tally::v1::JOB_STATE_SUCCEEDED, "succeeded", reached->reason,
                        policy::rules::kTarget};
      return o;
    }
  }
  if (d.rule != policy::StopRule::kNone) {
    o.stop = EvalStop{tally::v1::JOB_STATE_EARLY_STOPPED, "early_stopped", d.reason,
                      policy::StopRuleName(d.rule)};
    return o;
  }
  // The forecast: shown for every job, a stop only when asked for.
  const policy::LossForecast f = ForecastOf(j);
  tally::v1::Forecast& shown = *j.mutable_forecast();
  shown.set_valid(f.ok());
  shown.set_final_val_loss(f.predicted);
  shown.set_low(f.low);
  shown.set_high(f.high);
  shown.set_evals_used(f.evals_used);
  shown.set_step(ev.step());
  shown.set_a(f.a);
  shown.set_b(f.b);
  shown.set_c(f.c);
  shown.set_reason(f.reason);
  shown.set_metric(f.metric);
  if (f.ok()) {
    // Watchers see the forecast beside the evaluation it comes from.
    absl::StrAppendFormat(&o.events[0].detail,
                          "; forecast %.4f (%.4f-%.4f) at step %d from %d evals", f.predicted,
                          f.low, f.high, f.at_step, f.evals_used);
  }
  if (!es.forecast() || !f.ok() || !before_the_end) return o;
  const policy::ForecastDecision fd =
      j.target_val_loss() > 0
          ? policy::CannotReach(f, j.target_val_loss())
          : (j.early_stopping().has_best()
                 ? policy::CannotImproveBy(f, j.early_stopping().best_val_loss(),
                                           es.min_rel_delta())
                 : policy::ForecastDecision{});
  if (fd.stop) {
    o.stop = EvalStop{tally::v1::JOB_STATE_EARLY_STOPPED, "early_stopped", fd.reason,
                      policy::rules::kForecast};
  }
  return o;
}

}  // namespace tally::sched
