// Early stopping (pure: values in, decision out; no I/O, no clock).
//
// The controller feeds every evaluation of a job to ObserveEval, which
// updates the job's state and says whether a rule stops it:
// - divergence: the validation loss is NaN or infinite, or (with a
//   divergence_factor) above factor x best;
// - no gain over the baseline: the step-0 evaluation is the baseline; after
//   `baseline_evals` more evaluations the best has not beaten it by
//   `baseline_min_rel_gain` ("the most effective strategy is training less");
// - patience: `patience` evaluations in a row without an improvement, once
//   at least `min_evals` have been counted. An evaluation improves when
//   val < best x (1 - min_rel_delta), or val < best - min_delta when
//   min_delta is set. Equal to the threshold is not an improvement.
// An evaluation at a step already counted (a resumed attempt evaluating
// again) is ignored, so a restart never double-counts.
// The loss passed in is the one the job's early_stopping.metric names
// (policy/loss_metric.h): the rules are the same for either, and their
// reasons name it (`metric_name`).
#ifndef TALLY_SERVER_POLICY_EARLY_STOPPING_H_
#define TALLY_SERVER_POLICY_EARLY_STOPPING_H_

#include <cstdint>
#include <string>

namespace tally::policy {

struct EarlyStoppingRules {
  int patience = 0;               // 0: no patience rule
  double min_rel_delta = 0;
  double min_delta = 0;
  int min_evals = 0;
  double divergence_factor = 0;   // 0: only NaN/Inf diverge
  int baseline_evals = 0;         // 0: no baseline rule
  double baseline_min_rel_gain = 0;
  // What the reasons call the loss judged: "validation loss", or
  // "quantized_val_loss" when the rules judge the quantized loss.
  std::string metric_name = "validation loss";
};

struct EarlyStoppingState {
  int evals = 0;
  int64_t last_step = -1;
  bool has_best = false;
  double best = 0;
  int64_t best_step = 0;
  int evals_since_best = 0;
  bool has_baseline = false;
  double baseline = 0;
};

enum class StopRule { kNone, kPatience, kDivergence, kNoGainOverBaseline };
const char* StopRuleName(StopRule rule);  // "patience", "divergence", "no_gain_over_baseline"

struct EarlyStoppingDecision {
  StopRule rule = StopRule::kNone;
  std::string reason;       // the rule and the numbers behind it, when stopping
  int patience_left = -1;   // -1 without a patience rule
  bool counted = false;     // false: a step already seen, ignored
};

// `loss`: the evaluation's value of the judged metric.
EarlyStoppingDecision ObserveEval(const EarlyStoppingRules& rules, EarlyStoppingState* state,
                                  int64_t step, double loss);

int PatienceLeft(const EarlyStoppingRules& rules, const EarlyStoppingState& state);

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_EARLY_STOPPING_H_
