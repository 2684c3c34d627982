// Scheduler: tallyd's single-threaded core. It owns the lifecycle of jobs and
// attempts, the registry of connected workers, and the decisions of when a
// job starts, where, and when an attempt is lost. It owns no threads and does
// no network I/O: Tick() does one pass and the caller owns the loop; workers
// are reached through the WorkerChannel it is given.
//
// Thread-safety: not thread-safe. The API layer serialises every call.
//
// Lifecycle: QUEUED -> RUNNING -> {SUCCEEDED | CANCELLED | FAILED | ...}.
// Every transition is one JobStore::Commit with its event. A worker silent
// for longer than heartbeat_timeout loses its attempts: each job goes back to
// QUEUED as a new attempt (resuming from its latest checkpoint) until
// max_attempts, then FAILED with the reason.
#ifndef TALLY_SERVER_SCHED_SCHEDULER_H_
#define TALLY_SERVER_SCHED_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/metrics/registry.h"
#include "server/store/job_store.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

// How the scheduler reaches a connected worker. Send must not block.
class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  virtual void Send(const std::string& worker_id,
                    const tally::v1::ControllerMessage& message) = 0;
};

struct SchedulerOptions {
  absl::Duration heartbeat_interval = absl::Seconds(2);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Progress reports become job events at most this often per job.
  absl::Duration progress_event_interval = absl::Seconds(1);
};

struct WorkerView {
  store::WorkerRecord record;
  bool connected = false;
  absl::Time last_seen;
  int used_slots = 0;
};

class Scheduler {
 public:
  // `store`, `channel`, `clock` and `registry` must outlive the scheduler.
  Scheduler(store::JobStore* store, WorkerChannel* channel, const Clock* clock,
            metrics::Registry* registry, SchedulerOptions options = {});

  // Loads unfinished jobs and their running attempts from the store. Workers
  // of running attempts are expected back within heartbeat_timeout.
  absl::Status Recover();

  // Jobs API. Submit applies defaults and validates (INVALID_ARGUMENT naming
  // the field); a repeated request_id returns the first job.
  absl::StatusOr<tally::v1::Job> Submit(tally::v1::JobSpec spec,
                                        const std::string& request_id);
  // FAILED_PRECONDITION when the job has already ended.
  absl::StatusOr<tally::v1::Job> Cancel(int64_t job_id, const std::string& reason);

  // Workers. OnHello starts (or restarts) a worker's session and returns its
  // generation; OnDisconnect with an older generation is ignored, so a stale
  // stream cannot take down a newer one.
  absl::StatusOr<int64_t> OnHello(const tally::v1::Hello& hello);
  absl::Status OnMessage(const std::string& worker_id,
                         const tally::v1::WorkerMessage& message);
  void OnDisconnect(const std::string& worker_id, int64_t generation);

  // One pass: expire silent workers, then start what fits.
  absl::Status Tick();

  std::vector<WorkerView> Workers() const;
  int64_t QueueDepth() const;

 private:
  struct ActiveJob {
    store::JobRecord rec;
    absl::Time queued_since;
    std::optional<store::AttemptRecord> attempt;  // when RUNNING
    absl::Time last_progress_event;
    bool progress_dirty = false;
    // The latest evaluation (step, val_loss): a worker reports the eval of a
    // step before that step's checkpoint, which records it.
    std::optional<std::pair<int64_t, double>> last_eval;
  };
  struct WorkerState {
    store::WorkerRecord rec;
    bool connected = false;
    int64_t generation = 0;
    absl::Time last_seen;
    // Ranks held per (job, attempt). A cancelled attempt holds its slots
    // until the worker reports its exit or goes silent.
    std::map<std::pair<int64_t, int32_t>, int> held;
    int Used() const;
  };

  tally::v1::JobEvent NewEvent(const ActiveJob& job, const std::string& type,
                               const std::string& reason,
                               const std::string& detail) const;
  // Appends an event to the job, updates its state, commits job + event +
  // (optionally) the attempt, in one transaction.
  absl::Status Record(ActiveJob& job, tally::v1::JobState state,
                      const std::string& type, const std::string& reason,
                      const std::string& detail, bool write_attempt);
  // Appends one event (sequence and state filled in) to the job, committed
  // with `m` and the job record; the job changes only if the commit does.
  absl::Status AppendEvent(ActiveJob& job, tally::v1::JobEvent e,
                           store::Mutation m);
  absl::Status StartAttempt(ActiveJob& job,
                            const std::vector<std::string>& rank_workers);
  // Ends the current attempt in `attempt_state`; requeues the job if it may
  // retry, else fails it.
  absl::Status EndAttempt(ActiveJob& job, store::AttemptState attempt_state,
                          const std::string& reason, bool may_retry);
  void Finish(int64_t job_id);  // drop a terminal job from active_
  void Release(int64_t job_id, int32_t attempt);  // free the slots it holds
  void Stop(const std::string& worker_id, const std::string& job,
            int32_t attempt, const std::string& reason);
  absl::Status HandleExit(const std::string& worker_id,
                          const tally::v1::AttemptExit& exit);
  ActiveJob* CurrentAttempt(const std::string& job, int32_t attempt);
  void UpdateGauges();

  store::JobStore* const store_;
  WorkerChannel* const channel_;
  const Clock* const clock_;
  const SchedulerOptions options_;
  std::map<int64_t, ActiveJob> active_;
  std::map<std::string, WorkerState> workers_;
  int64_t next_generation_ = 1;

  metrics::Histogram* queue_wait_;
  metrics::Gauge* queue_depth_;
  metrics::Family<metrics::Gauge>* workers_gauge_;
  metrics::Family<metrics::Gauge>* slots_gauge_;
  metrics::Family<metrics::Counter>* attempts_ended_;
  metrics::Family<metrics::Counter>* transitions_;
  std::set<metrics::Labels> seen_worker_labels_;
  std::set<metrics::Labels> seen_slot_labels_;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_SCHEDULER_H_
