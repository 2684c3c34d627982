// What one evaluation decides for a job (pure): the job's early-stopping and
// routing-watch status after it, and whether it stops the job. The scheduler
// puts the result in the evaluation's plan, so the eval event, a routing
// warning and a decided stop commit in one transaction.
#ifndef TALLY_SERVER_SCHED_EVAL_DECISION_H_
#define TALLY_SERVER_SCHED_EVAL_DECISION_H_

#include <string>
#include <vector>

#include "server/policy/early_stopping.h"
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
// (false for dense models).
EvalDecision DecideEval(const tally::v1::Job& job, const tally::v1::EvalResult& eval,
                        bool routing_collapsed);

// The job's evaluation curve with its spend at each point, as the target
// policy (policy/target.h) reads it.
std::vector<policy::CurvePoint> CurveOf(const tally::v1::Job& job);

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_EVAL_DECISION_H_
