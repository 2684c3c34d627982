// Plan: one state change of a job, decided. Everything the transaction
// writes and what is done once it has committed. A plan is built from a copy
// of the job; nothing outside it changes until the scheduler commits it
// (Scheduler::Execute), then acts on it and tells the observers
// (SchedMetrics reads the metric deltas from it).
#ifndef TALLY_SERVER_SCHED_PLAN_H_
#define TALLY_SERVER_SCHED_PLAN_H_

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/sched/worker_registry.h"
#include "server/store/job_store.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

struct Plan {
  int64_t job_id = 0;
  absl::Time now;
  // Written in one transaction.
  store::JobRecord rec;
  std::optional<store::AttemptRecord> attempt;  // the attempt, changed or not
  bool write_attempt = false;
  std::vector<tally::v1::JobEvent> events;
  std::vector<tally::v1::Checkpoint> checkpoints;
  // In memory, once committed.
  bool keep_attempt = false;  // the job still has a current attempt after
  bool finished = false;      // terminal: the job leaves the active set
  bool requeued = false;      // queued again: its wait starts now
  bool progress_event = false;
  std::optional<tally::v1::Checkpoint> last_checkpoint;
  std::vector<std::pair<std::string, AttemptKey>> release;    // slots freed
  std::vector<std::pair<std::string, AttemptKey>> release_one;  // one rank's slot freed
  std::vector<std::tuple<std::string, AttemptKey, int>> hold;  // slots taken
  // Acted on, once committed.
  std::vector<std::pair<std::string, tally::v1::ControllerMessage>> sends;
  // Metric deltas (SchedMetrics::OnPlanCommitted).
  std::vector<tally::v1::JobState> transitions;
  std::vector<std::string> attempts_ended;  // outcomes
  double cost_added_usd = 0;
  double lost_added_usd = 0;
  double redone_added_usd = 0;
  std::string preemption_cause;  // counted in tally_preemptions_total
  std::string early_stop_rule;
  std::string end_rule;  // for a finished job; empty: the state's default rule
  std::optional<double> queue_wait_seconds;
};

// The plans' vocabulary.
// "EARLY_STOPPED": a job state without its prefix.
std::string StateName(tally::v1::JobState s);
// A stop order for attempt `attempt` of `job` (see StopOrder).
tally::v1::ControllerMessage StopMessage(const std::string& job, int32_t attempt,
                                         const std::string& reason, bool checkpoint = false,
                                         bool preempt = false);
// What may cause a preemption (a metric label: a bounded set).
bool KnownPreemptionCause(absl::string_view cause);
// The cause of a preemption tallyd ordered (the job's pending_for): an
// experiment holding its variant ("experiments/N"), or a job of higher
// priority.
std::string OrderedPreemptionCause(const tally::v1::Job& j);
// "1.2s": a duration in a reason, to a tenth of a second.
std::string ShortSeconds(absl::Duration d);
// An ended attempt's state as an outcome label (tally_attempts_ended_total).
const char* Outcome(store::AttemptState s);

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_PLAN_H_
