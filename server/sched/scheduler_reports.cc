// Scheduler: the reports of workers (progress, evaluations, checkpoints,
// notices, exits).
#include "server/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/names.h"
#include "common/proto_time.h"
#include "common/spec_validation.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "server/policy/forecast.h"
#include "server/policy/placement.h"
#include "server/policy/preemption.h"
#include "server/policy/step_times.h"
#include "server/policy/stop_rules.h"
#include "server/policy/target.h"
#include "server/sched/eval_decision.h"
#include "server/sched/progress_reading.h"
#include "server/sched/report_checks.h"

namespace tally::sched {
namespace {

using tally::v1::JobState;

}  // namespace

bool Scheduler::Holds(const ActiveJob& job, const std::string& worker_id) {
  if (!job.attempt) return false;
  for (const auto& w : job.attempt->worker_ids()) {
    if (w == worker_id) return true;
  }
  return false;
}

Scheduler::ActiveJob* Scheduler::CurrentAttempt(const std::string& job, int32_t attempt) {
  absl::StatusOr<int64_t> id = ParseJobName(job, "job");
  if (!id.ok()) return nullptr;
  auto it = active_.find(*id);
  if (it == active_.end() || !it->second.attempt || it->second.attempt->attempt() != attempt) {
    return nullptr;
  }
  return &it->second;
}

absl::Status Scheduler::HandleProgress(ActiveJob& job, const tally::v1::Progress& p) {
  const absl::Time now = clock_->Now();
  // The report's numbers are measurements: they go into the in-memory record
  // at once and reach the store with the job's next commit.
  const ProgressReading reading = ReadProgress(job, p);
  ApplyProgressReading(reading, job);
  tally::v1::Job& j = *job.rec.mutable_job();
  metrics_.jobs().OnProgress(j, p, reading.moe);
  const int64_t id = job.rec.id();
  const tally::v1::CostStatus accrued = ledger_.Accrue(j, true, now).cost;
  // A decided stop is not undone by the budget: stop_grace bounds its spend.
  std::optional<ledger::BudgetStop> stop;
  if (!j.has_pending_stop()) stop = ledger_.CheckBudget(j, accrued);
  if (stop) {
    return Execute(id, PlanStopNow(Ctx(), job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED,
                                   "budget_exhausted", stop->reason, stop->detail));
  }
  // The tenant's dollar quota, with this job's spend not yet committed.
  if (!j.has_pending_stop()) {
    if (std::optional<ledger::QuotaStop> q =
            ledger::CheckDollarQuota(j.tenant(), options_.quotas, spend_, now,
                                     accrued.cost_usd() - j.cost().cost_usd())) {
      Plan plan = PlanStopNow(Ctx(), job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, "budget_exhausted",
                              q->reason, q->detail);
      plan.end_rule = policy::rules::kTenantQuota;
      return Execute(id, std::move(plan));
    }
  }
  if (!p.fp8_grouped_off().empty() && j.fp8_grouped_off_attempt() != p.attempt()) {
    // Once per attempt: the worker's products got slower, not wrong.
    Plan plan = NewPlan(Ctx(now), job);
    plan.rec.mutable_job()->set_fp8_grouped_off_attempt(p.attempt());
    AddEvent(plan, "warning",
             absl::StrCat("FP8 grouped expert products turned off for attempt ", p.attempt(),
                          ": ", QuoteForMessage(p.fp8_grouped_off(), 512)),
             "the experts run one by one in FP8 (same results, slower); the reason names "
             "what refused them (the worker's GPU, CUDA or PyTorch)");
    return Execute(id, std::move(plan));
  }
  if (now - job.last_progress_event < options_.progress_event_interval) {
    metrics_.jobs().Update(j, accrued);
    return absl::OkStatus();
  }
  Plan plan = NewPlan(Ctx(now), job);
  const std::string detail =
      p.trained() ? absl::StrCat("lr ", p.lr(), ", grad_norm ", p.grad_norm(), ", ",
                                 p.useful_tokens_per_second(), " useful tokens/s, padding ",
                                 p.padding_fraction())
                  : "no training was done (placeholder worker)";
  AddEvent(plan, "progress", "", detail);
  if (p.trained()) plan.events.back().set_train_loss(p.train_loss());
  plan.progress_event = true;
  return Execute(id, std::move(plan));
}


absl::Status Scheduler::OnMessage(const std::string& worker_id,
                                  const tally::v1::WorkerMessage& msg) {
  // std::map nodes: the pointer stays valid while workers are added.
  WorkerState* const sender = workers_.Find(worker_id);
  if (sender == nullptr || !sender->connected) {
    return absl::FailedPreconditionError("send a Hello before other messages");
  }
  sender->last_seen = clock_->Now();
  sender->counted_lost = false;
  // Log lines have their own checks and refusals (scheduler_logs.cc).
  if (msg.has_logs()) return HandleLogs(worker_id, msg.logs());

  // A report about an attempt tallyd no longer runs gets a stop order. Its
  // slots stay held until the worker reports the exit: the worker is still
  // busy with it (a cancelled attempt reporting its last step).
  // A report about a current attempt from a worker that does not run it
  // (another worker's attempt) moves nothing: it is dropped and counted.
  auto current = [&](const std::string& job, int32_t attempt, const char* kind) -> ActiveJob* {
    ActiveJob* a = CurrentAttempt(job, attempt);
    if (a == nullptr) {
      SendStop(worker_id, job, attempt, "stale attempt: tallyd no longer runs it");
      return nullptr;
    }
    if (!Holds(*a, worker_id)) {
      metrics_.OnReportRefused(kind);
      return nullptr;
    }
    return a;
  };

  // Every figure is checked before it reaches a record or a series; a
  // report out of range is counted and ends the worker's stream (it
  // reconnects; what it runs is adopted again).
  absl::Status valid = CheckReportCounts(msg);
  if (valid.ok()) valid = CheckReportFigures(msg);
  if (valid.ok()) {
    if (const auto [job, attempt] = ReportedAttempt(msg); !job.empty()) {
      if (const ActiveJob* a = CurrentAttempt(job, attempt); a != nullptr) {
        valid = CheckReportAgainstSpec(a->rec.job().spec(), msg);
      }
    }
  }
  if (!valid.ok()) {
    metrics_.OnReportRefused("invalid");
    return valid;
  }
  absl::Status s;
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kHeartbeat:
      return absl::OkStatus();
    case tally::v1::WorkerMessage::kProgress: {
      ActiveJob* job = current(msg.progress().job(), msg.progress().attempt(), "progress");
      if (job == nullptr) break;
      const tally::v1::Progress& p = msg.progress();
      // Sanity: within an attempt steps and tokens only go forward, and no
      // step is past max_steps. Anything else moves nothing and is counted.
      const bool same = job->progress_attempt == p.attempt();
      if (p.step() > job->rec.job().spec().training().max_steps() ||
          (same && (p.step() < job->progress_step || p.tokens() < job->progress_tokens))) {
        metrics_.OnReportRefused("progress_out_of_order");
        break;
      }
      const int64_t id = job->rec.id();
      s = HandleProgress(*job, p);
      // Kept once the report was taken (its plan, if any, committed).
      if (auto it = active_.find(id); s.ok() && it != active_.end()) {
        it->second.progress_reports = same ? it->second.progress_reports + 1 : 1;
        it->second.progress_attempt = p.attempt();
        it->second.progress_step = p.step();
        it->second.progress_tokens = p.tokens();
      }
      break;
    }
    case tally::v1::WorkerMessage::kEval: {
      ActiveJob* job = current(msg.eval().job(), msg.eval().attempt(), "eval");
      if (job == nullptr) break;
      if (RepeatedEval(job->rec.job(), msg.eval())) {
        metrics_.OnReportRefused("repeated");
        break;
      }
      s = Execute(job->rec.id(), PlanEval(Ctx(), *job, msg.eval()));
      break;
    }
    case tally::v1::WorkerMessage::kCheckpoint: {
      ActiveJob* job = current(msg.checkpoint().job(), msg.checkpoint().attempt(), "checkpoint");
      if (job != nullptr) s = HandleCheckpoint(*job, msg.checkpoint());
      break;
    }
    case tally::v1::WorkerMessage::kExit:
      s = HandleExit(worker_id, msg.exit());
      // The worker will not send it again: keep it and retry (each tick, and
      // before its next Hello is reconciled) until it commits.
      if (!s.ok()) sender->unconfirmed_exits.push_back(msg.exit());
      break;
    case tally::v1::WorkerMessage::kNotice:
      s = HandleNotice(worker_id, *sender, msg.notice());
      break;
    case tally::v1::WorkerMessage::kLogs:
      return absl::OkStatus();  // handled above
    case tally::v1::WorkerMessage::kHello:
      return absl::FailedPreconditionError("Hello was already sent on this stream");
    case tally::v1::WorkerMessage::MSG_NOT_SET:
      return absl::InvalidArgumentError("worker message: no field set");
  }
  // Slots change with exits; the tick refreshes the gauges otherwise.
  if (msg.has_exit()) UpdateGauges();
  return s;
}

absl::Status Scheduler::HandleCheckpoint(ActiveJob& job, const tally::v1::CheckpointRecord& c) {
  if (absl::Status where = CheckCheckpointPath(job.rec.job().name(), c.path(), c.step(),
                                               options_.checkpoint_root);
      !where.ok()) {
    // Never recorded, so never resumed from: the attempt fails saying why.
    const std::string reason = absl::StrCat("checkpoint record refused: ", where.message());
    absl::StatusOr<Plan> p = WithCheckpoints(job, [&](const Checkpoints& cks) {
      return PlanEndAttempt(Ctx(), job, cks, store::ATTEMPT_STATE_FAILED, reason,
                            /*may_retry=*/true);
    });
    absl::Status s = p.ok() ? Execute(job.rec.id(), *std::move(p)) : p.status();
    // Counted once the failure has committed, like every other effect.
    if (s.ok()) metrics_.OnReportRefused("checkpoint_path");
    return s;
  }
  // An error here fails the report: a checkpoint priced against the wrong
  // previous one would be stored wrong for good.
  ASSIGN_OR_RETURN(const std::optional<tally::v1::Checkpoint> latest, LatestCheckpoint(job));
  if (RepeatedCheckpoint(latest, c)) {
    metrics_.OnReportRefused("repeated");
    return absl::OkStatus();
  }
  return Execute(job.rec.id(), PlanCheckpoint(Ctx(), job, c, latest));
}

absl::Status Scheduler::HandleNotice(const std::string& worker_id, WorkerState& sender,
                                     const tally::v1::Notice& notice) {
  // The worker is going away: nothing new goes to it from now on (its own
  // word, not a decision to commit), and each job it runs says so once
  // (their attempts checkpoint and exit PREEMPTED). A failed commit is not
  // acknowledged: the notice comes again and records the events still
  // missing.
  sender.draining = notice.cause();
  auto recorded = [&](const ActiveJob& job) {
    return absl::StrCat(worker_id, " attempt ", job.rec.job().attempt());
  };
  std::vector<int64_t> ids;
  for (const auto& [id, job] : active_) {
    if (Holds(job, worker_id) && job.notice_recorded != recorded(job)) ids.push_back(id);
  }
  absl::Status first_error;
  for (int64_t id : ids) {
    Plan p = NewPlan(Ctx(), active_.at(id));
    AddEvent(p, "notice",
             absl::StrFormat("worker %s is going away (%s): the attempt checkpoints and stops "
                             "within %.0fs",
                             worker_id, notice.cause(), notice.deadline_seconds()),
             "");
    absl::Status e = Execute(id, std::move(p));
    if (auto it = active_.find(id); e.ok() && it != active_.end()) {
      it->second.notice_recorded = recorded(it->second);
    }
    if (!e.ok() && first_error.ok()) first_error = e;
  }
  UpdateGauges();
  return first_error;
}

absl::Status Scheduler::HandleExit(const std::string& worker_id,
                                   const tally::v1::AttemptExit& exit) {
  const AttemptKey key{ParseJobName(exit.job()).value_or(0), exit.attempt()};
  ActiveJob* job = CurrentAttempt(exit.job(), exit.attempt());
  // An exit frees one rank's slot: a worker may run several ranks of a gang.
  auto release_now = [&] {
    workers_.ReleaseOne(worker_id, key);
    return absl::OkStatus();
  };
  if (job == nullptr) return release_now();  // e.g. the exit of a cancelled attempt
  if (!Holds(*job, worker_id)) {
    // Another worker's attempt: its exit is not this worker's to report.
    metrics_.OnReportRefused("exit");
    return absl::OkStatus();
  }
  const bool gang = job->attempt->worker_ids_size() > 1;
  const bool pending = job->rec.job().has_pending_stop();
  const bool preempting = !job->rec.job().preemption().pending_for().empty();
  // Rank 0's exit ends a gang's attempt: the rank it claims, from the worker
  // that was given rank 0 (another worker's "rank 0" is not taken).
  const bool lead = exit.rank() == 0 && job->attempt->worker_ids(0) == worker_id;
  absl::StatusOr<Plan> plan = absl::UnknownError("no plan");
  bool refused_damage_claim = false;
  switch (exit.outcome()) {
    case tally::v1::ATTEMPT_OUTCOME_SUCCEEDED: {
      if (gang && exit.rank() != 0) {
        // Another rank is done; rank 0 ends the job once its own reports
        // (the last evaluation and checkpoint) are in.
        return release_now();
      }
      if (pending) {
        // Trained to the end before the stop arrived: the decision stands,
        // with whatever checkpoints it reported.
        plan = WithCheckpoints(*job, [&](const Checkpoints& cks) {
          return PlanFinishStop(Ctx(), *job, cks, "the attempt completed before the stop arrived",
                                store::ATTEMPT_STATE_SUCCEEDED);
        });
        break;
      }
      plan = PlanSucceeded(Ctx(), *job, worker_id, exit.reason(), exit.calibration());
      break;
    }
    case tally::v1::ATTEMPT_OUTCOME_FAILED: {
      if ((pending || preempting) && gang && !lead) return release_now();  // rank 0 ends it
      if (exit.not_started()) {
        // Refused before it ran (the worker was still stopping an attempt
        // tallyd had given up on, or is shutting down): nothing was tried.
        const std::string reason =
            absl::StrCat("worker ", worker_id, " did not start it: ", exit.reason());
        plan = WithCheckpoints(*job, [&](const Checkpoints& cks) {
          return PlanEndAttempt(Ctx(), *job, cks, store::ATTEMPT_STATE_FAILED, reason,
                                /*may_retry=*/true, {.not_counted = true});
        });
        break;
      }
      plan = WithAllCheckpoints(*job, [&](const Checkpoints& cks) {
        EndAttemptNotes notes;
        if (!exit.damaged_checkpoint().empty()) notes = DamagedCheckpointNotes(*job, cks, exit);
        // A claim about another checkpoint is refused (counted once the
        // failure commits) and the exit is a plain failure.
        refused_damage_claim = !exit.damaged_checkpoint().empty() && !notes.damaged;
        return PlanEndAttempt(Ctx(), *job, cks, store::ATTEMPT_STATE_FAILED, exit.reason(),
                              exit.retryable() || notes.damaged.has_value(), notes);
      });
      break;
    }
    case tally::v1::ATTEMPT_OUTCOME_PREEMPTED:
      // Rank 0 reports the preemption checkpoint before its exit: its exit
      // requeues the job (another rank's may come first).
      if (gang && !lead) return release_now();
      plan = WithCheckpoints(*job, [&](const Checkpoints& cks) {
        return PlanPreempted(Ctx(), *job, cks, PreemptionCause(Ctx(), *job, exit), exit.reason(),
                             exit.step());
      });
      break;
    default:
      if (pending) {
        // The stop it was asked for: rank 0 reports the final checkpoint
        // before its exit, so its exit ends the job.
        if (gang && exit.rank() != 0) return release_now();
        plan = WithCheckpoints(
            *job, [&](const Checkpoints& cks) { return PlanFinishStop(Ctx(), *job, cks, ""); });
        break;
      }
      if (preempting) {
        // Stopped on the preemption order (a worker that checkpointed it).
        if (gang && !lead) return release_now();
        plan = WithCheckpoints(*job, [&](const Checkpoints& cks) {
          return PlanPreempted(Ctx(), *job, cks, OrderedPreemptionCause(job->rec.job()),
                               exit.reason(), exit.step());
        });
        break;
      }
      plan = WithCheckpoints(*job, [&](const Checkpoints& cks) {
        return PlanEndAttempt(Ctx(), *job, cks, store::ATTEMPT_STATE_STOPPED,
                              absl::StrCat("worker ", worker_id, " stopped it: ", exit.reason()),
                              true);
      });
  }
  RETURN_IF_ERROR(plan.status());
  if (exit.step() > 0) plan->rec.mutable_job()->set_step(exit.step());
  plan->release_one.emplace_back(worker_id, key);
  // The exiting worker needs no stop order of its own, unless it runs other
  // ranks of the attempt too.
  const bool more_ranks_here = workers_.Held(worker_id, key) > 1;
  if (!more_ranks_here) {
    plan->sends.erase(std::remove_if(plan->sends.begin(), plan->sends.end(),
                                     [&](const auto& s) { return s.first == worker_id; }),
                      plan->sends.end());
  }
  RETURN_IF_ERROR(Execute(key.first, *std::move(plan)));
  if (refused_damage_claim) metrics_.OnReportRefused("damaged_checkpoint");
  return absl::OkStatus();
}

absl::Status Scheduler::RetryExits(const std::string& worker_id) {
  WorkerState* w = workers_.Find(worker_id);
  if (w == nullptr || w->unconfirmed_exits.empty()) return absl::OkStatus();
  std::vector<tally::v1::AttemptExit> exits;
  exits.swap(w->unconfirmed_exits);
  absl::Status first_error;
  for (const auto& e : exits) {
    absl::Status s = HandleExit(worker_id, e);
    if (!s.ok()) {
      workers_.Add(worker_id).unconfirmed_exits.push_back(e);
      if (first_error.ok()) first_error = s;
    }
  }
  return first_error;
}

}  // namespace tally::sched
