// Scheduler: tallyd's single-threaded core. It owns the lifecycle of jobs and
// attempts, the registry of connected workers, and the decisions of when a
// job starts, where, and when an attempt is lost. It owns no threads and does
// no network I/O: Tick() does one pass and the caller owns the loop; workers
// are reached through the WorkerChannel it is given.
//
// Thread-safety: not thread-safe. The API layer serialises every call.
//
// Lifecycle: QUEUED -> RUNNING -> {SUCCEEDED | EARLY_STOPPED |
// BUDGET_EXHAUSTED | CANCELLED | FAILED}. A worker silent for longer than
// heartbeat_timeout loses its attempts: each job goes back to QUEUED as a new
// attempt (resuming from its latest checkpoint) until max_attempts, then
// FAILED with the reason.
//
// Decide, commit, act. Every state change goes one way: pure code builds a
// Plan (the job's new record, its events, attempt and checkpoint records,
// the messages for workers, the metric deltas); the store commits the
// record, events, attempts and checkpoints in one transaction; only then is
// the plan acted on: the in-memory state replaced, messages sent, counters
// moved, observers (watchers, per-job metrics) told. A failed commit leaves
// memory, workers and metrics as they were, and the call returns the error.
// Measurements are not state: the counters of computed tokens and of FP8
// values cast and clamped move when a progress report arrives, and a worker
// silent past the heartbeat timeout counts as lost
// (tally_workers_lost_total) when it is found so; one that sent a notice and
// whose stream then ended holding nothing left cleanly
// (tally_worker_exits_total{cause}), and is not counted as lost.
//
// Stops. A cancel or a spent budget ends the job at once. A stop decided by
// an evaluation (early stopping) keeps the state that evaluation measured:
// the decision is committed as the job's pending_stop, the workers are told
// to stop with a checkpoint, every checkpoint they report before their exit
// is recorded, and the job ends (naming its best checkpoint) when rank 0's
// exit arrives, its worker is lost, or options.stop_grace passes.
//
// Preemption. A preempted attempt is not a failure: it does not count
// against max_attempts (spec.max_preemptions bounds them instead), the job
// requeues at once and resumes from its latest checkpoint, and what the
// attempt spent after that checkpoint is recorded as redone dollars (none
// when its notice checkpoint landed). A worker that sends a Notice (SIGTERM,
// a notice file) is draining: nothing more is placed on it, and its attempts
// exit PREEMPTED after checkpointing. A queued job that cannot be placed may
// preempt running attempts of lower priority (server/policy/preemption.h):
// the decision is committed on each victim as a pending preemption, the
// victims' workers are told to checkpoint and stop, and the victims requeue
// when their exits arrive (or at stop_grace). While a job waits for slots
// its preemptions free, no job of lower priority starts on its GPU type.
//
// Money is the CostLedger's (server/ledger): it returns values, the plans
// carry them. Reads (ActiveJobView) compute a view with cost accrued to now
// and write nothing.
#ifndef TALLY_SERVER_SCHED_SCHEDULER_H_
#define TALLY_SERVER_SCHED_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/ledger/cost_ledger.h"
#include "server/ledger/tenant_quota.h"
#include "server/metrics/job_metrics.h"
#include "server/logs/log_metrics.h"
#include "server/logs/log_notifier.h"
#include "server/metrics/registry.h"
#include "server/policy/forecast.h"
#include "server/policy/placement.h"
#include "server/policy/target.h"
#include "server/sched/active_job.h"
#include "server/sched/eval_decision.h"
#include "server/sched/observer.h"
#include "server/sched/plan.h"
#include "server/sched/plans.h"
#include "server/sched/report_checks.h"
#include "server/sched/sched_metrics.h"
#include "server/sched/worker_channel.h"
#include "server/sched/worker_registry.h"
#include "server/store/job_store.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

struct SchedulerOptions {
  absl::Duration heartbeat_interval = absl::Seconds(2);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // Progress reports become job events at most this often per job.
  absl::Duration progress_event_interval = absl::Seconds(1);
  // How long a stop decided by an evaluation waits for the workers' final
  // checkpoint and exit before the job ends without them.
  absl::Duration stop_grace = absl::Minutes(2);
  ledger::PriceTable prices;
  // Per-tenant limits (tallyd's --config tenants:).
  ledger::TenantQuotas quotas;
  // Per-job series: retention after the end, info labels, MoE series cap.
  metrics::JobMetricsOptions job_metrics;
  // Priority preemption: whether a waiting job may preempt lower-priority
  // attempts, and how long an attempt must have run before it may be.
  bool priority_preemption = true;
  absl::Duration min_runtime_before_preemption = absl::Minutes(10);
  // Whether a waiting job may preempt another tenant's attempts (tallyd's
  // --config tenancy.cross_tenant_preemption); by default only its own
  // tenant's. A victim of another tenant's job is told "a higher-priority
  // job", never its name.
  bool cross_tenant_preemption = false;
  // Group commit (tallyd --group_commit, read by api::Core): a submit's
  // store write happens outside the API lock (PrepareSubmit, the store's
  // CreateJob, ActOnSubmit), so concurrent submits share the store's
  // batched commits. false: Submit under the lock, one transaction each.
  bool group_commit = true;
  // Where workers write checkpoints (tallyd's config checkpoint_root: the
  // workers' --checkpoint_dir as they resolve it): a reported checkpoint
  // outside ROOT/job-N/ is refused. Empty: any absolute path in the job's
  // folder (report_checks.h CheckCheckpointPath).
  std::string checkpoint_root;
  // Each job keeps its newest log output up to this many bytes (tallyd's
  // --config logs.keep_mib); older lines give way to a marker.
  int64_t logs_keep_bytes = int64_t{4} << 20;
};

// Who asks for a change: a principal's name and tenant (empty when tallyd
// runs without authentication, or for tallyd's own decisions).
struct Actor {
  std::string name;
  std::string tenant;
};

class Scheduler {
 public:
  // `store`, `channel`, `clock` and `registry` must outlive the scheduler.
  Scheduler(store::JobStore* store, WorkerChannel* channel, const Clock* clock,
            metrics::Registry* registry, SchedulerOptions options = {});
  ~Scheduler();

  // Loads unfinished jobs and their running attempts from the store. Workers
  // of running attempts are expected back within heartbeat_timeout.
  absl::Status Recover();

  // Jobs API. Submit applies defaults and validates (INVALID_ARGUMENT naming
  // the field); a repeated request_id (of the same tenant) returns the first
  // job. The job belongs to `by`'s tenant and names `by` as its submitter.
  absl::StatusOr<tally::v1::Job> Submit(tally::v1::JobSpec spec,
                                        const std::string& request_id,
                                        const Actor& by = {});
  // Submit in three steps, for a caller that writes to the store without
  // holding its lock (group commit): decide under the lock (PrepareSubmit),
  // store->CreateJob(rec, first) without it, act under it (ActOnSubmit).
  // Submit is the three in one.
  struct PreparedSubmit {
    store::JobRecord rec;
    tally::v1::JobEvent first;
    absl::Time now;
  };
  // Decide: applies defaults and validates (INVALID_ARGUMENT naming the
  // field), checks the tenant's dollar quota (RESOURCE_EXHAUSTED) and builds
  // the record and its first event. Changes nothing. A submit spends
  // nothing, so submits decided at once cannot together overrun a quota:
  // nothing needs reserving.
  absl::StatusOr<PreparedSubmit> PrepareSubmit(tally::v1::JobSpec spec,
                                               const std::string& request_id,
                                               const Actor& by) const;
  // Act, once the store has committed `created`: a created job joins the
  // queue, the counters and observers hear of it; a request_id the store
  // resolved to an existing job changes nothing. Returns the job. Until
  // this runs, the committed job is in the store but not in the scheduler:
  // Cancel and the other changes of it answer UNAVAILABLE (retry), and
  // Tick does not place it; a restart in between recovers it from the
  // store like any queued job.
  tally::v1::Job ActOnSubmit(const PreparedSubmit& prepared,
                             const store::CreateResult& created);
  // FAILED_PRECONDITION when the job has already ended. `by` is recorded as
  // the job's cancelled_by and on the events.
  absl::StatusOr<tally::v1::Job> Cancel(int64_t job_id, const std::string& reason,
                                        const std::string& by = "");
  // Sets the target validation loss in force on a queued or running job
  // (experiments: a variant judged against another's final loss). From then
  // on the job stops at the target like one whose spec names it; if its
  // curve has already reached it, it stops now, keeping its latest state.
  // Setting the target already in force changes nothing. FAILED_PRECONDITION
  // when the job has ended; INVALID_ARGUMENT for a target that is not a
  // positive finite number.
  absl::StatusOr<tally::v1::Job> SetTarget(int64_t job_id, double target_val_loss,
                                           const std::string& why);
  // Stops a queued or running job on a decision made outside its own
  // policies (an experiment's halving or budget), ending it in `state` with
  // `rule` recorded as the stop rule. A running job that has been evaluated
  // keeps that state (a pending stop with a final checkpoint, like an early
  // stop); any other ends at once. FAILED_PRECONDITION when it has ended.
  absl::StatusOr<tally::v1::Job> StopJob(int64_t job_id, tally::v1::JobState state,
                                         const std::string& rule, const std::string& reason);
  // Holds a queued or running job out of placement (an experiment's
  // successive halving keeps a variant at a rung until every variant has
  // reached it): a running one is preempted first (it checkpoints and
  // requeues: not a failure, cause `experiment` when `holder` is an
  // experiment's name), and the held job is not placed again until
  // ReleaseJob. Job.hold says why. Holding a held job, or one stopping
  // already, changes nothing. FAILED_PRECONDITION when it has ended.
  absl::StatusOr<tally::v1::Job> HoldJob(int64_t job_id, const std::string& holder,
                                         const std::string& reason);
  // Makes a held job placeable again; a job not held is left as it is.
  absl::StatusOr<tally::v1::Job> ReleaseJob(int64_t job_id, const std::string& reason);

  // Workers. OnHello starts (or restarts) a worker's session and returns its
  // generation; OnDisconnect with an older generation is ignored, so a stale
  // stream cannot take down a newer one.
  absl::StatusOr<int64_t> OnHello(const tally::v1::Hello& hello);
  // INVALID_ARGUMENT naming the field of a Hello OnHello would refuse.
  static absl::Status ValidateHello(const tally::v1::Hello& hello);
  // Types a worker may announce: those tallyd's config names (prices,
  // throughputs, worker_gpu_types); with none named, any, up to
  // kMaxUnlistedGpuTypes distinct ones among the workers it knows.
  static constexpr int kMaxUnlistedGpuTypes = 16;
  // The worker is connected and was heard from within heartbeat_timeout.
  bool WorkerLive(const std::string& worker_id) const;
  // OK: the message is taken (committed, or dropped on purpose and counted);
  // INVALID_ARGUMENT: refused for good (a figure out of range, a message out
  // of protocol). The worker's stream acknowledges both (Ack), and ends on a
  // refusal. Any other error: not taken (a commit failed); it is not
  // acknowledged, the stream ends, and the worker sends it again on its next
  // stream, so every report is taken idempotently (RepeatedReport).
  absl::Status OnMessage(const std::string& worker_id,
                         const tally::v1::WorkerMessage& message);
  void OnDisconnect(const std::string& worker_id, int64_t generation);

  // One pass: expire silent workers, enforce budgets and stop deadlines,
  // then start what fits. Each job's change commits on its own: one failed
  // commit does not keep the others from happening; the first error is
  // returned and the failed change is retried on the next pass.
  absl::Status Tick();

  std::vector<WorkerView> Workers() const;
  int64_t QueueDepth() const;
  // Autoscaling demand, by GPU type (tally_gpus_wanted): the GPUs of queued
  // jobs that could run if workers existed, plus those of running attempts.
  // A queued job held back by something no worker fixes (its tenant at a
  // dollar quota, or past max_gpus in priority then submission order, as
  // Tick offers jobs) is left out. Every priced GPU type and every known
  // worker's appears, at 0 when nothing wants it.
  std::map<std::string, int64_t> GpusWanted() const;
  // Workers that could take work now and run nothing (tally_workers_idle):
  // connected, heard from within heartbeat_timeout, not draining, no slot
  // held; by GPU type.
  std::map<std::string, int64_t> IdleWorkers() const;

  // Prices a spec (defaults applied, validated: INVALID_ARGUMENT naming the
  // field) at the current prices and the GPU type's throughput.
  absl::StatusOr<tally::v1::CostEstimate> EstimateCost(tally::v1::JobSpec spec) const;
  // A view of a queued or running job, cost accrued to now (nothing is
  // written); nullopt for a job that has ended (read it from the store).
  std::optional<tally::v1::Job> ActiveJobView(int64_t job_id) const;
  // Replaces the price table (SIGHUP): what ran so far is committed at the
  // old prices first. When any of those commits fails the old prices stay
  // (the error names the job): new prices never apply to time that ran
  // under the old ones.
  absl::Status SetPrices(ledger::PriceTable prices);
  // Replaces the tenants' quotas (SIGHUP); in force from the next decision.
  void SetQuotas(ledger::TenantQuotas quotas);
  // RESOURCE_EXHAUSTED, with the figures, when `tenant` has spent its
  // dollar quota over a day or a month (Submit refuses new work then).
  absl::Status CheckTenantQuota(const std::string& tenant) const;

  // `observer` is told of every committed job change from now on; it must
  // outlive the scheduler (or be there until its last call).
  void AddObserver(CommitObserver* observer) { observers_.push_back(observer); }
  // Moves after every committed log batch (WatchJobLogs waits on it).
  // Thread-safe: may be used without the scheduler's lock.
  logs::LogNotifier* log_notifier() { return &log_notifier_; }

 private:
  // The queued jobs, as placement takes them.
  std::vector<policy::QueuedJob> QueuedJobs() const;
  // Of `queued`, those offered to placement under the tenants' quotas
  // (config's tenants: a dollar cap reached, or max_gpus in priority, then
  // submission, order); `held` (may be null) gets the others with why they
  // wait. Without quotas: `queued` as it is.
  std::vector<policy::QueuedJob> OfferUnderQuotas(
      std::vector<policy::QueuedJob> queued, absl::Time now,
      std::vector<std::pair<int64_t, std::string>>* held) const;
  using AttemptKey = sched::AttemptKey;  // (job id, attempt)

  using ActiveJob = sched::ActiveJob;

  // --- Decide: the plans are free functions (plans.h); these give them
  // their snapshot.
  PlanContext Ctx(absl::Time now) const;
  PlanContext Ctx() const { return Ctx(clock_->Now()); }
  // The job's recorded checkpoints (the store's), for the plans that read
  // them.
  absl::StatusOr<Checkpoints> CheckpointsOf(const ActiveJob& job) const;
  // The checkpoints a plan that ends the current attempt reads: every one
  // when the job has a decided stop (its best is named), else only the
  // latest (kept in memory once read), which a preemption prices its redone
  // spend against. An attempt's end reads the store no more than that.
  absl::StatusOr<Checkpoints> EndingCheckpoints(const ActiveJob& job) const;
  // A plan that ends the current attempt (PlanEndAttempt, PlanPreempted,
  // LoseAttempt, PlanFinishStop): `plan(EndingCheckpoints(job))`, or the
  // store's error reading them.
  template <typename F>
  absl::StatusOr<Plan> WithCheckpoints(const ActiveJob& job, F plan) const {
    return Call(EndingCheckpoints(job), plan);
  }
  // A plan that reads every recorded checkpoint (a start's resume point, a
  // damage claim): `plan(CheckpointsOf(job))`.
  template <typename F>
  absl::StatusOr<Plan> WithAllCheckpoints(const ActiveJob& job, F plan) const {
    return Call(CheckpointsOf(job), plan);
  }
  template <typename F>
  static absl::StatusOr<Plan> Call(const absl::StatusOr<Checkpoints>& checkpoints, F plan) {
    if (!checkpoints.ok()) return checkpoints.status();
    return plan(*checkpoints);
  }
  // The rendezvous addresses of running multi-rank attempts.
  std::set<std::string> RendezvousInUse() const;
  // The job's latest recorded checkpoint (the store's, until the job has
  // one in memory), or nullopt when it has none.
  absl::StatusOr<std::optional<tally::v1::Checkpoint>> LatestCheckpoint(const ActiveJob& job) const;

  // Tick's passes; each returns the first error of the changes it
  // committed one by one. Workers silent past the heartbeat timeout lose
  // what they hold.
  absl::Status LoseSilentWorkers(absl::Time now);
  // Budgets, tenants' dollar quotas, and the deadlines of decided stops and
  // preemptions, on a view of each running job's cost.
  absl::Status EnforceBudgetsAndDeadlines(absl::Time now);
  // Places what fits (under the tenants' quotas), then lets what still
  // waits preempt.
  absl::Status StartWhatFits(absl::Time now);
  // Removes from `queued` the jobs of lower priority than one waiting for
  // the slots its preemptions free, on the same GPU type (they would take
  // those slots first).
  void DropBehindAwaiting(std::vector<policy::QueuedJob>& queued);
  // The preemption pass of Tick: queued jobs still waiting may preempt.
  void PreemptForWaiting(const std::vector<policy::QueuedJob>& waiting, absl::Time now,
                         const std::function<void(const absl::Status&)>& note);
  // --- Commit, then act. On a failed commit nothing changes.
  absl::Status Execute(int64_t job_id, Plan plan);

  absl::Status HandleExit(const std::string& worker_id, const tally::v1::AttemptExit& exit);
  // A checkpoint report of the job's current attempt: recorded once (a
  // repeated one is counted), or the attempt fails when its path is not the
  // job's own file.
  absl::Status HandleCheckpoint(ActiveJob& job, const tally::v1::CheckpointRecord& c);
  // A worker's going-away notice: it takes no new work, and each job it runs
  // records a "notice" event once.
  absl::Status HandleNotice(const std::string& worker_id, WorkerState& sender,
                            const tally::v1::Notice& notice);
  // Retries the worker's exits whose commit failed; the first error.
  absl::Status RetryExits(const std::string& worker_id);
  absl::Status HandleProgress(ActiveJob& job, const tally::v1::Progress& p);
  // A worker's log batch (scheduler_logs.cc): checked, stored, then its
  // watchers woken; a refused one is counted and dropped.
  absl::Status HandleLogs(const std::string& worker_id, const tally::v1::LogBatch& batch);
  ActiveJob* CurrentAttempt(const std::string& job, int32_t attempt);
  // FAILED_PRECONDITION for a job that has ended ("...; only QUEUED or
  // RUNNING jobs can <what>"), UNAVAILABLE for one committed by a submit
  // that has not reached ActOnSubmit yet, or the store's error reading it.
  absl::Status EndedError(int64_t job_id, absl::string_view what) const;
  // Whether `worker_id` runs one of the ranks of the job's current attempt:
  // only those workers may report on it.
  static bool Holds(const ActiveJob& job, const std::string& worker_id);
  // A Hello's reconciliation; each returns the first failed commit. The
  // attempts tallyd placed on the worker that its Hello does not list are
  // lost (preempted when it had sent a notice: `was_draining`, its cause).
  absl::Status LoseForgotten(const tally::v1::Hello& hello, const std::string& was_draining);
  // The attempts it lists that tallyd still runs there are adopted (their
  // decided stops and preemptions ordered again); the others are stale:
  // told to stop, their ranks held until their exits arrive.
  absl::Status AdoptRunning(const tally::v1::Hello& hello, absl::Time now);
  void SendStop(const std::string& worker_id, const std::string& job, int32_t attempt,
                const std::string& reason);
  // GPUs held by each tenant's running jobs.
  std::map<std::string, int64_t> TenantGpusInUse() const;
  // The gauges of SchedMetrics, from the state now.
  void UpdateGauges();

  std::vector<CommitObserver*> observers_;
  store::JobStore* const store_;
  WorkerChannel* const channel_;
  const Clock* const clock_;
  SchedulerOptions options_;
  // When the store refused writes (a commit, a worker's record): from a
  // failed write to the next one that succeeds. No worker is counted silent
  // for that time (LoseSilentWorkers). The latest 64 outages are kept.
  std::deque<std::pair<absl::Time, absl::Time>> store_down_;
  absl::Time store_down_since_ = absl::InfiniteFuture();  // open outage
  absl::Time store_last_failure_ = absl::InfinitePast();
  // GPU types workers have announced since tallyd started (their series
  // stay): bounded when tallyd's config names none (OnHello).
  std::set<std::string> gpu_types_seen_;
  void NoteStoreFailure(const absl::Status& s);
  void NoteStoreSuccess();
  absl::Duration StoreDownBetween(absl::Time from, absl::Time to) const;
  // tally-worker's longest wait between connections (AgentOptions::
  // max_backoff): after an outage, silence resumes that much later.
  static constexpr absl::Duration kReconnectAllowance = absl::Seconds(5);
  ledger::CostLedger ledger_;
  ledger::TenantSpend spend_;  // committed dollars per tenant and hour
  absl::Time last_housekeeping_ = absl::InfinitePast();
  std::map<int64_t, ActiveJob> active_;
  WorkerRegistry workers_;

  SchedMetrics metrics_;
  logs::LogMetrics log_metrics_;
  logs::LogNotifier log_notifier_;
  // A waiting job's claim on the slots its preemptions free: the (worker,
  // attempt) holds of its victims, until each is released (a gang's ranks
  // exit one by one) or the job leaves the queue. In memory only: after a
  // restart the victims' pending preemptions stand in for it.
  std::map<int64_t, std::set<std::pair<std::string, AttemptKey>>> reserved_;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_SCHEDULER_H_
