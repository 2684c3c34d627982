// ActiveJob: a queued or running job as the scheduler holds it: its record
// as committed, its current attempt, and what the scheduler tracks between
// reports. Plans read it (plans.h); only the scheduler changes it, once a
// plan has committed.
#ifndef TALLY_SERVER_SCHED_ACTIVE_JOB_H_
#define TALLY_SERVER_SCHED_ACTIVE_JOB_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "server/store/job_store.h"
#include "tally/v1/jobs.pb.h"

namespace tally::sched {

struct ActiveJob {
  store::JobRecord rec;  // as committed, plus the latest progress fields
  absl::Time queued_since;
  std::optional<store::AttemptRecord> attempt;  // when RUNNING
  absl::Time last_progress_event;
  // The latest recorded checkpoint (loaded from the store on first need),
  // which the next one is priced against.
  std::optional<tally::v1::Checkpoint> last_checkpoint;
  // MoE routing collapse (metrics::AssessMoeLayer) at the latest progress,
  // and where (the streak is in rec's routing).
  bool routing_collapsed = false;
  std::string collapse_where;
  // The latest progress of the current attempt (steps and tokens only go
  // forward within an attempt): its number, step and tokens.
  int32_t progress_attempt = 0;
  int64_t progress_step = -1;
  int64_t progress_tokens = -1;
  int progress_reports = 0;  // of progress_attempt, taken
  // "WORKER attempt N": the going-away notice this job's events recorded
  // (once committed); a notice sent again records nothing more.
  std::string notice_recorded;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_ACTIVE_JOB_H_
