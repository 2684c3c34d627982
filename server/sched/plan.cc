#include "server/sched/plan.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"

namespace tally::sched {

// "EARLY_STOPPED": a job state without its prefix.
std::string StateName(tally::v1::JobState s) {
  absl::string_view name = tally::v1::JobState_Name(s);
  absl::ConsumePrefix(&name, "JOB_STATE_");
  return std::string(name);
}

// A stop order for attempt `attempt` of `job` (see StopOrder).
tally::v1::ControllerMessage StopMessage(const std::string& job, int32_t attempt,
                                         const std::string& reason, bool checkpoint,
                                         bool preempt) {
  tally::v1::ControllerMessage msg;
  tally::v1::StopOrder& stop = *msg.mutable_stop();
  stop.set_job(job);
  stop.set_attempt(attempt);
  stop.set_reason(reason);
  stop.set_checkpoint(checkpoint);
  stop.set_preempt(preempt);
  return msg;
}

// What may cause a preemption (a metric label: a bounded set).
bool KnownPreemptionCause(absl::string_view cause) {
  return cause == "sigterm" || cause == "sigint" || cause == "notice_file" ||
         cause == "idle" || cause == "priority" || cause == "experiment";
}

// The cause of a preemption tallyd ordered (the job's pending_for): an
// experiment holding its variant ("experiments/N"), or a job of higher
// priority.
std::string OrderedPreemptionCause(const tally::v1::Job& j) {
  return absl::StartsWith(j.preemption().pending_for(), "experiments/") ? "experiment"
                                                                        : "priority";
}

// "1.2s": a duration in a reason, to a tenth of a second.
std::string ShortSeconds(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(100)));
}

// An ended attempt's state as an outcome label (tally_attempts_ended_total).
const char* Outcome(store::AttemptState s) {
  switch (s) {
    case store::ATTEMPT_STATE_SUCCEEDED:
      return "succeeded";
    case store::ATTEMPT_STATE_LOST:
      return "lost";
    case store::ATTEMPT_STATE_FAILED:
      return "failed";
    case store::ATTEMPT_STATE_PREEMPTED:
      return "preempted";
    default:
      return "stopped";
  }
}

}  // namespace tally::sched
