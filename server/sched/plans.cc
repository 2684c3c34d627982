#include "server/sched/plans.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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
#include "server/sched/report_checks.h"

namespace tally::sched {
namespace {

using tally::v1::JobState;

// A decided preemption no longer waits once the attempt has ended.
void ClearPendingPreemption(tally::v1::Job& j) {
  if (!j.has_preemption()) return;
  tally::v1::PreemptionStatus& ps = *j.mutable_preemption();
  ps.clear_pending_for();
  ps.clear_pending_reason();
  ps.clear_pending_deadline();
}

}  // namespace

Plan NewPlan(const PlanContext& ctx, const ActiveJob& job) {
  const absl::Time now = ctx.now;
  Plan p;
  p.job_id = job.rec.id();
  p.now = now;
  p.rec = job.rec;
  p.attempt = job.attempt;
  p.keep_attempt = job.attempt.has_value();
  const bool running =
      job.rec.job().state() == tally::v1::JOB_STATE_RUNNING && job.attempt.has_value();
  ledger::Accrual a = ctx.ledger->Accrue(job.rec.job(), running, now);
  *p.rec.mutable_job()->mutable_cost() = std::move(a.cost);
  p.cost_added_usd = a.added_usd;
  return p;
}

void AddEvent(Plan& p, const std::string& type, const std::string& reason,
              const std::string& detail, std::optional<JobState> state) {
  tally::v1::Job& j = *p.rec.mutable_job();
  if (state) {
    if (j.state() != *state) {
      j.set_state_reason(reason);
      p.transitions.push_back(*state);
    }
    j.set_state(*state);
    if (store::IsTerminal(*state)) *j.mutable_end_time() = ToProto(p.now);
  }
  j.set_last_event_sequence(j.last_event_sequence() + 1);
  tally::v1::JobEvent& e = p.events.emplace_back();
  e.set_job(j.name());
  e.set_sequence(j.last_event_sequence());
  *e.mutable_time() = ToProto(p.now);
  e.set_type(type);
  e.set_state(j.state());
  e.set_reason(reason);
  e.set_detail(detail);
  e.set_attempt(j.attempt());
  e.set_step(j.step());
  e.set_tokens(j.tokens());
  e.set_cost_usd(j.cost().cost_usd());
  e.set_patience_left(j.spec().early_stopping().patience() > 0
                          ? (j.early_stopping().evals() > 0 ? j.early_stopping().patience_left()
                                                            : j.spec().early_stopping().patience())
                          : -1);
}

void StopOrders(const PlanContext& ctx, Plan& p, const std::string& reason, bool checkpoint,
                const std::string& except_worker, bool preempt) {
  if (!p.attempt) return;
  const AttemptKey key{p.job_id, p.attempt->attempt()};
  std::set<std::string> workers(p.attempt->worker_ids().begin(), p.attempt->worker_ids().end());
  for (const auto& w : workers) {
    if (w == except_worker) continue;
    const WorkerState* ws = ctx.workers->Find(w);
    if (ws == nullptr) continue;
    if (ws->connected) {
      // Its slots stay held until it reports the exit, so nothing new is
      // placed on a worker still busy ending this attempt (a gang rank
      // leaving a collective, a rendezvous port still bound).
      p.sends.emplace_back(
          w, StopMessage(p.rec.job().name(), p.attempt->attempt(), reason, checkpoint, preempt));
    } else if (ws->held.count(key)) {
      p.release.emplace_back(w, key);  // nobody to confirm: free it now
    }
  }
}

Plan PlanStopNow(const PlanContext& ctx, const ActiveJob& job, JobState state,
                 const std::string& type, const std::string& reason, const std::string& detail) {
  Plan p = NewPlan(ctx, job);
  if (p.attempt) {
    p.attempt->set_state(store::ATTEMPT_STATE_STOPPED);
    *p.attempt->mutable_end_time() = ToProto(p.now);
    p.attempt->set_reason(reason);
    p.write_attempt = true;
    StopOrders(ctx, p, reason, /*checkpoint=*/false);
    p.attempts_ended.push_back("stopped");
  }
  p.rec.mutable_job()->clear_pending_stop();
  ClearPendingPreemption(*p.rec.mutable_job());
  AddEvent(p, type, reason, detail, state);
  p.keep_attempt = false;
  p.finished = true;
  return p;
}

Plan PlanSucceeded(const PlanContext& ctx, const ActiveJob& job, const std::string& worker_id,
                   const std::string& reason,
                   const google::protobuf::RepeatedPtrField<tally::v1::CalibratedStepTime>&
                       calibration) {
  Plan p = NewPlan(ctx, job);
  *p.rec.mutable_job()->mutable_calibration() = calibration;
  p.attempt->set_state(store::ATTEMPT_STATE_SUCCEEDED);
  *p.attempt->mutable_end_time() = ToProto(p.now);
  p.attempt->set_reason(reason);
  p.write_attempt = true;
  // The other ranks end the same step; any still running is told to stop.
  StopOrders(ctx, p, "the attempt succeeded", /*checkpoint=*/false, worker_id);
  p.attempts_ended.push_back("succeeded");
  p.rec.mutable_job()->clear_pending_stop();
  AddEvent(p, "succeeded", reason.empty() ? "completed" : reason, "",
           tally::v1::JOB_STATE_SUCCEEDED);
  p.keep_attempt = false;
  p.finished = true;
  return p;
}

Plan PlanFinishStop(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& cks,
                    const std::string& how, store::AttemptState attempt_state) {
  const tally::v1::PendingStop ps = job.rec.job().pending_stop();
  // The best checkpoint: the lowest recorded loss of the metric the job is
  // judged by, else the latest.
  const policy::LossMetric metric = MetricOf(job.rec.job());
  const tally::v1::Checkpoint* best = cks.empty() ? nullptr : &cks.back();
  auto loss = [metric](const tally::v1::Checkpoint& c) {
    const double l = policy::LossOf(metric, c);
    return l > 0 ? l : 0;  // 0 (or absent): not evaluated
  };
  for (const auto& c : cks) {
    if (loss(c) > 0 && (loss(*best) <= 0 || loss(c) < loss(*best))) best = &c;
  }
  Plan p = NewPlan(ctx, job);
  tally::v1::Job& j = *p.rec.mutable_job();
  if (attempt_state == store::ATTEMPT_STATE_LOST || attempt_state == store::ATTEMPT_STATE_FAILED) {
    // The attempt ended without confirming: its spend since the last
    // checkpoint kept nothing.
    ledger::Accrual lost = ctx.ledger->ChargeLost(j.cost());
    *j.mutable_cost() = std::move(lost.cost);
    p.lost_added_usd = lost.added_usd;
  }
  if (p.attempt) {
    p.attempt->set_state(attempt_state);
    *p.attempt->mutable_end_time() = ToProto(p.now);
    p.attempt->set_reason(how.empty() ? ps.reason() : how);
    p.write_attempt = true;
    StopOrders(ctx, p, ps.reason(), /*checkpoint=*/false);
    p.attempts_ended.push_back(Outcome(attempt_state));
  }
  std::string detail = "no checkpoint yet";
  if (best != nullptr) {
    j.mutable_early_stopping()->set_best_checkpoint(best->path());
    detail = absl::StrFormat("best checkpoint: step %d, val_loss %.4f", best->step(),
                             best->val_loss());
    if (best->has_quantized_val_loss()) {
      absl::StrAppendFormat(&detail, ", quantized_val_loss %.4f", best->quantized_val_loss());
    }
    absl::StrAppend(&detail, ", ", best->path());
  }
  if (!how.empty()) absl::StrAppend(&detail, " (", how, ")");
  p.end_rule = ps.rule();
  if (!ps.rule().empty() && ps.state() == tally::v1::JOB_STATE_EARLY_STOPPED) {
    j.mutable_early_stopping()->set_stop_rule(ps.rule());
    p.early_stop_rule = ps.rule();
  }
  j.clear_pending_stop();
  ClearPendingPreemption(j);
  AddEvent(p, ps.type(), ps.reason(), detail, ps.state());
  p.keep_attempt = false;
  p.finished = true;
  return p;
}

Plan PlanEndAttempt(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
                    store::AttemptState attempt_state, const std::string& reason, bool may_retry,
                    const EndAttemptNotes& notes) {
  if (job.rec.job().has_pending_stop()) {
    // The stop was decided; the attempt ending early does not undo it.
    return PlanFinishStop(ctx, job, checkpoints, absl::StrCat("the attempt ended: ", reason),
                          attempt_state);
  }
  Plan p = NewPlan(ctx, job);
  tally::v1::Job& j = *p.rec.mutable_job();
  ClearPendingPreemption(j);
  if (notes.damaged) {
    *j.add_damaged_checkpoints() = *notes.damaged;
    AddEvent(p, "checkpoint_damaged",
             absl::StrCat("the checkpoint at step ", notes.damaged->step(),
                          " is damaged: ", notes.damaged->reason()),
             notes.resume_instead
                 ? absl::StrCat("the next attempt resumes from step ", notes.resume_instead->step(),
                                " (", notes.resume_instead->path(), ")")
                 : "no intact checkpoint is left: the next attempt starts "
                   "from step 0");
  }
  // Not counted: tallyd's own doing (a slot it placed on too early), or a
  // damaged checkpoint with an intact one to fall back to. Bounded, so a
  // worker that refuses everything cannot requeue a job for ever.
  const bool not_counted =
      may_retry && notes.not_counted && j.attempts_not_counted() < kMaxAttemptsNotCounted;
  if (not_counted) j.set_attempts_not_counted(j.attempts_not_counted() + 1);
  // Preempted attempts do not count against max_attempts.
  const int32_t n = j.attempt() - j.preemption().count() - j.attempts_not_counted();
  const int32_t max = j.spec().max_attempts();
  ledger::Accrual lost = ctx.ledger->ChargeLost(j.cost());
  *j.mutable_cost() = std::move(lost.cost);
  p.lost_added_usd = lost.added_usd;
  if (p.attempt) {
    p.attempt->set_state(attempt_state);
    *p.attempt->mutable_end_time() = ToProto(p.now);
    p.attempt->set_reason(reason);
    p.write_attempt = true;
    // The other ranks of a gang cannot go on without this one.
    StopOrders(ctx, p, reason, /*checkpoint=*/false);
  }
  const char* outcome = Outcome(attempt_state);
  p.attempts_ended.push_back(outcome);
  p.keep_attempt = false;
  if (not_counted) {
    AddEvent(p, "requeued",
             absl::StrCat("attempt ", j.attempt(), " ", outcome, " (not counted): ", reason,
                          "; requeued, ", n, " of ", max, " attempts counted"),
             "", tally::v1::JOB_STATE_QUEUED);
    p.requeued = true;
    return p;
  }
  if (may_retry && n < max) {
    AddEvent(p, "requeued",
             absl::StrCat("attempt ", n, " ", outcome, ": ", reason, "; requeued for attempt ",
                          n + 1, " of ", max),
             "", tally::v1::JOB_STATE_QUEUED);
    p.requeued = true;
    return p;
  }
  const std::string why = may_retry
                              ? absl::StrCat("attempt ", n, " of ", max, " ", outcome, ": ", reason,
                                             "; no attempts left (max_attempts ", max, ")")
                              : absl::StrCat("attempt ", n, " ", outcome, ": ", reason);
  AddEvent(p, "failed", why, "", tally::v1::JOB_STATE_FAILED);
  p.finished = true;
  return p;
}

Plan PlanPreempted(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
                   const std::string& cause, const std::string& reason, int64_t step) {
  if (job.rec.job().has_pending_stop()) {
    // The stop was decided first: the job ends as decided, keeping what it has.
    return PlanFinishStop(ctx, job, checkpoints,
                          absl::StrCat("the attempt was preempted (", cause, "): ", reason),
                          store::ATTEMPT_STATE_PREEMPTED);
  }
  const std::optional<tally::v1::Checkpoint> last =
      checkpoints.empty() ? std::nullopt : std::optional<tally::v1::Checkpoint>(checkpoints.back());
  Plan p = NewPlan(ctx, job);
  tally::v1::Job& j = *p.rec.mutable_job();
  // Where the attempt got to: its exit's step, or its latest report (an
  // exit made at the worker's deadline may not know it).
  step = std::max(step, j.step());
  const bool kept = last.has_value() && last->step() >= step;
  ledger::Accrual redone = ctx.ledger->ChargeRedone(j.cost(), kept);
  *j.mutable_cost() = std::move(redone.cost);
  p.redone_added_usd = redone.added_usd;
  const std::string by = j.preemption().pending_for();
  ClearPendingPreemption(j);
  tally::v1::PreemptionStatus& ps = *j.mutable_preemption();
  ps.set_count(ps.count() + 1);
  if (cause == "experiment") {
    // An experiment's hold: neither another job's claim nor a notice.
    ps.set_by_experiment(ps.by_experiment() + 1);
  } else if (cause == "priority") {
    ps.set_by_priority(ps.by_priority() + 1);
    // Bounded: the cycle guard needs the jobs that preempted it lately.
    constexpr int kMaxPreemptedBy = 64;
    if (!by.empty() && std::find(ps.preempted_by().begin(), ps.preempted_by().end(), by) ==
                           ps.preempted_by().end()) {
      if (ps.preempted_by_size() >= kMaxPreemptedBy)
        ps.mutable_preempted_by()->DeleteSubrange(0, 1);
      ps.add_preempted_by(by);
    }
  } else {
    ps.set_by_notice(ps.by_notice() + 1);
  }
  if (p.attempt) {
    p.attempt->set_state(store::ATTEMPT_STATE_PREEMPTED);
    *p.attempt->mutable_end_time() = ToProto(p.now);
    p.attempt->set_reason(reason);
    p.attempt->set_preemption_cause(cause);
    p.write_attempt = true;
    // Other ranks still running end too (a gang stops as one).
    StopOrders(ctx, p, absl::StrCat("preempted: ", reason), /*checkpoint=*/false);
  }
  p.attempts_ended.push_back("preempted");
  p.preemption_cause = cause;
  p.keep_attempt = false;
  const std::string redo =
      kept ? absl::StrCat("nothing to redo: checkpoint at step ", last->step())
           : absl::StrFormat("$%.4f redone: steps %d-%d after %s", redone.added_usd,
                             last ? last->step() + 1 : 1, step,
                             last ? absl::StrCat("the checkpoint at step ", last->step())
                                  : std::string("the start (no checkpoint yet)"));
  // An experiment's holds are its own scheduling: they do not count.
  const int32_t max = j.spec().max_preemptions();
  const int32_t counted = ps.count() - ps.by_experiment();
  if (max > 0 && cause != "experiment" && counted > max) {
    AddEvent(p, "failed",
             absl::StrCat("attempt ", j.attempt(), " preempted (", cause, "): ", reason,
                          "; preempted ", counted, " times (max_preemptions ", max, ")"),
             redo, tally::v1::JOB_STATE_FAILED);
    p.finished = true;
    return p;
  }
  AddEvent(p, "preempted",
           absl::StrCat("attempt ", j.attempt(), " preempted (", cause, "): ", reason,
                        "; requeued, resuming from ",
                        last ? absl::StrCat("step ", last->step()) : std::string("the start")),
           redo, tally::v1::JOB_STATE_QUEUED);
  p.requeued = true;
  return p;
}

Plan PlanPreempting(const PlanContext& ctx, const ActiveJob& job, const std::string& for_job,
                    const std::string& reason) {
  Plan p = NewPlan(ctx, job);
  tally::v1::PreemptionStatus& ps = *p.rec.mutable_job()->mutable_preemption();
  ps.set_pending_for(for_job);
  ps.set_pending_reason(reason);
  *ps.mutable_pending_deadline() = ToProto(p.now + ctx.stop_grace);
  AddEvent(p, "preempting", reason,
           absl::StrCat("the workers checkpoint the latest step and stop (at most ",
                        ShortSeconds(ctx.stop_grace), "); the job then waits in the queue"));
  StopOrders(ctx, p, reason, /*checkpoint=*/true, "", /*preempt=*/true);
  return p;
}

Plan LoseAttempt(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
                 const std::string& draining, const std::string& reason) {
  // A worker lost after its preemption notice, or while preempted for
  // another job, was being preempted: not a failure.
  const bool preempting = !job.rec.job().preemption().pending_for().empty();
  if (KnownPreemptionCause(draining) || preempting) {
    const std::string cause =
        preempting ? OrderedPreemptionCause(job.rec.job()) : std::string(draining);
    return PlanPreempted(
        ctx, job, checkpoints, cause,
        absl::StrCat(reason, "; it was ", preempting ? "being preempted" : "going away",
                     ", its exit never arrived"),
        0);
  }
  return PlanEndAttempt(ctx, job, checkpoints, store::ATTEMPT_STATE_LOST, reason, true);
}

std::string PreemptionCause(const PlanContext& ctx, const ActiveJob& job,
                            const tally::v1::AttemptExit& exit) {
  // tallyd's own order first: the worker cannot know an experiment held it.
  if (!job.rec.job().preemption().pending_for().empty()) {
    return OrderedPreemptionCause(job.rec.job());
  }
  if (KnownPreemptionCause(exit.preemption_cause())) return exit.preemption_cause();
  if (job.attempt) {
    for (const std::string& w : job.attempt->worker_ids()) {
      const WorkerState* ws = ctx.workers->Find(w);
      if (ws != nullptr && KnownPreemptionCause(ws->draining)) return ws->draining;
    }
  }
  return "unknown";
}

Plan PlanStart(const PlanContext& ctx, const ActiveJob& job, const Checkpoints& checkpoints,
               std::vector<std::string> rank_workers,
               const std::set<std::string>& rendezvous_in_use) {
  // Rank 0 hosts the rendezvous: a worker that advertises one leads.
  if (rank_workers.size() > 1 && !ctx.workers->CanLead(rank_workers[0])) {
    auto leader = std::find_if(rank_workers.begin(), rank_workers.end(),
                               [&](const std::string& w) { return ctx.workers->CanLead(w); });
    if (leader != rank_workers.end()) std::iter_swap(rank_workers.begin(), leader);
  }
  const int64_t id = job.rec.id();
  const std::optional<tally::v1::Checkpoint> resume = ResumePoint(job.rec.job(), checkpoints);
  Plan p = NewPlan(ctx, job);  // queued time costs nothing
  tally::v1::Job& j = *p.rec.mutable_job();
  j.set_attempt(j.attempt() + 1);
  j.clear_worker_ids();
  for (const auto& w : rank_workers) j.add_worker_ids(w);
  if (!j.has_start_time()) *j.mutable_start_time() = ToProto(p.now);
  j.mutable_cost()->set_attempt_usd_since_checkpoint(0);

  store::AttemptRecord& attempt = p.attempt.emplace();
  attempt.set_job_id(id);
  attempt.set_attempt(j.attempt());
  for (const auto& w : rank_workers) attempt.add_worker_ids(w);
  attempt.set_state(store::ATTEMPT_STATE_RUNNING);
  *attempt.mutable_start_time() = ToProto(p.now);
  if (resume) attempt.set_resume_step(resume->step());
  if (rank_workers.size() > 1)
    attempt.set_rendezvous(PickRendezvous(*ctx.workers, rank_workers[0], rendezvous_in_use));
  p.write_attempt = true;
  p.keep_attempt = true;

  int32_t spot = 0;
  for (const auto& w : rank_workers) {
    const WorkerState* ws = ctx.workers->Find(w);
    spot += ws != nullptr && ws->rec.capacity() == "spot";
  }
  attempt.set_spot_gpus(spot);
  j.mutable_cost()->set_spot_gpus(spot);
  const int gpus = std::max(1, j.spec().resources().gpu_count());
  const int ranks = static_cast<int>(rank_workers.size());
  j.mutable_cost()->set_attempt_gpus(ranks);
  const int32_t preemptions = j.preemption().count();
  const int32_t not_counted = j.attempts_not_counted();
  std::string detail =
      preemptions == 0 && not_counted == 0
          ? absl::StrCat("attempt ", j.attempt(), " of ", j.spec().max_attempts(), " on ",
                         absl::StrJoin(rank_workers, ","))
          : absl::StrCat(
                "attempt ", j.attempt(), " (", j.attempt() - preemptions - not_counted, " of ",
                j.spec().max_attempts(), " counted",
                preemptions > 0 ? absl::StrCat("; ", preemptions, " preempted before")
                                : std::string(),
                not_counted > 0 ? absl::StrCat("; ", not_counted, " not counted") : std::string(),
                ") on ", absl::StrJoin(rank_workers, ","));
  if (spot > 0) absl::StrAppend(&detail, " (", spot, " of ", rank_workers.size(), " on spot)");
  if (ranks < gpus) {
    absl::StrAppend(&detail, ", world size ", ranks, " of ", gpus,
                    " (all it could get; its micro-batches allow it)");
  }
  if (resume) absl::StrAppend(&detail, ", resuming from step ", resume->step());
  AddEvent(p, "started", "placed on a worker", detail, tally::v1::JOB_STATE_RUNNING);
  p.queue_wait_seconds = absl::ToDoubleSeconds(p.now - job.queued_since);

  const tally::v1::Job& started = p.rec.job();
  std::map<std::string, int> ranks_per_worker;
  for (size_t rank = 0; rank < rank_workers.size(); ++rank) {
    ++ranks_per_worker[rank_workers[rank]];
    tally::v1::ControllerMessage msg;
    auto* a = msg.mutable_assignment();
    a->set_job(started.name());
    a->set_attempt(started.attempt());
    *a->mutable_spec() = started.spec();
    if (resume) *a->mutable_resume_from() = *resume;
    a->set_rank(static_cast<int32_t>(rank));
    a->set_world_size(static_cast<int32_t>(rank_workers.size()));
    if (rank_workers.size() > 1) {
      a->set_rendezvous(attempt.rendezvous());
      a->set_rendezvous_prefix(absl::StrCat(started.name(), "/attempt-", started.attempt()));
    }
    p.sends.emplace_back(rank_workers[rank], std::move(msg));
  }
  for (const auto& [w, n] : ranks_per_worker)
    p.hold.emplace_back(w, AttemptKey{id, started.attempt()}, n);
  return p;
}

std::optional<tally::v1::Checkpoint> ResumePoint(const tally::v1::Job& job,
                                                 const Checkpoints& checkpoints) {
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    const bool damaged =
        std::any_of(job.damaged_checkpoints().begin(), job.damaged_checkpoints().end(),
                    [&](const tally::v1::DamagedCheckpoint& d) { return d.path() == it->path(); });
    if (!damaged) return *it;
  }
  return std::nullopt;
}

Plan PlanEval(const PlanContext& ctx, const ActiveJob& job, const tally::v1::EvalResult& ev) {
  Plan p = NewPlan(ctx, job);
  EvalOutcome o = DecideEval(p.rec.job(), ev, job.routing_collapsed, job.collapse_where);
  *p.rec.mutable_job() = std::move(o.job);
  for (const EvalEvent& e : o.events) AddEvent(p, e);
  if (o.stop) PendingStopFor(ctx, p, o.stop->state, o.stop->type, o.stop->reason, o.stop->rule, ev);
  return p;
}

void AddEvent(Plan& p, const EvalEvent& e) {
  AddEvent(p, e.type, e.reason, e.detail);
  if (e.val_loss) p.events.back().set_val_loss(*e.val_loss);
  if (e.quantized_val_loss) p.events.back().set_quantized_val_loss(*e.quantized_val_loss);
}

void PendingStopFor(const PlanContext& ctx, Plan& p, JobState state, const std::string& type,
                    const std::string& reason, const std::string& rule,
                    const tally::v1::EvalResult& ev) {
  // Decided: the job keeps running until its workers have checkpointed the
  // state this evaluation measured and exited.
  tally::v1::PendingStop& ps = *p.rec.mutable_job()->mutable_pending_stop();
  ps.set_state(state);
  ps.set_type(type);
  ps.set_reason(reason);
  ps.set_rule(rule);
  ps.set_step(ev.step());
  ps.set_val_loss(ev.val_loss());
  if (ev.has_quantized_val_loss()) ps.set_quantized_val_loss(ev.quantized_val_loss());
  *ps.mutable_deadline() = ToProto(p.now + ctx.stop_grace);
  AddEvent(p, "stopping", reason,
           absl::StrCat("rule ", rule, " at step ", ev.step(),
                        "; waiting for the workers' final checkpoint (at most ",
                        ShortSeconds(ctx.stop_grace), ")"));
  StopOrders(ctx, p, reason, /*checkpoint=*/true);
}

Plan PlanCheckpoint(const PlanContext& ctx, const ActiveJob& job,
                    const tally::v1::CheckpointRecord& c,
                    const std::optional<tally::v1::Checkpoint>& previous) {
  Plan p = NewPlan(ctx, job);
  tally::v1::Job& j = *p.rec.mutable_job();
  if (c.step() >= j.step()) {  // an older step's checkpoint never moves it back
    j.set_step(c.step());
    j.set_tokens(c.tokens());
  }
  tally::v1::Checkpoint ck;
  ck.set_job(c.job());
  ck.set_attempt(c.attempt());
  ck.set_step(c.step());
  ck.set_tokens(c.tokens());
  ck.set_path(c.path());
  ck.set_sha256(c.sha256());
  // The evaluation of this step, reported just before it (the curve is in
  // the job record, so a restart in between loses nothing).
  const auto& curve = job.rec.job().curve();
  for (int i = curve.size() - 1; i >= 0; --i) {
    if (curve[i].step() == c.step()) {
      ck.set_val_loss(curve[i].val_loss());
      if (curve[i].has_quantized_val_loss()) {
        ck.set_quantized_val_loss(curve[i].quantized_val_loss());
      }
      break;
    }
    if (curve[i].step() < c.step()) break;
  }
  *ck.mutable_time() = ToProto(p.now);
  ck = ctx.ledger->PriceCheckpoint(j, std::move(ck), previous);
  j.mutable_cost()->set_attempt_usd_since_checkpoint(0);
  p.checkpoints.push_back(ck);
  p.last_checkpoint = ck;
  AddEvent(p, "checkpoint", "", c.path());
  return p;
}

EndAttemptNotes DamagedCheckpointNotes(const ActiveJob& job, const Checkpoints& checkpoints,
                                       const tally::v1::AttemptExit& exit) {
  EndAttemptNotes notes;
  // Only the checkpoint this attempt was told to resume from: a worker
  // cannot strike out others by naming them.
  const std::optional<tally::v1::Checkpoint> resumed = ResumePoint(job.rec.job(), checkpoints);
  if (!resumed || resumed->path() != exit.damaged_checkpoint()) return notes;
  tally::v1::DamagedCheckpoint& d = notes.damaged.emplace();
  d.set_step(resumed->step());
  d.set_path(resumed->path());
  d.set_reason(exit.reason().substr(0, 512));
  d.set_attempt(exit.attempt());
  tally::v1::Job after = job.rec.job();
  *after.add_damaged_checkpoints() = d;
  notes.resume_instead = ResumePoint(after, checkpoints);
  // With an intact one to resume from the attempt was not the job's
  // failure; without, the next one starts over and counts.
  notes.not_counted = notes.resume_instead.has_value();
  return notes;
}

std::string PickRendezvous(const WorkerRegistry& workers, const std::string& leader,
                           const std::set<std::string>& in_use) {
  if (!workers.CanLead(leader)) return "";  // the ranks fail with "rendezvous: is required"
  const store::WorkerRecord& rec = workers.Find(leader)->rec;
  for (int k = 0; k < std::max(1, rec.slots()); ++k) {
    std::string address = absl::StrCat(rec.rendezvous_host(), ":", rec.rendezvous_port() + k);
    if (!in_use.count(address)) return address;
  }
  return absl::StrCat(rec.rendezvous_host(), ":", rec.rendezvous_port());
}

}  // namespace tally::sched
