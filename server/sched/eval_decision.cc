#include "server/sched/eval_decision.h"

namespace tally::sched {
namespace {

policy::EarlyStoppingRules Rules(const tally::v1::EarlyStoppingSpec& s) {
  policy::EarlyStoppingRules r;
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
  policy::EarlyStoppingState state = FromStatus(job.early_stopping());
  const policy::EarlyStoppingDecision d =
      policy::ObserveEval(Rules(job.spec().early_stopping()), &state, eval.step(), eval.val_loss());
  ToStatus(state, &out.early_stopping);
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

std::vector<policy::CurvePoint> CurveOf(const tally::v1::Job& job) {
  std::vector<policy::CurvePoint> out;
  out.reserve(job.curve_size());
  for (const auto& e : job.curve()) {
    out.push_back({e.step(), e.tokens(), e.cost_usd(), e.gpu_seconds(), e.val_loss()});
  }
  return out;
}

}  // namespace tally::sched
