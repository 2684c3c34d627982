#include "server/policy/early_stopping.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "server/policy/stop_rules.h"

namespace tally::policy {

const char* StopRuleName(StopRule rule) {
  switch (rule) {
    case StopRule::kNone:
      return "none";
    case StopRule::kPatience:
      return rules::kPatience;
    case StopRule::kDivergence:
      return rules::kDivergence;
    case StopRule::kNoGainOverBaseline:
      return rules::kNoGainOverBaseline;
  }
  return "?";
}

int PatienceLeft(const EarlyStoppingRules& rules, const EarlyStoppingState& state) {
  if (rules.patience <= 0) return -1;
  return rules.patience - state.evals_since_best;
}

EarlyStoppingDecision ObserveEval(const EarlyStoppingRules& r, EarlyStoppingState* s,
                                  int64_t step, double val) {
  EarlyStoppingDecision d;
  if (step <= s->last_step) {
    d.patience_left = PatienceLeft(r, *s);
    return d;
  }
  d.counted = true;
  s->last_step = step;
  ++s->evals;
  auto stop = [&](StopRule rule, std::string reason) {
    d.rule = rule;
    d.reason = std::move(reason);
    d.patience_left = PatienceLeft(r, *s);
    return d;
  };
  if (!std::isfinite(val)) {
    return stop(StopRule::kDivergence,
                absl::StrFormat("divergence: %s is %f at step %d", r.metric_name, val, step));
  }
  if (step == 0 && !s->has_baseline) {
    s->has_baseline = true;
    s->baseline = val;
  }
  if (!s->has_best) {
    s->has_best = true;
    s->best = val;
    s->best_step = step;
    s->evals_since_best = 0;
    d.patience_left = PatienceLeft(r, *s);
    return d;
  }
  const bool improved = val < s->best * (1.0 - r.min_rel_delta) ||
                        (r.min_delta > 0 && val < s->best - r.min_delta);
  if (improved) {
    s->best = val;
    s->best_step = step;
    s->evals_since_best = 0;
  } else {
    ++s->evals_since_best;
  }
  if (r.divergence_factor > 0 && val > s->best * r.divergence_factor) {
    return stop(StopRule::kDivergence,
                absl::StrFormat("divergence: %s %.4f at step %d is above %g x "
                                "the best %.4f (step %d)",
                                r.metric_name, val, step, r.divergence_factor, s->best,
                                s->best_step));
  }
  if (r.baseline_evals > 0 && s->has_baseline && s->evals - 1 >= r.baseline_evals &&
      !(s->best < s->baseline * (1.0 - r.baseline_min_rel_gain))) {
    return stop(StopRule::kNoGainOverBaseline,
                absl::StrFormat("no gain over baseline: after %d evaluations the best "
                                "%s %.4f (step %d) has not beaten the step-0 "
                                "baseline %.4f by %g%%",
                                s->evals - 1, r.metric_name, s->best, s->best_step, s->baseline,
                                100 * r.baseline_min_rel_gain));
  }
  if (r.patience > 0 && s->evals >= r.min_evals && s->evals_since_best >= r.patience) {
    return stop(StopRule::kPatience,
                absl::StrFormat("patience: %d evaluations without improving on the best "
                                "%s %.4f (step %d) by %g%%%s; latest %.4f at "
                                "step %d",
                                s->evals_since_best, r.metric_name, s->best, s->best_step,
                                100 * r.min_rel_delta,
                                r.min_delta > 0 ? absl::StrFormat(" or %g", r.min_delta) : "",
                                val, step));
  }
  d.patience_left = PatienceLeft(r, *s);
  return d;
}

}  // namespace tally::policy
