// The names of the rules a job ends by, in one place: the policies and the
// scheduler write them into jobs (end_rule, pending_stop.rule), events and
// the reason_rule / rule labels of tally_job_ends_total and
// tally_early_stops_total, and alerts and dashboards match on them. A new
// rule is added here, to the list of its terminal state below, and to the
// code that decides it.
#ifndef TALLY_SERVER_POLICY_STOP_RULES_H_
#define TALLY_SERVER_POLICY_STOP_RULES_H_

#include <utility>
#include <vector>

namespace tally::policy::rules {

// SUCCEEDED
inline constexpr char kMaxSteps[] = "max_steps";
inline constexpr char kTarget[] = "target";
// EARLY_STOPPED
inline constexpr char kPatience[] = "patience";
inline constexpr char kDivergence[] = "divergence";
inline constexpr char kNoGainOverBaseline[] = "no_gain_over_baseline";
inline constexpr char kForecast[] = "forecast";
inline constexpr char kExperimentHalving[] = "experiment_halving";
// BUDGET_EXHAUSTED
inline constexpr char kBudget[] = "budget";
inline constexpr char kExperimentBudget[] = "experiment_budget";
inline constexpr char kTenantQuota[] = "tenant_quota";
// CANCELLED, FAILED
inline constexpr char kCancel[] = "cancel";
inline constexpr char kFailure[] = "failure";

// The rules that stop a job early (tally_early_stops_total{rule}).
inline const std::vector<const char*>& EarlyStopRules() {
  static const std::vector<const char*> rules = {kPatience, kDivergence, kNoGainOverBaseline,
                                                 kForecast, kExperimentHalving};
  return rules;
}

// Each terminal state's label ("early_stopped") and the rules that end a job
// in it (tally_job_ends_total{state, reason_rule}).
inline const std::vector<std::pair<const char*, std::vector<const char*>>>& JobEndRules() {
  static const std::vector<std::pair<const char*, std::vector<const char*>>> ends = {
      {"succeeded", {kMaxSteps, kTarget}},
      {"early_stopped", EarlyStopRules()},
      {"budget_exhausted", {kBudget, kExperimentBudget, kTenantQuota}},
      {"cancelled", {kCancel}},
      {"failed", {kFailure}}};
  return ends;
}

}  // namespace tally::policy::rules

#endif  // TALLY_SERVER_POLICY_STOP_RULES_H_
