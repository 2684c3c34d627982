// Scheduler: tallyd's single-threaded core. It owns the lifecycle of jobs and
// attempts, the registry of connected workers, and the decisions of when a
// job starts, where, and when an attempt is lost. It owns no threads and does
// no network I/O: Tick() does one pass and the caller owns the loop; workers
// are reached through the WorkerChannel it is given.
//
// Thread-safety: not thread-safe. The API layer serialises every call.
//
// Lifecycle: QUEUED -> RUNNING -> {SUCCEEDED | EARLY_STOPPED |
// BUDGET_EXHAUSTED | CANCELLED | FAILED}. Every transition is one
// JobStore::Commit with its event. A worker silent for longer than
// heartbeat_timeout loses its attempts: each job goes back to QUEUED as a new
// attempt (resuming from its latest checkpoint) until max_attempts, then
// FAILED with the reason.
//
// Policies (server/policy, pure) decide, the scheduler acts: every
// evaluation goes through the early-stopping rules, and a stop becomes a stop
// order and EARLY_STOPPED. Cost accrues on the clock while an attempt runs
// (gpu_count x the price of its GPU type); a job reaching
// budget.max_dollars is stopped BUDGET_EXHAUSTED at the next progress report
// or tick. Both states live in the job record, so they survive a restart.
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
#include "server/policy/cost.h"
#include "server/policy/early_stopping.h"
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
  policy::PriceTable prices;
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

  // Prices a spec (defaults applied, validated: INVALID_ARGUMENT naming the
  // field) at the current prices and the GPU type's throughput.
  absl::StatusOr<tally::v1::CostEstimate> EstimateCost(tally::v1::JobSpec spec) const;
  // The live record of a queued or running job, cost accrued to now; nullopt
  // for a job that has ended (read it from the store).
  std::optional<tally::v1::Job> ActiveJobView(int64_t job_id);
  // Replaces the price table (SIGHUP); running jobs accrue at the new prices
  // from now on.
  void SetPrices(policy::PriceTable prices);

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
    absl::Time accrued_until;  // cost is accrued up to here
    // The latest recorded checkpoint (loaded from the store on first need),
    // which the next one is priced against.
    std::optional<tally::v1::Checkpoint> last_checkpoint;
    // MoE routing collapse: the largest share of tokens one expert took in
    // any layer at the latest progress (the streak is in rec's routing).
    double max_expert_share = 0;
    std::string max_expert_where;
  };
  // Achieved model FLOP/s per GPU of finished jobs, by GPU type.
  struct Throughput {
    double flops = 0;
    double gpu_seconds = 0;
    int jobs = 0;
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
                            std::vector<std::string> rank_workers);
  // Ends the current attempt in `attempt_state`; requeues the job if it may
  // retry, else fails it.
  absl::Status EndAttempt(ActiveJob& job, store::AttemptState attempt_state,
                          const std::string& reason, bool may_retry);
  void Finish(int64_t job_id);  // drop a terminal job from active_
  // Orders every worker still holding the job's current attempt to stop it.
  void StopOtherRanks(ActiveJob& job, const std::string& reason);
  // host:port for a new multi-rank attempt led by `leader`: its advertised
  // port plus the first offset no attempt it leads now uses.
  std::string PickRendezvous(const std::string& leader) const;
  // Whether the worker advertises a rendezvous, so it may be a gang's rank 0.
  bool CanLead(const std::string& worker_id) const;
  void Stop(const std::string& worker_id, const std::string& job,
            int32_t attempt, const std::string& reason);
  absl::Status HandleExit(const std::string& worker_id,
                          const tally::v1::AttemptExit& exit);
  ActiveJob* CurrentAttempt(const std::string& job, int32_t attempt);
  void UpdateGauges();

  // The cost ledger and early stopping (job_policies.cc).
  // Accrues the job's cost up to `now` (nothing while it is not running).
  void Accrue(ActiveJob& job, absl::Time now);
  // Stops a job over its budget; true when it did.
  absl::StatusOr<bool> EnforceBudget(ActiveJob& job);
  // Ends a running or queued job in a terminal `state` on tallyd's decision:
  // stop orders to its workers, the attempt STOPPED, the job finished.
  absl::Status StopJob(ActiveJob& job, tally::v1::JobState state, const std::string& type,
                       const std::string& reason, const std::string& detail);
  absl::Status OnEval(ActiveJob& job, const tally::v1::EvalResult& eval);
  void PriceCheckpoint(ActiveJob& job, tally::v1::Checkpoint* ck);
  // Moves the running attempt's spend since its last checkpoint to lost_usd.
  void ChargeLostWork(ActiveJob& job);
  void UpdateJobMetrics(const ActiveJob& job);
  void RemoveJobMetrics(const tally::v1::Job& job);
  void RecordThroughput(const tally::v1::Job& job);
  double Flops(const tally::v1::Job& job) const;

  store::JobStore* const store_;
  WorkerChannel* const channel_;
  const Clock* const clock_;
  SchedulerOptions options_;
  std::map<std::string, Throughput> throughput_;
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
  // Per running job, removed when it ends; and totals.
  struct JobGauges {
    metrics::Family<metrics::Gauge>* step;
    metrics::Family<metrics::Gauge>* train_loss;
    metrics::Family<metrics::Gauge>* val_loss;
    metrics::Family<metrics::Gauge>* best_val_loss;
    metrics::Family<metrics::Gauge>* tokens;
    metrics::Family<metrics::Gauge>* useful_tokens_per_second;
    metrics::Family<metrics::Gauge>* padding_fraction;
    metrics::Family<metrics::Gauge>* cost;
    metrics::Family<metrics::Gauge>* checkpoint_cost;
    metrics::Family<metrics::Gauge>* patience_left;
    metrics::Family<metrics::Gauge>* budget_fraction;
    metrics::Family<metrics::Gauge>* fp8_overflows;
    metrics::Family<metrics::Gauge>* fp8_product_fraction;
    metrics::Family<metrics::Gauge>* fp8_amax;
    metrics::Family<metrics::Gauge>* moe_load;
    metrics::Family<metrics::Gauge>* moe_entropy;
    metrics::Family<metrics::Gauge>* moe_dropped;
    metrics::Family<metrics::Gauge>* moe_expert_tokens;
  } job_gauges_;
  // Series a job created with labels beyond {job}, removed when it ends.
  std::map<std::string, std::set<std::pair<metrics::Family<metrics::Gauge>*, metrics::Labels>>>
      job_series_;
  void SetJobSeries(const std::string& job, metrics::Family<metrics::Gauge>* family,
                    metrics::Labels labels, double value);
  void OnMoeProgress(ActiveJob& job, const tally::v1::Progress& p);
  metrics::Family<metrics::Counter>* cost_total_;
  metrics::Family<metrics::Counter>* lost_total_;
  metrics::Family<metrics::Counter>* early_stops_;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_SCHEDULER_H_
