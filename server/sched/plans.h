// The plans: free functions from a snapshot to a Plan (plan.h). Each starts
// from the job as committed (ActiveJob), reads only what it is given (the
// PlanContext: the decision's time, the stop grace, the price ledger and the
// worker registry; the job's recorded checkpoints where it needs them) and
// changes only the plan it returns. Nothing here reads the store or a clock,
// or changes the job, a worker or a metric: the scheduler commits the plan
// (Scheduler::Execute), then acts on it.
//
// Table-tested in plans_test.cc.
#ifndef TALLY_SERVER_SCHED_PLANS_H_
#define TALLY_SERVER_SCHED_PLANS_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/ledger/cost_ledger.h"
#include "server/sched/active_job.h"
#include "server/sched/eval_decision.h"
#include "server/sched/plan.h"
#include "server/sched/worker_registry.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

// What every plan reads besides the job. The pointers are not owned and
// must outlive the call.
struct PlanContext {
  absl::Time now;
  // How long a decided stop or preemption waits for the workers.
  absl::Duration stop_grace = absl::Minutes(2);
  const ledger::CostLedger* ledger = nullptr;
  const WorkerRegistry* workers = nullptr;
};

// The job's recorded checkpoints, oldest first (JobStore::ListCheckpoints).
// The plans that end an attempt read every one only for a job with a
// decided stop (PlanFinishStop names the best); otherwise only the latest
// (back()), so the scheduler may hand them just that one.
using Checkpoints = std::vector<tally::v1::Checkpoint>;

// A plan of no change yet: the job's record with its cost accrued to `now`.
Plan NewPlan(const PlanContext& ctx, const ActiveJob& job);
// Appends an event made from the plan's record; with `state`, the job
// enters it (state_reason and end_time follow).
void AddEvent(Plan& p, const std::string& type, const std::string& reason,
              const std::string& detail, std::optional<tally::v1::JobState> state = std::nullopt);
// An event an evaluation decided (eval_decision.h).
void AddEvent(Plan& p, const EvalEvent& e);
// Stop orders to the connected workers of the plan's attempt (but
// `except_worker`); the slots of a disconnected one are freed at once.
void StopOrders(const PlanContext& ctx, Plan& p, const std::string& reason, bool checkpoint,
                const std::string& except_worker = "", bool preempt = false);

// Ends a job at once in a terminal state on tallyd's decision.
Plan PlanStopNow(const PlanContext& ctx, const ActiveJob& job, tally::v1::JobState state,
                 const std::string& type, const std::string& reason, const std::string& detail);
// The job's current attempt succeeded (rank 0's exit from `worker_id`,
// which needs no stop order; other ranks still running get one): the job
// ends SUCCEEDED.
// A timing calibration's exit carries its times (checked by report_checks):
// they become the job's `calibration`.
Plan PlanSucceeded(const PlanContext& ctx, const ActiveJob& job, const std::string& worker_id,
                   const std::string& reason,
                   const google::protobuf::RepeatedPtrField<tally::v1::CalibratedStepTime>&
                       calibration = {});
// Ends a job with a pending stop as decided, naming its best checkpoint (the
// lowest recorded validation loss, else the latest).
Plan PlanFinishStop(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
                    const std::string& how,
                    store::AttemptState attempt_state = store::ATTEMPT_STATE_STOPPED);

// What else an ending attempt says about the job.
struct EndAttemptNotes {
  // Requeue without counting against max_attempts (at most
  // kMaxAttemptsNotCounted times per job; then it counts like any other).
  bool not_counted = false;
  // The recorded checkpoint the attempt found damaged (recorded on the
  // job, never resumed from again), and the one the next attempt resumes
  // from instead (none: it starts from step 0).
  std::optional<tally::v1::DamagedCheckpoint> damaged;
  std::optional<tally::v1::Checkpoint> resume_instead;
};
inline constexpr int32_t kMaxAttemptsNotCounted = 32;

// Ends the current attempt in `attempt_state`; requeues the job if it may
// retry, else fails it. A job with a pending stop ends as decided instead.
Plan PlanEndAttempt(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
                    store::AttemptState attempt_state, const std::string& reason, bool may_retry,
                    const EndAttemptNotes& notes = {});
// Ends the current attempt as preempted (`cause`: sigterm, sigint,
// notice_file, priority, experiment or unknown) at `step`: requeued at once
// without counting against max_attempts (or FAILED past max_preemptions),
// its spend since the latest checkpoint recorded as redone unless that
// checkpoint is of `step`. A job with a pending stop ends as decided.
Plan PlanPreempted(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
                   const std::string& cause, const std::string& reason, int64_t step);
// Orders a running job's attempt to checkpoint and stop for `for_job`.
Plan PlanPreempting(const PlanContext& ctx, const ActiveJob& job, const std::string& for_job,
                    const std::string& reason);
// An attempt whose worker was lost (silent, or back without it): preempted
// when the worker had sent a notice (`draining`, its cause) or the job was
// being preempted, else lost like any other.
Plan LoseAttempt(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
                 const std::string& draining, const std::string& reason);
// The cause of a PREEMPTED exit that does not name one: a pending
// preemption's, a draining worker's of the attempt, else "unknown".
std::string PreemptionCause(const PlanContext& ctx, const ActiveJob& job,
                            const tally::v1::AttemptExit& exit);

// The recorded checkpoint an attempt resumes from: the newest one no
// worker has found damaged (nullopt: start from step 0).
std::optional<tally::v1::Checkpoint> ResumePoint(const tally::v1::Job& job,
                                                 const Checkpoints& checkpoints);
// For an exit naming a damaged checkpoint: the checkpoint struck out and
// where the next attempt resumes. Names anything but the checkpoint the
// attempt resumed from: no notes (the exit is a plain failure).
EndAttemptNotes DamagedCheckpointNotes(const ActiveJob& job, const Checkpoints& checkpoints,
                                       const tally::v1::AttemptExit& exit);
// host:port for a new multi-rank attempt led by `leader`: the first of its
// announced ports not in `in_use` (the rendezvous of attempts it leads);
// empty when it announced none.
std::string PickRendezvous(const WorkerRegistry& workers, const std::string& leader,
                           const std::set<std::string>& in_use);
// Starts a new attempt on `rank_workers` (a worker that can lead becomes
// rank 0), resuming from ResumePoint; `rendezvous_in_use` as for
// PickRendezvous.
Plan PlanStart(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
               std::vector<std::string> rank_workers,
               const std::set<std::string>& rendezvous_in_use);

// The evaluation's outcome (DecideEval) as a plan: the job after it, its
// events and a decided stop.
Plan PlanEval(const PlanContext& ctx, const ActiveJob& job, const tally::v1::EvalResult& eval);
// Records a decided stop that waits for the workers' final checkpoint.
void PendingStopFor(const PlanContext& ctx, Plan& p, tally::v1::JobState state,
                    const std::string& type, const std::string& reason, const std::string& rule,
                    const tally::v1::EvalResult& ev);
// The checkpoint recorded and priced against `previous` (the job's latest).
Plan PlanCheckpoint(const PlanContext& ctx, const ActiveJob& job,
                    const tally::v1::CheckpointRecord& c,
                    const std::optional<tally::v1::Checkpoint>& previous);

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_PLANS_H_
