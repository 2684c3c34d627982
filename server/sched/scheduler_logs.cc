// Scheduler: the log batches of workers (what attempts printed). A batch is
// checked, committed to the store in one transaction (lines, and the drop of
// the job's oldest past logs_keep_bytes), and only then acted on: counted in
// /metrics and the job's log watchers woken.
#include "common/names.h"
#include "server/logs/log_retention.h"
#include "server/sched/log_report_checks.h"
#include "server/sched/scheduler.h"

namespace tally::sched {

absl::Status Scheduler::HandleLogs(const std::string& worker_id,
                                   const tally::v1::LogBatch& batch) {
  // Refused batches are dropped (acknowledged, never sent again) and
  // counted; the worker's stream goes on, so its other reports still flow.
  if (!CheckLogBatch(batch).ok()) {
    metrics_.OnReportRefused("logs_invalid");
    return absl::OkStatus();
  }
  // Only the worker running the attempt writes its lines. Lines of an
  // attempt tallyd no longer runs (a worker's buffer sent on a late
  // reconnect) are dropped: nothing vouches for them now.
  ActiveJob* job = CurrentAttempt(batch.job(), batch.attempt());
  if (job == nullptr || !Holds(*job, worker_id)) {
    metrics_.OnReportRefused("logs");
    return absl::OkStatus();
  }
  const std::vector<tally::v1::LogLine> lines = logs::LinesOfBatch(batch);
  if (lines.empty()) return absl::OkStatus();
  absl::StatusOr<logs::AppendResult> r =
      store_->AppendJobLogs(job->rec.id(), lines, options_.logs_keep_bytes);
  if (absl::IsUnimplemented(r.status())) {
    metrics_.OnReportRefused("logs");  // a store that keeps no logs
    return absl::OkStatus();
  }
  if (!r.ok()) return r.status();  // not acknowledged: the worker sends it again
  log_metrics_.OnStored(lines, r->dropped_bytes);
  log_notifier_.Notify();
  return absl::OkStatus();
}

}  // namespace tally::sched
