// What one evaluation decides for a job (pure): the job's early-stopping and
// routing-watch status after it, its curve, target and forecast, the events
// to record and whether it stops the job. The scheduler puts the result in
// the evaluation's plan, so the eval event, a routing warning, a target
// reached and a decided stop commit in one transaction.
#ifndef TALLY_SERVER_SCHED_EVAL_DECISION_H_
#define TALLY_SERVER_SCHED_EVAL_DECISION_H_

#include <optional>
#include <string>
#include <vector>

#include "server/policy/early_stopping.h"
#include "server/policy/forecast.h"
#include "server/policy/loss_metric.h"
#include "server/policy/target.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

// Evaluations in a row at which a MoE layer's routing had collapsed (at the
// latest progress before each; metrics::AssessMoeLayer, the rule the
// tally_job_moe_collapsed metric and the TallyExpertCollapse alert use too)
// before the routing-collapse warning.
inline constexpr int kCollapseEvals = 3;

struct EvalDecision {
  tally::v1::EarlyStoppingStatus early_stopping;  // the job's, after this eval
  tally::v1::RoutingStatus routing;               // the job's, after this eval
  bool warn_collapse = false;  // record the routing-collapse warning now
  // kNone: go on. A rule that fires at or after max_steps is dropped: at the
  // last step there is nothing left to save by stopping.
  policy::StopRule rule = policy::StopRule::kNone;
  std::string reason;  // the rule and the numbers behind it
};

// `routing_collapsed`: a MoE layer had collapsed at the latest progress
// (false for dense models). The rules judge the job's early_stopping.metric
// (MetricOf): an evaluation without that loss is recorded but not judged.
EvalDecision DecideEval(const tally::v1::Job& job, const tally::v1::EvalResult& eval,
                        bool routing_collapsed);

// The loss the job's rules judge: its spec's early_stopping.metric.
policy::LossMetric MetricOf(const tally::v1::Job& job);

// The job's evaluation curve with its spend at each point, as the target
// policy (policy/target.h) reads it: each point's loss is `metric`'s (NaN
// where the point has none), the job's own metric by default.
std::vector<policy::CurvePoint> CurveOf(const tally::v1::Job& job);
std::vector<policy::CurvePoint> CurveOf(const tally::v1::Job& job, policy::LossMetric metric);

// Adds the evaluation to the job's curve with the job's spend now; a step
// already on it (a resumed attempt evaluating again) adds nothing. The curve
// stays at most 512 points: every other point is thinned out, the first (the
// baseline) and the latest kept.
void AddCurvePoint(tally::v1::Job& job, const tally::v1::EvalResult& eval);

// The final-loss forecast from the job's curve (policy/forecast.h), fitted on
// at most 129 evenly spread points, its latest included.
policy::LossForecast ForecastOf(const tally::v1::Job& job);

// An event one evaluation records, in the order recorded.
struct EvalEvent {
  std::string type;  // "eval", "warning", "target_reached"
  std::string reason;
  std::string detail;
  std::optional<double> val_loss;  // the eval event's
  std::optional<double> quantized_val_loss;
};

// A stop an evaluation decides: the job keeps running until its workers
// checkpoint the evaluated state and exit, then ends in `state`.
struct EvalStop {
  tally::v1::JobState state;
  std::string type;    // "succeeded", "early_stopped"
  std::string reason;  // the rule and the numbers behind it
  std::string rule;    // policy::rules
};

// Marks the job's target as reached when its curve (of its metric) has
// crossed it (and it was not marked yet): sets target_reached and returns
// its event, which names the metric.
std::optional<EvalEvent> RecordTargetReached(tally::v1::Job& job);

struct EvalOutcome {
  // The job after the evaluation: early stopping, routing, curve, the target
  // in force and where it was reached, the forecast.
  tally::v1::Job job;
  std::vector<EvalEvent> events;
  std::optional<EvalStop> stop;
};

// Everything one evaluation decides for a job (pure: the job as committed,
// the evaluation, and the routing watch's latest reading). A job already
// stopping records the evaluation and keeps its best; nothing else is
// decided for it. Otherwise, in order: the rules (DecideEval), the target
// (the spec's, or its fraction of the step-0 loss) and its crossing, then
// the forecast (shown for every job; a stop only with
// early_stopping.forecast). Every rule, the target and the forecast judge
// the job's early_stopping.metric. No stop is decided at or after max_steps.
// `collapse_where` names the collapsed layer for the routing warning.
EvalOutcome DecideEval(const tally::v1::Job& job, const tally::v1::EvalResult& eval,
                      bool routing_collapsed, const std::string& collapse_where);

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_EVAL_DECISION_H_
