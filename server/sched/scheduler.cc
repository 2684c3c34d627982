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
#include "server/sched/report_checks.h"

namespace tally::sched {
namespace {

// One step time into the job's sample (policy/step_times.h).
void AddStepTime(double seconds, tally::v1::StepTimes* t) {
  policy::StepTimeSample s;
  s.seconds.assign(t->seconds().begin(), t->seconds().end());
  s.stride = t->stride();
  s.reports = t->reports();
  if (!policy::AddStepTime(seconds, &s)) return;
  t->mutable_seconds()->Assign(s.seconds.begin(), s.seconds.end());
  t->set_stride(s.stride);
  t->set_reports(s.reports);
}


using tally::v1::JobState;

std::string StateName(JobState s) {
  absl::string_view name = tally::v1::JobState_Name(s);
  absl::ConsumePrefix(&name, "JOB_STATE_");
  return std::string(name);
}

// The job's latest evaluation, from its curve (which must not be empty).
tally::v1::EvalResult LatestEval(const tally::v1::Job& j) {
  const tally::v1::EvalPoint& last = j.curve(j.curve_size() - 1);
  tally::v1::EvalResult ev;
  ev.set_step(last.step());
  ev.set_tokens(last.tokens());
  ev.set_val_loss(last.val_loss());
  return ev;
}

// Label values are lower case: "early_stopped".
std::string StateLabel(JobState s) { return absl::AsciiStrToLower(StateName(s)); }

// The rule a job ended by when its plan names none.
std::string DefaultEndRule(JobState s) {
  switch (s) {
    case tally::v1::JOB_STATE_SUCCEEDED:
      return policy::rules::kMaxSteps;
    case tally::v1::JOB_STATE_BUDGET_EXHAUSTED:
      return policy::rules::kBudget;
    case tally::v1::JOB_STATE_CANCELLED:
      return policy::rules::kCancel;
    case tally::v1::JOB_STATE_FAILED:
      return policy::rules::kFailure;
    default:
      return "other";
  }
}

// A stop order for attempt `attempt` of `job` (see StopOrder).
tally::v1::ControllerMessage StopMessage(const std::string& job, int32_t attempt,
                                         const std::string& reason, bool checkpoint = false,
                                         bool preempt = false) {
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

// A decided preemption no longer waits once the attempt has ended.
void ClearPendingPreemption(tally::v1::Job& j) {
  if (!j.has_preemption()) return;
  tally::v1::PreemptionStatus& ps = *j.mutable_preemption();
  ps.clear_pending_for();
  ps.clear_pending_reason();
  ps.clear_pending_deadline();
}

std::string ShortSeconds(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(100)));
}

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

// Per-job metrics observe commits like any other observer.
class JobMetricsObserver final : public CommitObserver {
 public:
  explicit JobMetricsObserver(metrics::JobMetrics* metrics) : metrics_(metrics) {}
  void OnJobCommitted(const store::JobRecord& job, const store::Mutation& m) override {
    for (const auto& e : m.events) {
      if (e.type() == "started") metrics_->OnAttemptStarted(job.job());
    }
    metrics_->Update(job.job());
    for (const auto& ck : m.checkpoints) metrics_->OnCheckpoint(job.job(), ck);
  }

 private:
  metrics::JobMetrics* const metrics_;
};

}  // namespace

// One state change, decided: everything the transaction writes and what is
// done once it has committed. Built from a copy of the job; nothing outside
// the plan changes until Execute commits it.
struct Scheduler::Plan {
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
  std::vector<JobState> transitions;
  std::vector<std::string> attempts_ended;  // outcomes
  double cost_added_usd = 0;
  double lost_added_usd = 0;
  double redone_added_usd = 0;
  std::string preemption_cause;  // counted in tally_preemptions_total
  std::string early_stop_rule;
  std::string end_rule;  // for a finished job; empty: DefaultEndRule
  std::optional<double> queue_wait_seconds;
};

Scheduler::Scheduler(store::JobStore* store, WorkerChannel* channel, const Clock* clock,
                     metrics::Registry* registry, SchedulerOptions options)
    : store_(store),
      channel_(channel),
      clock_(clock),
      options_(options),
      ledger_(options.prices),
      workers_(options.heartbeat_timeout),
      job_metrics_(registry, options.job_metrics) {
  job_metrics_observer_ = std::make_unique<JobMetricsObserver>(&job_metrics_);
  observers_.push_back(job_metrics_observer_.get());
  queue_wait_ = &metrics::BuildHistogram()
                     .Name("tally_queue_wait_seconds")
                     .Help("Time jobs waited in QUEUED before an attempt started.")
                     .Register(*registry)
                     .Add({}, metrics::Histogram::ExponentialBuckets(0.1, 2, 18));  // to 3.6 h
  queue_depth_ = &metrics::BuildGauge()
                      .Name("tally_queue_depth")
                      .Help("Jobs waiting in QUEUED (held ones, an experiment's, "
                            "not counted).")
                      .Register(*registry)
                      .Add({});
  workers_gauge_ = &metrics::BuildGauge()
                        .Name("tally_workers")
                        .Help("Workers known to tallyd, by GPU type and whether "
                              "they are connected.")
                        .Register(*registry);
  slots_gauge_ = &metrics::BuildGauge()
                      .Name("tally_worker_slots")
                      .Help("Slots of connected workers, by GPU type and "
                            "whether they are free or used.")
                      .Register(*registry);
  attempts_ended_ = &metrics::BuildCounter()
                         .Name("tally_attempts_ended_total")
                         .Help("Attempts that ended, by outcome (succeeded, "
                               "failed, lost, stopped, preempted: not a failure, the job "
                               "resumes).")
                         .Register(*registry);
  transitions_ = &metrics::BuildCounter()
                      .Name("tally_job_transitions_total")
                      .Help("Job state transitions, by the state entered.")
                      .Register(*registry);
  auto* jobs = &metrics::BuildGauge()
                    .Name("tally_jobs")
                    .Help("Jobs by state, as stored.")
                    .Register(*registry);
  for (int s = tally::v1::JOB_STATE_QUEUED; s <= tally::v1::JOB_STATE_FAILED; ++s) {
    jobs->Add({{"state", StateLabel(static_cast<JobState>(s))}});
    transitions_->Add({{"state", StateLabel(static_cast<JobState>(s))}});
  }
  for (const char* outcome : {"succeeded", "failed", "lost", "stopped", "preempted"}) {
    attempts_ended_->Add({{"outcome", outcome}});
  }
  cost_total_ = &metrics::BuildCounter()
                     .Name("tally_cost_dollars_total")
                     .Help("Dollars accrued by running attempts, by GPU type.")
                     .Register(*registry);
  lost_total_ = &metrics::BuildCounter()
                     .Name("tally_cost_lost_dollars_total")
                     .Help("Dollars spent by failed or lost attempts after their last "
                           "checkpoint, by GPU type.")
                     .Register(*registry);
  preemptions_ = &metrics::BuildCounter()
                      .Name("tally_preemptions_total")
                      .Help("Attempts preempted, by GPU type and cause (sigterm, sigint, "
                            "notice_file, idle: a worker's notice; priority: a higher-priority "
                            "job; experiment: an experiment holding its variant at a "
                            "successive-halving rung; unknown). A preemption is not a failure: "
                            "the job resumes.")
                      .Register(*registry);
  redone_total_ = &metrics::BuildCounter()
                      .Name("tally_cost_redone_dollars_total")
                      .Help("Dollars preempted attempts spent after their last checkpoint (work "
                            "the next attempt redoes; 0 when the notice checkpoint landed), by "
                            "GPU type.")
                      .Register(*registry);
  early_stops_ = &metrics::BuildCounter()
                      .Name("tally_early_stops_total")
                      .Help("Jobs stopped early, by rule.")
                      .Register(*registry);
  for (const char* rule : policy::rules::EarlyStopRules()) early_stops_->Add({{"rule", rule}});
  job_ends_ = &metrics::BuildCounter()
                   .Name("tally_job_ends_total")
                   .Help("Jobs that ended, by terminal state and the rule that ended them "
                         "(max_steps, target, patience, divergence, no_gain_over_baseline, "
                         "forecast, budget, cancel, failure, experiment_budget, "
                         "experiment_halving).")
                   .Register(*registry);
  for (const auto& [state, rules] : policy::rules::JobEndRules()) {
    for (const char* rule : rules) job_ends_->Add({{"state", state}, {"reason_rule", rule}});
  }
  tenant_spend_ = &metrics::BuildGauge()
                      .Name("tally_tenant_spend_usd")
                      .Help("Dollars a tenant spent over the rolling window (day: 24 h, month: "
                            "30 days), committed.")
                      .Register(*registry);
  tenant_quota_ = &metrics::BuildGauge()
                      .Name("tally_tenant_quota_usd")
                      .Help("A tenant's dollar quota over the window (tallyd's --config).")
                      .Register(*registry);
  tenant_gpus_ = &metrics::BuildGauge()
                     .Name("tally_tenant_gpus")
                     .Help("GPUs a tenant's running jobs hold (state=in_use) and its max_gpus "
                           "quota (state=quota).")
                     .Register(*registry);
  refused_reports_ = &metrics::BuildCounter()
                        .Name("tally_worker_reports_refused_total")
                        .Help("Reports dropped without effect, by kind: about a current "
                              "attempt from a worker that does not run it (progress, eval, "
                              "checkpoint, exit), a checkpoint outside the job's folder "
                              "(checkpoint_path), progress going backwards or past max_steps "
                              "(progress_out_of_order), a damaged checkpoint other than the "
                              "one the attempt resumed from (damaged_checkpoint), a figure out "
                              "of range (invalid: the worker's stream ends), an evaluation or "
                              "checkpoint taken already, sent again after a broken stream "
                              "lost its acknowledgement (repeated).")
                        .Register(*registry);
  for (const char* kind : {"progress", "eval", "checkpoint", "exit", "checkpoint_path",
                           "progress_out_of_order", "damaged_checkpoint", "invalid",
                           "repeated"}) {
    refused_reports_->Add({{"kind", kind}});
  }
  gpus_wanted_ = &metrics::BuildGauge()
                      .Name("tally_gpus_wanted")
                      .Help("GPUs wanted, by GPU type: those of running attempts plus those of "
                            "queued jobs that could run if workers existed (a job held back by "
                            "its tenant's dollar quota or max_gpus is left out). An autoscaler's "
                            "target: workers needed = this / GPUs per worker.")
                      .Register(*registry);
  workers_idle_ = &metrics::BuildGauge()
                       .Name("tally_workers_idle")
                       .Help("Connected, live, non-draining workers running nothing, by GPU "
                             "type.")
                       .Register(*registry);
  workers_lost_ = &metrics::BuildCounter()
                       .Name("tally_workers_lost_total")
                       .Help("Workers found silent past the heartbeat timeout, or whose stream "
                             "ended without a notice or while still holding attempts (their "
                             "attempts are lost), by GPU type. Clean exits are in "
                             "tally_worker_exits_total.")
                       .Register(*registry);
  worker_exits_ = &metrics::BuildCounter()
                       .Name("tally_worker_exits_total")
                       .Help("Workers that left cleanly: they sent a notice and their stream "
                             "ended holding nothing, by GPU type and cause (sigterm, sigint: a "
                             "signal, e.g. a pod deleted or scaled down; notice_file: a spot "
                             "reclaim notice; idle: --exit_when_idle, scale to zero). Not "
                             "counted in tally_workers_lost_total.")
                       .Register(*registry);
  for (const auto& [gpu_type, price] : options_.prices.usd_per_gpu_hour) AddGpuType(gpu_type);
  // Jobs by state come from the store, the source of truth, at scrape time.
  registry->AddCollectCallback([store, jobs] {
    auto counts = store->CountJobsByState();
    if (!counts.ok()) return;
    std::map<JobState, int64_t> by_state(counts->begin(), counts->end());
    for (int s = tally::v1::JOB_STATE_QUEUED; s <= tally::v1::JOB_STATE_FAILED; ++s) {
      const auto state = static_cast<JobState>(s);
      jobs->Add({{"state", StateLabel(state)}}).Set(by_state[state]);
    }
  });
}

Scheduler::~Scheduler() = default;

// ---------------------------------------------------------------- plans

Scheduler::Plan Scheduler::NewPlan(const ActiveJob& job, absl::Time now) const {
  Plan p;
  p.job_id = job.rec.id();
  p.now = now;
  p.rec = job.rec;
  p.attempt = job.attempt;
  p.keep_attempt = job.attempt.has_value();
  const bool running =
      job.rec.job().state() == tally::v1::JOB_STATE_RUNNING && job.attempt.has_value();
  ledger::Accrual a = ledger_.Accrue(job.rec.job(), running, now);
  *p.rec.mutable_job()->mutable_cost() = std::move(a.cost);
  p.cost_added_usd = a.added_usd;
  return p;
}

void Scheduler::AddEvent(Plan& p, const std::string& type, const std::string& reason,
                         const std::string& detail, std::optional<JobState> state) const {
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
                          ? (j.early_stopping().evals() > 0
                                 ? j.early_stopping().patience_left()
                                 : j.spec().early_stopping().patience())
                          : -1);
}

void Scheduler::StopOrders(Plan& p, const std::string& reason, bool checkpoint,
                           const std::string& except_worker, bool preempt) const {
  if (!p.attempt) return;
  const AttemptKey key{p.job_id, p.attempt->attempt()};
  std::set<std::string> workers(p.attempt->worker_ids().begin(), p.attempt->worker_ids().end());
  for (const auto& w : workers) {
    if (w == except_worker) continue;
    const WorkerState* ws = workers_.Find(w);
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

Scheduler::Plan Scheduler::PlanStopNow(const ActiveJob& job, JobState state,
                                       const std::string& type, const std::string& reason,
                                       const std::string& detail) const {
  Plan p = NewPlan(job, clock_->Now());
  if (p.attempt) {
    p.attempt->set_state(store::ATTEMPT_STATE_STOPPED);
    *p.attempt->mutable_end_time() = ToProto(p.now);
    p.attempt->set_reason(reason);
    p.write_attempt = true;
    StopOrders(p, reason, /*checkpoint=*/false);
    p.attempts_ended.push_back("stopped");
  }
  p.rec.mutable_job()->clear_pending_stop();
  ClearPendingPreemption(*p.rec.mutable_job());
  AddEvent(p, type, reason, detail, state);
  p.keep_attempt = false;
  p.finished = true;
  return p;
}

absl::StatusOr<Scheduler::Plan> Scheduler::PlanFinishStop(const ActiveJob& job,
                                                          const std::string& how,
                                                          store::AttemptState attempt_state) const {
  const tally::v1::PendingStop ps = job.rec.job().pending_stop();
  // The best checkpoint: the lowest recorded validation loss, else the latest.
  ASSIGN_OR_RETURN(std::vector<tally::v1::Checkpoint> cks, store_->ListCheckpoints(job.rec.id()));
  const tally::v1::Checkpoint* best = cks.empty() ? nullptr : &cks.back();
  for (const auto& c : cks) {
    if (c.val_loss() > 0 && (best->val_loss() <= 0 || c.val_loss() < best->val_loss())) {
      best = &c;
    }
  }
  Plan p = NewPlan(job, clock_->Now());
  tally::v1::Job& j = *p.rec.mutable_job();
  if (attempt_state == store::ATTEMPT_STATE_LOST || attempt_state == store::ATTEMPT_STATE_FAILED) {
    // The attempt ended without confirming: its spend since the last
    // checkpoint kept nothing.
    ledger::Accrual lost = ledger_.ChargeLost(j.cost());
    *j.mutable_cost() = std::move(lost.cost);
    p.lost_added_usd = lost.added_usd;
  }
  if (p.attempt) {
    p.attempt->set_state(attempt_state);
    *p.attempt->mutable_end_time() = ToProto(p.now);
    p.attempt->set_reason(how.empty() ? ps.reason() : how);
    p.write_attempt = true;
    StopOrders(p, ps.reason(), /*checkpoint=*/false);
    p.attempts_ended.push_back(Outcome(attempt_state));
  }
  std::string detail = "no checkpoint yet";
  if (best != nullptr) {
    j.mutable_early_stopping()->set_best_checkpoint(best->path());
    detail = absl::StrFormat("best checkpoint: step %d, val_loss %.4f, %s", best->step(),
                             best->val_loss(), best->path());
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

absl::StatusOr<Scheduler::Plan> Scheduler::PlanEndAttempt(const ActiveJob& job,
                                                          store::AttemptState attempt_state,
                                                          const std::string& reason,
                                                          bool may_retry) const {
  return PlanEndAttempt(job, attempt_state, reason, may_retry, EndAttemptNotes{});
}

absl::StatusOr<Scheduler::Plan> Scheduler::PlanEndAttempt(const ActiveJob& job,
                                                          store::AttemptState attempt_state,
                                                          const std::string& reason,
                                                          bool may_retry,
                                                          const EndAttemptNotes& notes) const {
  if (job.rec.job().has_pending_stop()) {
    // The stop was decided; the attempt ending early does not undo it.
    return PlanFinishStop(job, absl::StrCat("the attempt ended: ", reason), attempt_state);
  }
  Plan p = NewPlan(job, clock_->Now());
  tally::v1::Job& j = *p.rec.mutable_job();
  ClearPendingPreemption(j);
  if (notes.damaged) {
    *j.add_damaged_checkpoints() = *notes.damaged;
    AddEvent(p, "checkpoint_damaged",
             absl::StrCat("the checkpoint at step ", notes.damaged->step(),
                          " is damaged: ", notes.damaged->reason()),
             notes.resume_instead ? absl::StrCat("the next attempt resumes from step ",
                                                 notes.resume_instead->step(), " (",
                                                 notes.resume_instead->path(), ")")
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
  ledger::Accrual lost = ledger_.ChargeLost(j.cost());
  *j.mutable_cost() = std::move(lost.cost);
  p.lost_added_usd = lost.added_usd;
  if (p.attempt) {
    p.attempt->set_state(attempt_state);
    *p.attempt->mutable_end_time() = ToProto(p.now);
    p.attempt->set_reason(reason);
    p.write_attempt = true;
    // The other ranks of a gang cannot go on without this one.
    StopOrders(p, reason, /*checkpoint=*/false);
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
  const std::string why =
      may_retry ? absl::StrCat("attempt ", n, " of ", max, " ", outcome, ": ", reason,
                               "; no attempts left (max_attempts ", max, ")")
                : absl::StrCat("attempt ", n, " ", outcome, ": ", reason);
  AddEvent(p, "failed", why, "", tally::v1::JOB_STATE_FAILED);
  p.finished = true;
  return p;
}

absl::StatusOr<Scheduler::Plan> Scheduler::PlanPreempted(const ActiveJob& job,
                                                         const std::string& cause,
                                                         const std::string& reason,
                                                         int64_t step) const {
  if (job.rec.job().has_pending_stop()) {
    // The stop was decided first: the job ends as decided, keeping what it has.
    return PlanFinishStop(job, absl::StrCat("the attempt was preempted (", cause, "): ", reason),
                          store::ATTEMPT_STATE_PREEMPTED);
  }
  ASSIGN_OR_RETURN(const std::optional<tally::v1::Checkpoint> last, LatestCheckpoint(job));
  Plan p = NewPlan(job, clock_->Now());
  tally::v1::Job& j = *p.rec.mutable_job();
  // Where the attempt got to: its exit's step, or its latest report (an
  // exit made at the worker's deadline may not know it).
  step = std::max(step, j.step());
  const bool kept = last.has_value() && last->step() >= step;
  ledger::Accrual redone = ledger_.ChargeRedone(j.cost(), kept);
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
      if (ps.preempted_by_size() >= kMaxPreemptedBy) ps.mutable_preempted_by()->DeleteSubrange(0, 1);
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
    StopOrders(p, absl::StrCat("preempted: ", reason), /*checkpoint=*/false);
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

Scheduler::Plan Scheduler::PlanPreempting(const ActiveJob& job, const std::string& for_job,
                                          const std::string& reason) const {
  Plan p = NewPlan(job, clock_->Now());
  tally::v1::PreemptionStatus& ps = *p.rec.mutable_job()->mutable_preemption();
  ps.set_pending_for(for_job);
  ps.set_pending_reason(reason);
  *ps.mutable_pending_deadline() = ToProto(p.now + options_.stop_grace);
  AddEvent(p, "preempting", reason,
           absl::StrCat("the workers checkpoint the latest step and stop (at most ",
                        ShortSeconds(options_.stop_grace), "); the job then waits in the queue"));
  StopOrders(p, reason, /*checkpoint=*/true, "", /*preempt=*/true);
  return p;
}

absl::StatusOr<Scheduler::Plan> Scheduler::LoseAttempt(const ActiveJob& job,
                                                       const std::string& draining,
                                                       const std::string& reason) const {
  // A worker lost after its preemption notice, or while preempted for
  // another job, was being preempted: not a failure.
  const bool preempting = !job.rec.job().preemption().pending_for().empty();
  if (KnownPreemptionCause(draining) || preempting) {
    const std::string cause =
        preempting ? OrderedPreemptionCause(job.rec.job()) : std::string(draining);
    return PlanPreempted(job, cause,
                         absl::StrCat(reason, "; it was ",
                                      preempting ? "being preempted" : "going away",
                                      ", its exit never arrived"),
                         0);
  }
  return PlanEndAttempt(job, store::ATTEMPT_STATE_LOST, reason, true);
}

std::string Scheduler::PreemptionCause(const ActiveJob& job,
                                       const tally::v1::AttemptExit& exit) const {
  // tallyd's own order first: the worker cannot know an experiment held it.
  if (!job.rec.job().preemption().pending_for().empty()) {
    return OrderedPreemptionCause(job.rec.job());
  }
  if (KnownPreemptionCause(exit.preemption_cause())) return exit.preemption_cause();
  if (job.attempt) {
    for (const std::string& w : job.attempt->worker_ids()) {
      const WorkerState* ws = workers_.Find(w);
      if (ws != nullptr && KnownPreemptionCause(ws->draining)) return ws->draining;
    }
  }
  return "unknown";
}

absl::StatusOr<Scheduler::Plan> Scheduler::PlanStart(const ActiveJob& job,
                                                     std::vector<std::string> rank_workers) const {
  // Rank 0 hosts the rendezvous: a worker that advertises one leads.
  if (rank_workers.size() > 1 && !workers_.CanLead(rank_workers[0])) {
    auto leader = std::find_if(rank_workers.begin(), rank_workers.end(),
                               [&](const std::string& w) { return workers_.CanLead(w); });
    if (leader != rank_workers.end()) std::iter_swap(rank_workers.begin(), leader);
  }
  const int64_t id = job.rec.id();
  ASSIGN_OR_RETURN(std::vector<tally::v1::Checkpoint> checkpoints, store_->ListCheckpoints(id));
  const std::optional<tally::v1::Checkpoint> resume = ResumePoint(job.rec.job(), checkpoints);
  Plan p = NewPlan(job, clock_->Now());  // queued time costs nothing
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
  if (rank_workers.size() > 1) attempt.set_rendezvous(PickRendezvous(rank_workers[0]));
  p.write_attempt = true;
  p.keep_attempt = true;

  int32_t spot = 0;
  for (const auto& w : rank_workers) {
    const WorkerState* ws = workers_.Find(w);
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
          : absl::StrCat("attempt ", j.attempt(), " (", j.attempt() - preemptions - not_counted,
                         " of ", j.spec().max_attempts(), " counted",
                         preemptions > 0 ? absl::StrCat("; ", preemptions, " preempted before")
                                         : std::string(),
                         not_counted > 0 ? absl::StrCat("; ", not_counted, " not counted")
                                         : std::string(),
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
  for (const auto& [w, n] : ranks_per_worker) p.hold.emplace_back(w, AttemptKey{id, started.attempt()}, n);
  return p;
}

std::optional<tally::v1::Checkpoint> Scheduler::ResumePoint(
    const tally::v1::Job& job, const std::vector<tally::v1::Checkpoint>& checkpoints) {
  for (auto it = checkpoints.rbegin(); it != checkpoints.rend(); ++it) {
    const bool damaged = std::any_of(
        job.damaged_checkpoints().begin(), job.damaged_checkpoints().end(),
        [&](const tally::v1::DamagedCheckpoint& d) { return d.path() == it->path(); });
    if (!damaged) return *it;
  }
  return std::nullopt;
}

Scheduler::Plan Scheduler::PlanEval(const ActiveJob& job, const tally::v1::EvalResult& ev) const {
  Plan p = NewPlan(job, clock_->Now());
  EvalOutcome o = ApplyEval(p.rec.job(), ev, job.routing_collapsed, job.collapse_where);
  *p.rec.mutable_job() = std::move(o.job);
  for (const EvalEvent& e : o.events) AddEvent(p, e);
  if (o.stop) PendingStopFor(p, o.stop->state, o.stop->type, o.stop->reason, o.stop->rule, ev);
  return p;
}

void Scheduler::AddEvent(Plan& p, const EvalEvent& e) const {
  AddEvent(p, e.type, e.reason, e.detail);
  if (e.val_loss) p.events.back().set_val_loss(*e.val_loss);
}

void Scheduler::PendingStopFor(Plan& p, JobState state, const std::string& type,
                               const std::string& reason, const std::string& rule,
                               const tally::v1::EvalResult& ev) const {
  // Decided: the job keeps running until its workers have checkpointed the
  // state this evaluation measured and exited.
  tally::v1::PendingStop& ps = *p.rec.mutable_job()->mutable_pending_stop();
  ps.set_state(state);
  ps.set_type(type);
  ps.set_reason(reason);
  ps.set_rule(rule);
  ps.set_step(ev.step());
  ps.set_val_loss(ev.val_loss());
  *ps.mutable_deadline() = ToProto(p.now + options_.stop_grace);
  AddEvent(p, "stopping", reason,
           absl::StrCat("rule ", rule, " at step ", ev.step(),
                        "; waiting for the workers' final checkpoint (at most ",
                        ShortSeconds(options_.stop_grace), ")"));
  StopOrders(p, reason, /*checkpoint=*/true);
}

bool RepeatedEval(const tally::v1::Job& j, const tally::v1::EvalResult& ev) {
  // The curve keeps its latest point; within an attempt steps only go
  // forward, so one of the latest point's attempt at or before its step was
  // taken already. (Another attempt evaluating earlier steps is a resumed
  // one, and is taken.)
  if (j.curve_size() == 0) return false;
  const tally::v1::EvalPoint& last = j.curve(j.curve_size() - 1);
  return last.attempt() != 0 && last.attempt() == ev.attempt() && ev.step() <= last.step();
}

bool RepeatedCheckpoint(const std::optional<tally::v1::Checkpoint>& latest,
                        const tally::v1::CheckpointRecord& c) {
  return latest.has_value() && latest->attempt() == c.attempt() && latest->step() == c.step() &&
         latest->path() == c.path();
}

absl::StatusOr<std::optional<tally::v1::Checkpoint>> Scheduler::LatestCheckpoint(
    const ActiveJob& job) const {
  // Read from the store once per job life in this process (e.g. after a
  // restart); afterwards the job keeps its latest checkpoint.
  if (job.last_checkpoint) return job.last_checkpoint;
  ASSIGN_OR_RETURN(std::vector<tally::v1::Checkpoint> cks, store_->ListCheckpoints(job.rec.id()));
  if (cks.empty()) return std::optional<tally::v1::Checkpoint>();
  return std::optional<tally::v1::Checkpoint>(cks.back());
}

Scheduler::Plan Scheduler::PlanCheckpoint(
    const ActiveJob& job, const tally::v1::CheckpointRecord& c,
    const std::optional<tally::v1::Checkpoint>& previous) const {
  Plan p = NewPlan(job, clock_->Now());
  tally::v1::Job& j = *p.rec.mutable_job();
  j.set_step(c.step());
  j.set_tokens(c.tokens());
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
      break;
    }
    if (curve[i].step() < c.step()) break;
  }
  *ck.mutable_time() = ToProto(p.now);
  ck = ledger_.PriceCheckpoint(j, std::move(ck), previous);
  j.mutable_cost()->set_attempt_usd_since_checkpoint(0);
  p.checkpoints.push_back(ck);
  p.last_checkpoint = ck;
  AddEvent(p, "checkpoint", "", c.path());
  return p;
}

// ---------------------------------------------------------------- commit, act

absl::Status Scheduler::Execute(int64_t job_id, Plan plan) {
  auto it = active_.find(job_id);
  if (it == active_.end()) return absl::InternalError(absl::StrCat("jobs/", job_id, " is not active"));
  // An ended job is held by nothing.
  if (store::IsTerminal(plan.rec.job().state())) plan.rec.mutable_job()->clear_hold();
  store::Mutation m;
  m.job = plan.rec;
  m.events = plan.events;
  if (plan.write_attempt && plan.attempt) m.attempts.push_back(*plan.attempt);
  m.checkpoints = plan.checkpoints;
  const std::string& tenant = plan.rec.job().tenant();
  const int64_t hour = ledger::TenantSpend::HourOf(plan.now);
  if (plan.cost_added_usd > 0) m.spend.push_back({tenant, hour, plan.cost_added_usd});
  RETURN_IF_ERROR(store_->Commit(m));
  if (plan.cost_added_usd > 0) spend_.Add(tenant, hour, plan.cost_added_usd);

  // Committed: now memory, workers, metrics and observers follow.
  ActiveJob& job = it->second;
  job.rec = plan.rec;
  job.attempt = plan.keep_attempt ? plan.attempt : std::nullopt;
  if (plan.requeued) job.queued_since = plan.now;
  if (plan.progress_event) job.last_progress_event = plan.now;
  if (plan.last_checkpoint) job.last_checkpoint = plan.last_checkpoint;
  for (const auto& [w, key] : plan.release) workers_.Release(w, key);
  for (const auto& [w, key] : plan.release_one) workers_.ReleaseOne(w, key);
  for (const auto& [w, key, n] : plan.hold) workers_.Hold(w, key, n);
  for (const auto& [w, msg] : plan.sends) {
    if (workers_.Connected(w)) channel_->Send(w, msg);
  }
  const std::string& gpu_type = job.rec.job().spec().resources().gpu_type();
  for (JobState s : plan.transitions) transitions_->Add({{"state", StateLabel(s)}}).Increment();
  for (const auto& o : plan.attempts_ended) {
    attempts_ended_->Add({{"outcome", o}}).Increment();
    job_metrics_.OnAttemptEnded(job.rec.job(), o);
  }
  if (plan.finished) {
    const JobState s = job.rec.job().state();
    job_ends_
        ->Add({{"state", StateLabel(s)},
               {"reason_rule", plan.end_rule.empty() ? DefaultEndRule(s) : plan.end_rule}})
        .Increment();
  }
  if (plan.cost_added_usd > 0) cost_total_->Add({{"gpu_type", gpu_type}}).Increment(plan.cost_added_usd);
  if (plan.lost_added_usd > 0) lost_total_->Add({{"gpu_type", gpu_type}}).Increment(plan.lost_added_usd);
  if (plan.redone_added_usd > 0) {
    redone_total_->Add({{"gpu_type", gpu_type}}).Increment(plan.redone_added_usd);
  }
  if (!plan.preemption_cause.empty()) {
    preemptions_->Add({{"gpu_type", gpu_type}, {"cause", plan.preemption_cause}}).Increment();
  }
  if (!plan.early_stop_rule.empty()) early_stops_->Add({{"rule", plan.early_stop_rule}}).Increment();
  if (plan.queue_wait_seconds) queue_wait_->Observe(*plan.queue_wait_seconds);
  for (CommitObserver* o : observers_) o->OnJobCommitted(job.rec, m);
  if (plan.finished) {
    const JobState s = job.rec.job().state();
    if (s == tally::v1::JOB_STATE_SUCCEEDED || s == tally::v1::JOB_STATE_EARLY_STOPPED ||
        s == tally::v1::JOB_STATE_BUDGET_EXHAUSTED) {
      ledger_.RecordFinished(job.rec.job());
    }
    active_.erase(it);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- entry points

absl::Status Scheduler::Recover() {
  ASSIGN_OR_RETURN(std::vector<store::JobRecord> jobs, store_->ListActiveJobs());
  const absl::Time now = clock_->Now();
  // The tenants' spend of the last month, for their quotas.
  absl::StatusOr<std::vector<store::SpendRecord>> spent = store_->ListSpend(
      ledger::TenantSpend::HourOf(now) - absl::ToInt64Hours(ledger::kQuotaMonth));
  if (!spent.ok() && !absl::IsUnimplemented(spent.status())) return spent.status();
  if (spent.ok()) {
    for (const store::SpendRecord& r : *spent) spend_.Add(r.tenant, r.hour, r.usd);
  }
  for (auto& rec : jobs) {
    ActiveJob job;
    job.rec = rec;
    job.queued_since = now;
    if (rec.job().state() == tally::v1::JOB_STATE_RUNNING) {
      ASSIGN_OR_RETURN(std::vector<store::AttemptRecord> attempts, store_->ListAttempts(rec.id()));
      if (!attempts.empty() && attempts.back().state() == store::ATTEMPT_STATE_RUNNING) {
        job.attempt = attempts.back();
        for (const std::string& w : job.attempt->worker_ids()) {
          workers_.Add(w).last_seen = now;  // it has heartbeat_timeout to come back
          workers_.AddRank(w, {rec.id(), job.attempt->attempt()});
        }
      }
    }
    const int64_t id = rec.id();
    const bool orphan = rec.job().state() == tally::v1::JOB_STATE_RUNNING && !job.attempt;
    active_[id] = std::move(job);
    if (orphan) {
      // RUNNING without a running attempt: the attempt's end was recorded
      // but not the job's; requeue it.
      Plan p = NewPlan(active_[id], now);
      AddEvent(p, "requeued", "recovered without a running attempt", "",
               tally::v1::JOB_STATE_QUEUED);
      p.requeued = true;
      RETURN_IF_ERROR(Execute(id, std::move(p)));
    }
  }
  // Throughput measured by finished jobs, for estimates; and the series of
  // jobs that ended within the metrics retention (measured from their end),
  // which a restart would otherwise cut short.
  store::JobQuery q;
  q.states = {tally::v1::JOB_STATE_SUCCEEDED, tally::v1::JOB_STATE_EARLY_STOPPED,
              tally::v1::JOB_STATE_BUDGET_EXHAUSTED, tally::v1::JOB_STATE_CANCELLED,
              tally::v1::JOB_STATE_FAILED};
  q.limit = 1000;
  while (true) {
    ASSIGN_OR_RETURN(std::vector<store::JobRecord> page, store_->ListJobs(q));
    for (const auto& r : page) {
      const tally::v1::JobState st = r.job().state();
      if (st == tally::v1::JOB_STATE_SUCCEEDED || st == tally::v1::JOB_STATE_EARLY_STOPPED ||
          st == tally::v1::JOB_STATE_BUDGET_EXHAUSTED) {
        ledger_.RecordFinished(r.job());
      }
      if (!job_metrics_.WithinRetention(r.job(), now)) continue;
      std::map<std::string, int64_t> ended_by_outcome;
      if (r.job().attempt() > 0) {
        ASSIGN_OR_RETURN(std::vector<store::AttemptRecord> attempts, store_->ListAttempts(r.id()));
        for (const auto& a : attempts) {
          if (a.state() != store::ATTEMPT_STATE_RUNNING) ++ended_by_outcome[Outcome(a.state())];
        }
      }
      job_metrics_.RestoreEnded(r.job(), ended_by_outcome, now);
    }
    if (static_cast<int>(page.size()) < q.limit) break;
    q.before_id = page.back().id();
  }
  // Known workers keep their records (GPU type, slots) for the dashboards.
  ASSIGN_OR_RETURN(std::vector<store::WorkerRecord> stored, store_->ListWorkers());
  for (const auto& w : stored) {
    if (WorkerState* ws = workers_.Find(w.worker_id())) ws->rec = w;
  }
  UpdateGauges();
  return absl::OkStatus();
}

absl::StatusOr<tally::v1::Job> Scheduler::Submit(tally::v1::JobSpec spec,
                                                 const std::string& request_id,
                                                 const Actor& by) {
  ASSIGN_OR_RETURN(PreparedSubmit prepared, PrepareSubmit(std::move(spec), request_id, by));
  ASSIGN_OR_RETURN(store::CreateResult created, store_->CreateJob(prepared.rec, prepared.first));
  return ActOnSubmit(prepared, created);
}

absl::StatusOr<Scheduler::PreparedSubmit> Scheduler::PrepareSubmit(tally::v1::JobSpec spec,
                                                                   const std::string& request_id,
                                                                   const Actor& by) const {
  RETURN_IF_ERROR(ValidateRequestId(request_id));
  RETURN_IF_ERROR(PrepareJobSpec(&spec));
  RETURN_IF_ERROR(CheckTenantQuota(by.tenant));
  PreparedSubmit p;
  p.now = clock_->Now();
  tally::v1::Job& job = *p.rec.mutable_job();
  *job.mutable_spec() = spec;
  job.set_state(tally::v1::JOB_STATE_QUEUED);
  job.set_state_reason("waiting for a worker");
  *job.mutable_create_time() = ToProto(p.now);
  job.set_request_id(request_id);
  job.set_tenant(by.tenant);
  job.set_submitted_by(by.name);
  *job.mutable_cost()->mutable_estimate() = ledger_.Estimate(spec);
  job.mutable_cost()->set_usd_per_gpu_hour(ledger_.prices().Price(spec.resources().gpu_type()));
  p.first.set_type("submitted");
  p.first.set_state(tally::v1::JOB_STATE_QUEUED);
  *p.first.mutable_time() = ToProto(p.now);
  p.first.set_detail(absl::StrCat("needs ", spec.resources().gpu_count(), " x ",
                                  spec.resources().gpu_type(), ", priority ", spec.priority()));
  p.first.set_principal(by.name);
  return p;
}

tally::v1::Job Scheduler::ActOnSubmit(const PreparedSubmit& prepared,
                                      const store::CreateResult& created) {
  if (created.created && active_.count(created.job.id()) == 0) {
    ActiveJob& a = active_[created.job.id()];
    a.rec = created.job;
    a.queued_since = prepared.now;
    transitions_->Add({{"state", "queued"}}).Increment();
    store::Mutation committed;
    committed.job = created.job;
    committed.events.push_back(prepared.first);
    committed.events[0].set_job(created.job.job().name());
    committed.events[0].set_sequence(1);
    for (CommitObserver* o : observers_) o->OnJobCommitted(created.job, committed);
  }
  return created.job.job();
}

absl::Status Scheduler::EndedError(int64_t job_id, absl::string_view what) const {
  ASSIGN_OR_RETURN(store::JobRecord rec, store_->GetJob(job_id));
  if (!store::IsTerminal(rec.job().state())) {
    // Committed by a submit whose caller has not yet handed it over
    // (ActOnSubmit): it is queued a moment from now.
    return absl::UnavailableError(absl::StrCat(
        rec.job().name(), " was just submitted and is not queued yet; retry in a moment"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(rec.job().name(), " has already ended (", StateName(rec.job().state()),
                   "); only QUEUED or RUNNING jobs can ", what));
}

absl::StatusOr<tally::v1::Job> Scheduler::Cancel(int64_t job_id, const std::string& reason,
                                                 const std::string& by) {
  auto it = active_.find(job_id);
  if (it == active_.end()) return EndedError(job_id, "be cancelled");
  std::string why = reason.empty() ? "cancelled by request" : absl::StrCat("cancelled: ", reason);
  if (!by.empty()) absl::StrAppend(&why, " (by ", by, ")");
  Plan p = PlanStopNow(it->second, tally::v1::JOB_STATE_CANCELLED, "cancelled", why, "");
  p.rec.mutable_job()->set_cancelled_by(by);
  for (tally::v1::JobEvent& e : p.events) e.set_principal(by);
  tally::v1::Job ended = p.rec.job();
  RETURN_IF_ERROR(Execute(job_id, std::move(p)));
  return ended;
}

absl::StatusOr<tally::v1::Job> Scheduler::SetTarget(int64_t job_id, double target,
                                                    const std::string& why) {
  if (!std::isfinite(target) || target <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "target_val_loss: must be a positive finite number, got ", target));
  }
  auto it = active_.find(job_id);
  if (it == active_.end()) return EndedError(job_id, "have a target set");
  const ActiveJob& job = it->second;
  if (job.rec.job().target_val_loss() == target || job.rec.job().has_pending_stop()) {
    return job.rec.job();
  }
  Plan p = NewPlan(job, clock_->Now());
  tally::v1::Job& j = *p.rec.mutable_job();
  j.set_target_val_loss(target);
  j.clear_target_reached();
  AddEvent(p, "target", absl::StrFormat("target val_loss %.4f: %s", target, why), "");
  if (std::optional<EvalEvent> reached = RecordTargetReached(j)) {
    AddEvent(p, *reached);
    const std::string& reason = reached->reason;
    const tally::v1::EvalResult ev = LatestEval(j);
    if (j.state() == tally::v1::JOB_STATE_RUNNING && p.attempt &&
        ev.step() < j.spec().training().max_steps()) {
      PendingStopFor(p, tally::v1::JOB_STATE_SUCCEEDED, "succeeded", reason, policy::rules::kTarget,
                     ev);
    } else if (j.state() == tally::v1::JOB_STATE_QUEUED) {
      Plan stop = PlanStopNow(job, tally::v1::JOB_STATE_SUCCEEDED, "succeeded", reason, "");
      stop.end_rule = policy::rules::kTarget;
      // Keep what this plan recorded (the target and where it was reached).
      stop.rec.mutable_job()->set_target_val_loss(target);
      *stop.rec.mutable_job()->mutable_target_reached() = j.target_reached();
      p = std::move(stop);
    }
  }
  tally::v1::Job out = p.rec.job();
  RETURN_IF_ERROR(Execute(job_id, std::move(p)));
  return out;
}

absl::StatusOr<tally::v1::Job> Scheduler::StopJob(int64_t job_id, JobState state,
                                                  const std::string& rule,
                                                  const std::string& reason) {
  auto it = active_.find(job_id);
  if (it == active_.end()) return EndedError(job_id, "be stopped");
  const ActiveJob& job = it->second;
  if (job.rec.job().has_pending_stop()) return job.rec.job();  // stopping already
  const std::string type = state == tally::v1::JOB_STATE_EARLY_STOPPED ? "early_stopped"
                           : state == tally::v1::JOB_STATE_BUDGET_EXHAUSTED
                               ? "budget_exhausted"
                               : absl::AsciiStrToLower(StateName(state));
  Plan p = NewPlan(job, clock_->Now());
  const tally::v1::Job& j = p.rec.job();
  if (j.state() == tally::v1::JOB_STATE_RUNNING && p.attempt && j.curve_size() > 0) {
    PendingStopFor(p, state, type, reason, rule, LatestEval(j));
  } else {
    p = PlanStopNow(job, state, type, reason, absl::StrCat("rule ", rule));
    p.rec.mutable_job()->mutable_early_stopping()->set_stop_rule(rule);
    p.end_rule = rule;
    if (state == tally::v1::JOB_STATE_EARLY_STOPPED) p.early_stop_rule = rule;
  }
  tally::v1::Job out = p.rec.job();
  RETURN_IF_ERROR(Execute(job_id, std::move(p)));
  return out;
}

absl::StatusOr<tally::v1::Job> Scheduler::HoldJob(int64_t job_id, const std::string& holder,
                                                  const std::string& reason) {
  auto it = active_.find(job_id);
  if (it == active_.end()) return EndedError(job_id, "be held");
  const ActiveJob& job = it->second;
  const tally::v1::Job& current = job.rec.job();
  if (!current.hold().empty() || current.has_pending_stop()) return current;
  Plan p = NewPlan(job, clock_->Now());
  if (!current.preemption().pending_for().empty()) {
    // Already leaving its slot (for a job of higher priority): that
    // preemption stands; once requeued, the hold keeps it there.
    AddEvent(p, "held", reason, "kept out of placement until released, once its preemption ends");
  } else if (current.state() == tally::v1::JOB_STATE_RUNNING && p.attempt) {
    // Out of its slot first: it checkpoints and requeues, held.
    p = PlanPreempting(job, holder, reason);
  } else {
    AddEvent(p, "held", reason, "kept out of placement until released");
  }
  p.rec.mutable_job()->set_hold(reason);
  tally::v1::Job out = p.rec.job();
  RETURN_IF_ERROR(Execute(job_id, std::move(p)));
  return out;
}

absl::StatusOr<tally::v1::Job> Scheduler::ReleaseJob(int64_t job_id, const std::string& reason) {
  auto it = active_.find(job_id);
  if (it == active_.end()) return EndedError(job_id, "be released");
  const ActiveJob& job = it->second;
  if (job.rec.job().hold().empty()) return job.rec.job();
  Plan p = NewPlan(job, clock_->Now());
  p.rec.mutable_job()->clear_hold();
  AddEvent(p, "released", reason, "placeable again");
  tally::v1::Job out = p.rec.job();
  const absl::Time now = p.now;
  RETURN_IF_ERROR(Execute(job_id, std::move(p)));
  // Its wait in the queue starts now: the time held is not a queue's.
  auto again = active_.find(job_id);
  if (again != active_.end()) again->second.queued_since = now;
  return out;
}

void Scheduler::SendStop(const std::string& worker_id, const std::string& job, int32_t attempt,
                         const std::string& reason) {
  if (!workers_.Connected(worker_id)) return;
  channel_->Send(worker_id, StopMessage(job, attempt, reason));
}

std::string Scheduler::PickRendezvous(const std::string& leader) const {
  if (!workers_.CanLead(leader)) return "";  // the ranks fail with "rendezvous: is required"
  const store::WorkerRecord& rec = workers_.Find(leader)->rec;
  std::set<std::string> taken;
  for (const auto& [id, job] : active_) {
    if (job.attempt && job.attempt->worker_ids_size() > 1 && job.attempt->worker_ids(0) == leader) {
      taken.insert(job.attempt->rendezvous());
    }
  }
  for (int k = 0; k < std::max(1, rec.slots()); ++k) {
    std::string address = absl::StrCat(rec.rendezvous_host(), ":", rec.rendezvous_port() + k);
    if (!taken.count(address)) return address;
  }
  return absl::StrCat(rec.rendezvous_host(), ":", rec.rendezvous_port());
}

absl::Status Scheduler::ValidateHello(const tally::v1::Hello& hello) {
  if (hello.worker_id().empty() || hello.worker_id().size() > 128) {
    return absl::InvalidArgumentError("hello.worker_id: must be 1-128 characters");
  }
  if (hello.slots() < 1 || hello.slots() > 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.slots: must be between 1 and 1024, got ", hello.slots()));
  }
  if (hello.rendezvous_port() < 0 || hello.rendezvous_port() + hello.slots() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.rendezvous_port: must be 0 (cannot lead a multi-GPU attempt) or a port with room "
        "for one per slot below 65536, got ", hello.rendezvous_port()));
  }
  if (hello.gpu_type().empty()) {
    return absl::InvalidArgumentError("hello.gpu_type: is required (e.g. \"cpu\")");
  }
  // It becomes a label of every fleet series: bounded like one.
  RETURN_IF_ERROR(CheckLabelValue("hello.gpu_type", hello.gpu_type()));
  if (hello.device().size() > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.device: at most 64 bytes, got ", hello.device().size()));
  }
  if (hello.version().size() > 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.version: at most 128 bytes, got ", hello.version().size()));
  }
  if (hello.rendezvous_host().size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.rendezvous_host: at most 255 bytes, got ", hello.rendezvous_host().size()));
  }
  if (hello.capabilities_size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.capabilities: at most 64, got ", hello.capabilities_size()));
  }
  for (const std::string& c : hello.capabilities()) {
    if (c.size() > 64) {
      return absl::InvalidArgumentError(
          absl::StrCat("hello.capabilities: each at most 64 bytes, got ", c.size()));
    }
  }
  if (hello.running_size() > hello.slots()) {
    return absl::InvalidArgumentError(absl::StrCat("hello.running: at most hello.slots (",
                                                   hello.slots(), ") attempts, got ",
                                                   hello.running_size()));
  }
  if (!hello.capacity().empty() && hello.capacity() != "spot" &&
      hello.capacity() != "on_demand") {
    return absl::InvalidArgumentError(absl::StrCat(
        "hello.capacity: must be \"spot\" or \"on_demand\" (tally-worker --capacity), got ",
        QuoteForMessage(hello.capacity(), 64)));
  }
  return absl::OkStatus();
}

bool Scheduler::WorkerLive(const std::string& worker_id) const {
  return workers_.Live(worker_id, clock_->Now());
}

absl::StatusOr<int64_t> Scheduler::OnHello(const tally::v1::Hello& hello) {
  RETURN_IF_ERROR(ValidateHello(hello));
  const absl::Time now = clock_->Now();
  store::WorkerRecord rec;
  if (const WorkerState* known = workers_.Find(hello.worker_id())) rec = known->rec;
  const auto first_seen = rec.has_first_seen() ? rec.first_seen() : ToProto(now);
  rec.set_worker_id(hello.worker_id());
  rec.set_device(hello.device());
  rec.set_gpu_type(hello.gpu_type());
  rec.set_slots(hello.slots());
  rec.clear_capabilities();
  for (const auto& c : hello.capabilities()) rec.add_capabilities(c);
  rec.set_version(hello.version());
  rec.set_rendezvous_host(hello.rendezvous_host());
  rec.set_rendezvous_port(hello.rendezvous_port());
  rec.set_capacity(hello.capacity().empty() ? "on_demand" : hello.capacity());
  *rec.mutable_first_seen() = first_seen;
  *rec.mutable_last_seen() = ToProto(now);
  RETURN_IF_ERROR(store_->PutWorker(rec));

  WorkerState& ws = workers_.Add(hello.worker_id());
  // A worker that went away after its notice (a spot VM reclaimed before its
  // exits were delivered) comes back as a new process under the same id.
  const std::string draining_before_hello = ws.draining;
  ws.rec = rec;
  ws.connected = true;
  ws.generation = next_generation_++;
  ws.last_seen = now;
  // Dollar totals exist (at 0) for every GPU type that has a worker, so
  // dashboards and alerts see a series before the first dollar.
  ws.counted_lost = false;
  ws.draining.clear();
  AddGpuType(hello.gpu_type());

  tally::v1::ControllerMessage welcome;
  welcome.mutable_welcome()->set_heartbeat_interval_seconds(
      absl::ToDoubleSeconds(options_.heartbeat_interval));
  // The worker's stream (api::WorkerStream) acknowledges what OnMessage takes.
  welcome.mutable_welcome()->set_acks(true);
  channel_->Send(hello.worker_id(), welcome);

  std::set<AttemptKey> reported;
  for (const auto& r : hello.running()) {
    absl::StatusOr<int64_t> id = ParseJobName(r.job(), "hello.running.job");
    if (!id.ok()) continue;
    reported.insert({*id, r.attempt()});
  }
  // An exit the worker reported on its last stream whose commit failed
  // ends its attempt now, not as "forgotten" below.
  absl::Status first_error = RetryExits(hello.worker_id());
  // Attempts tallyd placed here that the worker no longer runs.
  std::vector<AttemptKey> forgotten;
  const std::string was_draining = draining_before_hello;
  for (const auto& [key, ranks] : ws.held) {
    if (!reported.count(key)) forgotten.push_back(key);
  }
  for (const auto& key : forgotten) {
    auto it = active_.find(key.first);
    if (it == active_.end() || !it->second.attempt || it->second.attempt->attempt() != key.second) {
      workers_.Release(hello.worker_id(), key);
      continue;
    }
    absl::StatusOr<Plan> p = LoseAttempt(
        it->second, was_draining,
        absl::StrCat("worker ", hello.worker_id(), " reconnected without it (the worker restarted)"));
    absl::Status s = p.status();
    if (p.ok()) {
      p->release.emplace_back(hello.worker_id(), key);
      s = Execute(key.first, *std::move(p));
    }
    if (!s.ok() && first_error.ok()) first_error = s;
  }
  // Each rank it runs of an attempt tallyd no longer runs there, by attempt.
  std::map<AttemptKey, int> stale_ranks;
  for (const auto& r : hello.running()) {
    ActiveJob* job = CurrentAttempt(r.job(), r.attempt());
    const int ranks =
        job == nullptr ? 0
                       : static_cast<int>(std::count(job->attempt->worker_ids().begin(),
                                                     job->attempt->worker_ids().end(),
                                                     hello.worker_id()));
    if (ranks == 0) {
      SendStop(hello.worker_id(), r.job(), r.attempt(),
               "stale attempt: tallyd no longer runs it here");
      if (absl::StatusOr<int64_t> id = ParseJobName(r.job()); id.ok()) {
        ++stale_ranks[{*id, r.attempt()}];
      }
      continue;
    }
    Plan p = NewPlan(*job, now);
    AddEvent(p, "adopted", "worker reconnected",
             absl::StrCat("attempt ", r.attempt(), " on ", hello.worker_id()),
             tally::v1::JOB_STATE_RUNNING);
    p.hold.emplace_back(hello.worker_id(), AttemptKey{job->rec.id(), r.attempt()}, ranks);
    // A stop or a preemption decided before the worker went away: ask again.
    if (job->rec.job().has_pending_stop()) {
      p.sends.emplace_back(hello.worker_id(),
                           StopMessage(r.job(), r.attempt(),
                                       job->rec.job().pending_stop().reason(), true));
    } else if (!job->rec.job().preemption().pending_for().empty()) {
      p.sends.emplace_back(hello.worker_id(),
                           StopMessage(r.job(), r.attempt(),
                                       job->rec.job().preemption().pending_reason(), true, true));
    }
    if (absl::Status s = Execute(job->rec.id(), std::move(p)); !s.ok() && first_error.ok()) {
      first_error = s;
    }
  }
  // Until their exits arrive the worker is busy with them: nothing new is
  // placed on those slots (e.g. attempts tallyd gave up on while the worker
  // could not reach it). Set, not added: a hold kept while it was silent
  // is the same ranks.
  for (const auto& [key, ranks] : stale_ranks) workers_.Hold(hello.worker_id(), key, ranks);
  if (!first_error.ok()) {
    // Nothing is attached for a refused Hello: the worker must not look
    // connected (work would be placed on it); its next Hello reconciles again.
    workers_.Add(hello.worker_id()).connected = false;
    UpdateGauges();
    return first_error;
  }
  UpdateGauges();
  return ws.generation;
}

void Scheduler::OnDisconnect(const std::string& worker_id, int64_t generation) {
  WorkerState* found = workers_.Find(worker_id);
  if (found == nullptr || found->generation != generation) return;
  WorkerState& ws = *found;
  ws.connected = false;
  // Announced (a notice) and nothing left to hand back: a clean exit, not
  // a loss. Anything else is found silent past the heartbeat timeout.
  if (!ws.draining.empty() && ws.held.empty() && ws.unconfirmed_exits.empty() &&
      !ws.counted_lost) {
    ws.counted_lost = true;
    const std::string& type = ws.rec.gpu_type();
    worker_exits_->Add({{"gpu_type", type.empty() ? "unknown" : type}, {"cause", ws.draining}})
        .Increment();
  }
  UpdateGauges();
}

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
  tally::v1::Job& j = *job.rec.mutable_job();
  j.set_step(p.step());
  j.set_tokens(p.tokens());
  std::vector<metrics::MoeLayerHealth> moe;
  if (p.trained()) {
    j.set_train_loss(p.train_loss());
    j.set_padding_tokens(p.padding_tokens());
    // Steady-state step times, for recipe costs: a new step, past the
    // attempt's start-up reports.
    const bool same = job.progress_attempt == p.attempt();
    if (same && job.progress_reports >= policy::kStartupReports && p.step() > job.progress_step) {
      AddStepTime(p.step_seconds(), j.mutable_step_times());
    }
    if (p.moe_size() > 0) {
      job.routing_collapsed = false;
      job.collapse_where.clear();
      moe.reserve(p.moe_size());
      for (const auto& l : p.moe()) {
        moe.push_back(metrics::AssessMoeLayer(l, j.spec().model().moe().top_k()));
        const metrics::MoeLayerHealth& h = moe.back();
        if (!h.collapsed || job.routing_collapsed) continue;
        job.routing_collapsed = true;
        job.collapse_where =
            h.idle_experts > 0
                ? absl::StrFormat("layer %d has %d of %d experts idle (below %.0f%% of their "
                                  "fair share %.1f%% of its tokens)",
                                  h.layer, h.idle_experts, h.num_experts,
                                  100 * metrics::kIdleFractionOfFair, 100 * h.fair_share)
                : absl::StrFormat("layer %d expert %d took %.0f%% of its layer's tokens (fair "
                                  "share %.1f%%)",
                                  h.layer, h.busiest_expert, 100 * h.busiest_share,
                                  100 * h.fair_share);
      }
    }
  }
  job_metrics_.OnProgress(j, p, moe);
  const int64_t id = job.rec.id();
  const tally::v1::CostStatus accrued = ledger_.Accrue(j, true, now).cost;
  // A decided stop is not undone by the budget: stop_grace bounds its spend.
  std::optional<ledger::BudgetStop> stop;
  if (!j.has_pending_stop()) stop = ledger_.CheckBudget(j, accrued);
  if (stop) {
    return Execute(id, PlanStopNow(job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED,
                                   "budget_exhausted", stop->reason, stop->detail));
  }
  // The tenant's dollar quota, with this job's spend not yet committed.
  if (!j.has_pending_stop()) {
    if (std::optional<ledger::QuotaStop> q =
            ledger::CheckDollarQuota(j.tenant(), options_.quotas, spend_, now,
                                     accrued.cost_usd() - j.cost().cost_usd())) {
      Plan plan = PlanStopNow(job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, "budget_exhausted",
                              q->reason, q->detail);
      plan.end_rule = policy::rules::kTenantQuota;
      return Execute(id, std::move(plan));
    }
  }
  if (!p.fp8_grouped_off().empty() && j.fp8_grouped_off_attempt() != p.attempt()) {
    // Once per attempt: the worker's products got slower, not wrong.
    Plan plan = NewPlan(job, now);
    plan.rec.mutable_job()->set_fp8_grouped_off_attempt(p.attempt());
    AddEvent(plan, "warning",
             absl::StrCat("FP8 grouped expert products turned off for attempt ", p.attempt(),
                          ": ", QuoteForMessage(p.fp8_grouped_off(), 512)),
             "the experts run one by one in FP8 (same results, slower); the reason names "
             "what refused them (the worker's GPU, CUDA or PyTorch)");
    return Execute(id, std::move(plan));
  }
  if (now - job.last_progress_event < options_.progress_event_interval) {
    job_metrics_.Update(j, accrued);
    return absl::OkStatus();
  }
  Plan plan = NewPlan(job, now);
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

absl::Status CheckCheckpointPath(const std::string& job, const std::string& path,
                                 int64_t step) {
  // The folder workers write a job's checkpoints in, under their checkpoint
  // root: "jobs/7" -> "job-7" (worker/agent/path_confinement.h).
  const std::string folder = absl::StrReplaceAll(job, {{"s/", "-"}});
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.path ", QuoteForMessage(path, 200), " ", why,
        "; a worker writes a job's checkpoints as CHECKPOINT_ROOT/", folder, "/FILE"));
  };
  if (path.empty() || path.size() > 4096) return refuse("must be 1-4096 bytes");
  if (UnprintableReason(path)) return refuse("is not printable text");
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  for (size_t i = 0; i < parts.size(); ++i) {
    if ((parts[i].empty() && i > 0) || parts[i] == "." || parts[i] == "..") {
      return refuse("must not contain empty, \".\" or \"..\" components");
    }
  }
  if (parts.size() < 2 || parts[parts.size() - 2] != folder) {
    return refuse(absl::StrCat("is not in the job's checkpoint folder \"", folder, "\""));
  }
  // The file is the worker's own name for the step it reports
  // (step-00000010.ckpt), not any file that folder could hold.
  const absl::string_view file = parts.back();
  int64_t named = -1;
  if (!absl::ConsumePrefix(&parts.back(), "step-") || !absl::ConsumeSuffix(&parts.back(), ".ckpt") ||
      parts.back().empty() ||
      !std::all_of(parts.back().begin(), parts.back().end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(parts.back(), &named) || named != step) {
    return refuse(absl::StrCat("is not the checkpoint file of step ", step, " (",
                               absl::StrFormat("step-%08d.ckpt", step), "), got ",
                               QuoteForMessage(file, 80)));
  }
  return absl::OkStatus();
}

std::pair<std::string, int32_t> Scheduler::ReportedAttempt(const tally::v1::WorkerMessage& msg) {
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kProgress:
      return {msg.progress().job(), msg.progress().attempt()};
    case tally::v1::WorkerMessage::kEval:
      return {msg.eval().job(), msg.eval().attempt()};
    case tally::v1::WorkerMessage::kCheckpoint:
      return {msg.checkpoint().job(), msg.checkpoint().attempt()};
    case tally::v1::WorkerMessage::kExit:
      return {msg.exit().job(), msg.exit().attempt()};
    default:
      return {"", 0};
  }
}

absl::Status Scheduler::CheckReport(const tally::v1::WorkerMessage& msg) {
  auto counts = [](const char* what, int64_t step, int64_t tokens) -> absl::Status {
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".step: must not be negative, got ", step));
    }
    if (tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".tokens: must not be negative, got ", tokens));
    }
    return absl::OkStatus();
  };
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kProgress: {
      const tally::v1::Progress& p = msg.progress();
      if (p.padding_tokens() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "progress.padding_tokens: must not be negative, got ", p.padding_tokens()));
      }
      if (p.fp8_grouped_off().size() > 4096) {
        return absl::InvalidArgumentError(
            absl::StrCat("progress.fp8_grouped_off: at most 4096 bytes, got ",
                         p.fp8_grouped_off().size()));
      }
      if (p.fp8_values() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("progress.fp8_values: must not be negative, got ", p.fp8_values()));
      }
      if (p.fp8_overflows() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "progress.fp8_overflows: must not be negative, got ", p.fp8_overflows()));
      }
      // Bounds on what becomes metric series: no model has more.
      constexpr int kMaxMoeLayers = 1024, kMaxExperts = 4096, kMaxAmaxGroups = 256;
      if (p.moe_size() > kMaxMoeLayers) {
        return absl::InvalidArgumentError(absl::StrCat("progress.moe: at most ", kMaxMoeLayers,
                                                       " layers, got ", p.moe_size()));
      }
      for (const auto& l : p.moe()) {
        if (l.tokens_per_expert_size() > kMaxExperts) {
          return absl::InvalidArgumentError(absl::StrCat("progress.moe.tokens_per_expert: at most ",
                                                         kMaxExperts, " experts, got ",
                                                         l.tokens_per_expert_size()));
        }
        for (int64_t n : l.tokens_per_expert()) {
          if (n < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "progress.moe.tokens_per_expert: must not be negative, got ", n));
          }
        }
      }
      if (p.fp8_amax_size() > kMaxAmaxGroups) {
        return absl::InvalidArgumentError(absl::StrCat("progress.fp8_amax: at most ",
                                                       kMaxAmaxGroups, " groups, got ",
                                                       p.fp8_amax_size()));
      }
      // Each group becomes a series: only the trainer's own tensor groups.
      for (const auto& [group, amax] : p.fp8_amax()) {
        static const auto* const kGroups = new absl::flat_hash_set<std::string>{
            "attention.input", "attention.weight", "attention.grad",
            "ffn.input",       "ffn.weight",       "ffn.grad"};
        if (!kGroups->contains(group)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "progress.fp8_amax: unknown tensor group ", QuoteForMessage(group),
              " (known: {attention,ffn}.{input,weight,grad})"));
        }
      }
      return counts("progress", p.step(), p.tokens());
    }
    case tally::v1::WorkerMessage::kEval:
      return counts("eval", msg.eval().step(), msg.eval().tokens());
    case tally::v1::WorkerMessage::kCheckpoint:
      return counts("checkpoint", msg.checkpoint().step(), msg.checkpoint().tokens());
    case tally::v1::WorkerMessage::kExit:
      if (!msg.exit().preemption_cause().empty() &&
          !KnownPreemptionCause(msg.exit().preemption_cause())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "exit.preemption_cause: must be sigterm, sigint, notice_file, idle or priority, got ",
            QuoteForMessage(msg.exit().preemption_cause(), 64)));
      }
      return counts("exit", msg.exit().step(), 0);
    case tally::v1::WorkerMessage::kNotice: {
      const tally::v1::Notice& n = msg.notice();
      if (n.cause() != "sigterm" && n.cause() != "sigint" && n.cause() != "notice_file" &&
          n.cause() != "idle") {
        return absl::InvalidArgumentError(
            absl::StrCat("notice.cause: must be sigterm, sigint, notice_file or idle, got ",
                         QuoteForMessage(n.cause(), 64)));
      }
      if (!(n.deadline_seconds() >= 0 && n.deadline_seconds() <= 86400)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "notice.deadline_seconds: must be between 0 and 86400, got ", n.deadline_seconds()));
      }
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
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
      refused_reports_->Add({{"kind", kind}}).Increment();
      return nullptr;
    }
    return a;
  };

  // Every figure is checked before it reaches a record or a series; a
  // report out of range is counted and ends the worker's stream (it
  // reconnects; what it runs is adopted again).
  absl::Status valid = CheckReport(msg);
  if (valid.ok()) valid = CheckReportFigures(msg);
  if (valid.ok()) {
    if (const auto [job, attempt] = ReportedAttempt(msg); !job.empty()) {
      if (const ActiveJob* a = CurrentAttempt(job, attempt); a != nullptr) {
        valid = CheckReportAgainstSpec(a->rec.job().spec(), msg);
      }
    }
  }
  if (!valid.ok()) {
    refused_reports_->Add({{"kind", "invalid"}}).Increment();
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
        refused_reports_->Add({{"kind", "progress_out_of_order"}}).Increment();
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
        refused_reports_->Add({{"kind", "repeated"}}).Increment();
        break;
      }
      s = Execute(job->rec.id(), PlanEval(*job, msg.eval()));
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
  if (absl::Status where = CheckCheckpointPath(job.rec.job().name(), c.path(), c.step());
      !where.ok()) {
    // Never recorded, so never resumed from: the attempt fails saying why.
    absl::StatusOr<Plan> p =
        PlanEndAttempt(job, store::ATTEMPT_STATE_FAILED,
                       absl::StrCat("checkpoint record refused: ", where.message()),
                       /*may_retry=*/true);
    absl::Status s = p.ok() ? Execute(job.rec.id(), *std::move(p)) : p.status();
    // Counted once the failure has committed, like every other effect.
    if (s.ok()) refused_reports_->Add({{"kind", "checkpoint_path"}}).Increment();
    return s;
  }
  // An error here fails the report: a checkpoint priced against the wrong
  // previous one would be stored wrong for good.
  ASSIGN_OR_RETURN(const std::optional<tally::v1::Checkpoint> latest, LatestCheckpoint(job));
  if (RepeatedCheckpoint(latest, c)) {
    refused_reports_->Add({{"kind", "repeated"}}).Increment();
    return absl::OkStatus();
  }
  return Execute(job.rec.id(), PlanCheckpoint(job, c, latest));
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
    Plan p = NewPlan(active_.at(id), clock_->Now());
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
    refused_reports_->Add({{"kind", "exit"}}).Increment();
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
        plan = PlanFinishStop(*job, "the attempt completed before the stop arrived",
                              store::ATTEMPT_STATE_SUCCEEDED);
        break;
      }
      Plan p = NewPlan(*job, clock_->Now());
      p.attempt->set_state(store::ATTEMPT_STATE_SUCCEEDED);
      *p.attempt->mutable_end_time() = ToProto(p.now);
      p.attempt->set_reason(exit.reason());
      p.write_attempt = true;
      // The other ranks end the same step; any still running is told to stop.
      StopOrders(p, "the attempt succeeded", /*checkpoint=*/false, worker_id);
      p.attempts_ended.push_back("succeeded");
      p.rec.mutable_job()->clear_pending_stop();
      AddEvent(p, "succeeded", exit.reason().empty() ? "completed" : exit.reason(), "",
               tally::v1::JOB_STATE_SUCCEEDED);
      p.keep_attempt = false;
      p.finished = true;
      plan = std::move(p);
      break;
    }
    case tally::v1::ATTEMPT_OUTCOME_FAILED: {
      if ((pending || preempting) && gang && !lead) return release_now();  // rank 0 ends it
      if (exit.not_started()) {
        // Refused before it ran (the worker was still stopping an attempt
        // tallyd had given up on, or is shutting down): nothing was tried.
        plan = PlanEndAttempt(*job, store::ATTEMPT_STATE_FAILED,
                              absl::StrCat("worker ", worker_id,
                                           " did not start it: ", exit.reason()),
                              /*may_retry=*/true, {.not_counted = true});
        break;
      }
      EndAttemptNotes notes;
      if (!exit.damaged_checkpoint().empty()) {
        absl::StatusOr<EndAttemptNotes> damaged = DamagedCheckpointNotes(*job, exit);
        RETURN_IF_ERROR(damaged.status());
        notes = *std::move(damaged);
      }
      // A claim about another checkpoint is refused (counted once the
      // failure commits) and the exit is a plain failure.
      refused_damage_claim = !exit.damaged_checkpoint().empty() && !notes.damaged;
      plan = PlanEndAttempt(*job, store::ATTEMPT_STATE_FAILED, exit.reason(),
                            exit.retryable() || notes.damaged.has_value(), notes);
      break;
    }
    case tally::v1::ATTEMPT_OUTCOME_PREEMPTED:
      // Rank 0 reports the preemption checkpoint before its exit: its exit
      // requeues the job (another rank's may come first).
      if (gang && !lead) return release_now();
      plan = PlanPreempted(*job, PreemptionCause(*job, exit), exit.reason(), exit.step());
      break;
    default:
      if (pending) {
        // The stop it was asked for: rank 0 reports the final checkpoint
        // before its exit, so its exit ends the job.
        if (gang && exit.rank() != 0) return release_now();
        plan = PlanFinishStop(*job, "");
        break;
      }
      if (preempting) {
        // Stopped on the preemption order (a worker that checkpointed it).
        if (gang && !lead) return release_now();
        plan = PlanPreempted(*job, OrderedPreemptionCause(job->rec.job()), exit.reason(),
                             exit.step());
        break;
      }
      plan = PlanEndAttempt(*job, store::ATTEMPT_STATE_STOPPED,
                            absl::StrCat("worker ", worker_id, " stopped it: ", exit.reason()),
                            true);
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
  if (refused_damage_claim) refused_reports_->Add({{"kind", "damaged_checkpoint"}}).Increment();
  return absl::OkStatus();
}

absl::StatusOr<Scheduler::EndAttemptNotes> Scheduler::DamagedCheckpointNotes(
    const ActiveJob& job, const tally::v1::AttemptExit& exit) const {
  EndAttemptNotes notes;
  ASSIGN_OR_RETURN(std::vector<tally::v1::Checkpoint> checkpoints,
                   store_->ListCheckpoints(job.rec.id()));
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

absl::Status Scheduler::Tick() {
  const absl::Time now = clock_->Now();
  absl::Status first_error;
  auto note = [&](const absl::Status& s) {
    if (!s.ok() && first_error.ok()) first_error = s;
  };
  // 0. Exits whose commit failed.
  std::vector<std::string> with_exits;
  for (const auto& [id, ws] : workers_.all()) {
    if (!ws.unconfirmed_exits.empty()) with_exits.push_back(id);
  }
  for (const auto& id : with_exits) note(RetryExits(id));
  // 1. Workers silent past the timeout lose what they hold. Each attempt's
  // loss commits on its own; one that fails stays held and is retried.
  for (const std::string& worker_id : workers_.Ids()) {
    WorkerState& ws = *workers_.Find(worker_id);
    const absl::Duration silent = now - ws.last_seen;
    if (silent <= options_.heartbeat_timeout) continue;
    const std::string reason = absl::StrCat(
        "worker ", worker_id, " silent for ", ShortSeconds(silent), " (heartbeat timeout ",
        ShortSeconds(options_.heartbeat_timeout), ")");
    const auto held = ws.held;
    const std::string draining = ws.draining;
    bool all_released = true;
    // A worker still connected may only be paused (SIGSTOP, a stalled VM):
    // what it ran may still be running there. Its slots stay held until it
    // reports those attempts' exits (they get stop orders), reconnects
    // without them, or its stream ends, so nothing new is placed on a slot
    // it would have to refuse.
    const bool connected = ws.connected;
    for (const auto& [key, ranks] : held) {
      auto jit = active_.find(key.first);
      if (jit == active_.end() || !jit->second.attempt ||
          jit->second.attempt->attempt() != key.second) {
        if (!connected) ws.held.erase(key);
        continue;
      }
      absl::StatusOr<Plan> p = LoseAttempt(jit->second, draining, reason);
      absl::Status s = p.status();
      if (p.ok()) {
        if (!connected) p->release.emplace_back(worker_id, key);
        s = Execute(key.first, *std::move(p));
      }
      if (!s.ok()) all_released = false;
      note(s);
    }
    // Counted once its attempts' losses have committed (a failed commit is
    // retried on the next pass, and counted then).
    if (all_released && !ws.counted_lost) {
      ws.counted_lost = true;
      const std::string& type = ws.rec.gpu_type();
      workers_lost_->Add({{"gpu_type", type.empty() ? "unknown" : type}}).Increment();
    }
    if (!ws.connected && all_released && ws.unconfirmed_exits.empty()) workers_.Forget(worker_id);
  }

  // Series retention and quota windows move by seconds and hours: once a
  // second is enough (each walks every job with series or every tenant).
  if (now - last_housekeeping_ >= absl::Seconds(1)) {
    job_metrics_.Expire(now);
    spend_.Prune(now);
    last_housekeeping_ = now;
  }
  // 2. Budgets and stop deadlines, on a view of each running job.
  std::vector<int64_t> running;
  for (const auto& [id, job] : active_) {
    if (job.rec.job().state() == tally::v1::JOB_STATE_RUNNING) running.push_back(id);
  }
  // Each running job's cost accrued to now (a view), and for each tenant
  // with a quota what its running jobs spent since their last commit, which
  // the committed windows do not hold yet.
  std::vector<ledger::Accrual> accrued;  // by position in `running`
  accrued.reserve(running.size());
  std::map<std::string, double> uncommitted;
  for (int64_t id : running) {
    const ActiveJob& job = active_.at(id);
    accrued.push_back(ledger_.Accrue(job.rec.job(), job.attempt.has_value(), now));
    if (options_.quotas.count(job.rec.job().tenant())) {
      uncommitted[job.rec.job().tenant()] += accrued.back().added_usd;
    }
  }
  for (size_t i = 0; i < running.size(); ++i) {
    const int64_t id = running[i];
    auto jit = active_.find(id);
    if (jit == active_.end()) continue;
    const ActiveJob& job = jit->second;
    const tally::v1::Job& view = job.rec.job();
    const tally::v1::CostStatus& cost = accrued[i].cost;
    std::optional<ledger::BudgetStop> stop;
    std::optional<ledger::QuotaStop> quota;
    if (!view.has_pending_stop()) {
      stop = ledger_.CheckBudget(view, cost);
      auto u = uncommitted.find(view.tenant());
      if (!stop && u != uncommitted.end()) {
        quota = ledger::CheckDollarQuota(view.tenant(), options_.quotas, spend_, now, u->second);
      }
    }
    if (stop) {
      note(Execute(id, PlanStopNow(job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, "budget_exhausted",
                                   stop->reason, stop->detail)));
    } else if (quota) {
      // The tenant's running jobs together reached its cap: each stops (the
      // job ended here commits its spend, so the next is judged on it).
      Plan plan = PlanStopNow(job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, "budget_exhausted",
                              quota->reason, quota->detail);
      plan.end_rule = policy::rules::kTenantQuota;
      const double added = plan.cost_added_usd;
      const std::string tenant = view.tenant();  // the job leaves active_ on commit
      if (absl::Status s = Execute(id, std::move(plan)); s.ok()) {
        uncommitted[tenant] -= added;  // committed now: in the windows
      } else {
        note(s);
      }
    } else if (view.has_pending_stop() && now >= FromProto(view.pending_stop().deadline())) {
      absl::StatusOr<Plan> p = PlanFinishStop(
          job, absl::StrCat("the workers did not confirm the stop within ",
                            ShortSeconds(options_.stop_grace)));
      note(p.ok() ? Execute(id, *std::move(p)) : p.status());
    } else if (!view.preemption().pending_for().empty() &&
               now >= FromProto(view.preemption().pending_deadline())) {
      // The workers did not confirm: preempted without their checkpoint
      // (their slots stay held until they report the exit or are lost).
      absl::StatusOr<Plan> p = PlanPreempted(
          job, OrderedPreemptionCause(view),
          absl::StrCat(view.preemption().pending_reason(), "; the workers did not confirm within ",
                       ShortSeconds(options_.stop_grace)),
          0);
      note(p.ok() ? Execute(id, *std::move(p)) : p.status());
    } else {
      job_metrics_.Update(view, cost);
    }
  }

  // 3. Start what fits. With a tenant's max_gpus, its jobs are offered to
  // the placement in priority, then submission, order while they fit under
  // it; past it, a job waits and says why.
  std::vector<policy::QueuedJob> queued = QueuedJobs();
  // While a job waits for the slots its preemptions free (until every
  // victim rank's slot is released, not only until the victims requeue),
  // nothing of lower priority that could use them starts on its GPU type:
  // it would take them first.
  std::set<int64_t> waiting_jobs;
  for (const auto& [id, job] : active_) {
    const std::string& for_job = job.rec.job().preemption().pending_for();
    if (absl::StatusOr<int64_t> w = ParseJobName(for_job); w.ok()) waiting_jobs.insert(*w);
  }
  for (auto r = reserved_.begin(); r != reserved_.end();) {
    auto wit = active_.find(r->first);
    if (wit == active_.end() || wit->second.rec.job().state() != tally::v1::JOB_STATE_QUEUED) {
      r = reserved_.erase(r);
      continue;
    }
    for (auto slot = r->second.begin(); slot != r->second.end();) {
      slot = workers_.Held(slot->first, slot->second) == 0 ? r->second.erase(slot)
                                                           : std::next(slot);
    }
    if (r->second.empty()) {
      r = reserved_.erase(r);
    } else {
      waiting_jobs.insert(r->first);
      ++r;
    }
  }
  std::vector<const tally::v1::JobSpec*> awaiting;
  for (int64_t w : waiting_jobs) {
    auto wit = active_.find(w);
    if (wit == active_.end() || wit->second.rec.job().state() != tally::v1::JOB_STATE_QUEUED) {
      continue;
    }
    awaiting.push_back(&wit->second.rec.job().spec());
  }
  if (!awaiting.empty()) {
    // Capacities overlap unless one wants spot only and the other on-demand only.
    const auto overlap = [](const std::string& a, const std::string& b) {
      return !((a == "spot" && b == "on_demand") || (a == "on_demand" && b == "spot"));
    };
    queued.erase(std::remove_if(queued.begin(), queued.end(),
                                [&](const policy::QueuedJob& q) {
                                  for (const tally::v1::JobSpec* s : awaiting) {
                                    if (s->resources().gpu_type() == q.gpu_type &&
                                        q.priority < s->priority() &&
                                        overlap(s->resources().capacity(), q.capacity)) {
                                      return true;
                                    }
                                  }
                                  return false;
                                }),
                 queued.end());
  }
  std::vector<std::pair<int64_t, std::string>> over_quota;
  queued = OfferUnderQuotas(std::move(queued), now, &over_quota);
  // A job held back by its tenant's quota says so (once, not every tick).
  for (const auto& [id, why] : over_quota) {
    const ActiveJob& job = active_.at(id);
    if (job.rec.job().state_reason() == why) continue;
    Plan p = NewPlan(job, now);
    p.rec.mutable_job()->set_state_reason(why);
    AddEvent(p, "waiting", why, "");
    note(Execute(id, std::move(p)));
  }
  if (!queued.empty()) {
    std::set<int64_t> started;
    for (const auto& placed : policy::PlaceJobs(queued, workers_.FreeSlots(now))) {
      absl::StatusOr<Plan> p = PlanStart(active_.at(placed.job_id), placed.rank_workers);
      absl::Status s = p.ok() ? Execute(placed.job_id, *std::move(p)) : p.status();
      if (s.ok()) started.insert(placed.job_id);
      note(s);
    }
    if (options_.priority_preemption) {
      queued.erase(std::remove_if(queued.begin(), queued.end(),
                                  [&](const policy::QueuedJob& q) { return started.count(q.id); }),
                   queued.end());
      PreemptForWaiting(queued, now, note);
    }
  }
  UpdateGauges();
  return first_error;
}

void Scheduler::PreemptForWaiting(const std::vector<policy::QueuedJob>& waiting, absl::Time now,
                                  const std::function<void(const absl::Status&)>& note) {
  if (waiting.empty()) return;
  // Running attempts, and the lowest priority running per GPU type: a
  // waiting job at or below it cannot preempt anything (the common case of
  // a full fleet of equal priority costs one pass).
  const auto stopping = [](const tally::v1::Job& j) {
    return j.has_pending_stop() || !j.preemption().pending_for().empty();
  };
  std::map<std::string, int> lowest;
  for (const auto& [id, job] : active_) {
    const tally::v1::Job& j = job.rec.job();
    if (j.state() != tally::v1::JOB_STATE_RUNNING || !job.attempt || stopping(j)) continue;
    const std::string& gpu_type = j.spec().resources().gpu_type();
    auto [it, fresh] = lowest.emplace(gpu_type, j.spec().priority());
    if (!fresh) it->second = std::min(it->second, j.spec().priority());
  }
  const auto may_preempt = [&](const policy::QueuedJob& q) {
    auto low = lowest.find(q.gpu_type);
    return low != lowest.end() && q.priority > low->second;
  };
  if (std::none_of(waiting.begin(), waiting.end(), may_preempt)) return;

  std::vector<policy::RunningAttempt> running;
  std::set<std::string> awaited;  // jobs whose preemptions are in flight
  for (const auto& [id, slots] : reserved_) {
    if (auto a = active_.find(id); a != active_.end()) awaited.insert(a->second.rec.job().name());
  }
  for (const auto& [id, job] : active_) {
    const tally::v1::Job& j = job.rec.job();
    if (!j.preemption().pending_for().empty()) awaited.insert(j.preemption().pending_for());
    if (j.state() != tally::v1::JOB_STATE_RUNNING || !job.attempt) continue;
    policy::RunningAttempt& r = running.emplace_back();
    r.job_id = id;
    r.priority = j.spec().priority();
    r.gpu_type = j.spec().resources().gpu_type();
    r.tenant = j.tenant();
    r.rank_workers.assign(job.attempt->worker_ids().begin(), job.attempt->worker_ids().end());
    r.started = FromProto(job.attempt->start_time());
    if (job.last_checkpoint) r.last_checkpoint = FromProto(job.last_checkpoint->time());
    r.stopping = stopping(j);
  }
  std::vector<policy::WorkerSlots> free = workers_.FreeSlots(now);
  std::vector<std::pair<std::string, std::string>> capacity;
  for (const auto& [id, ws] : workers_.all()) {
    // Slots freed on a worker nothing can be placed on serve no one: a
    // capacity no job accepts.
    capacity.emplace_back(id, workers_.Placeable(ws, now) ? ws.rec.capacity() : "unavailable");
  }
  std::vector<policy::QueuedJob> order = waiting;
  std::stable_sort(order.begin(), order.end(), policy::OfferedBefore);
  policy::PreemptionOptions options;
  options.min_runtime = options_.min_runtime_before_preemption;
  // Bounded work per pass: the first few waiting jobs of each GPU type.
  constexpr int kMaxTriesPerGpuType = 8;
  std::map<std::string, int> tries;
  for (const policy::QueuedJob& q : order) {
    if (!may_preempt(q)) continue;
    const ActiveJob& w = active_.at(q.id);
    if (awaited.count(w.rec.job().name())) continue;  // its victims are stopping
    if (++tries[q.gpu_type] > kMaxTriesPerGpuType) continue;
    std::vector<int64_t> preempted_by;
    for (const std::string& name : w.rec.job().preemption().preempted_by()) {
      if (absl::StatusOr<int64_t> id = ParseJobName(name); id.ok()) preempted_by.push_back(*id);
    }
    if (!options_.cross_tenant_preemption) options.only_tenant = w.rec.job().tenant();
    const policy::PreemptionDecision d =
        policy::ChoosePreemptions(q, preempted_by, free, running, capacity, now, options);
    if (d.victims.empty()) continue;
    // The free slots it counted are its own now: the next waiting job
    // does not count them again.
    int counted = std::max(1, q.gpu_count);
    for (policy::WorkerSlots& f : free) {
      if (f.gpu_type != q.gpu_type || !policy::CapacityMatches(q.capacity, f.capacity)) continue;
      const int take = std::min(std::max(0, f.free_slots), counted);
      f.free_slots -= take;
      counted -= take;
    }
    const std::string& name = w.rec.job().name();
    for (int64_t victim : d.victims) {
      auto vit = active_.find(victim);
      if (vit == active_.end()) continue;
      const int victim_priority = vit->second.rec.job().spec().priority();
      // Another tenant's job is not named to the victim's tenant.
      const bool same_tenant = vit->second.rec.job().tenant() == w.rec.job().tenant();
      const std::string reason =
          same_tenant ? absl::StrCat("preempted for ", name, " (priority ", q.priority, " > ",
                                     victim_priority, "): ", d.why)
                      : absl::StrCat("preempted for a higher-priority job (priority ",
                                     q.priority, " > ", victim_priority, ")");
      const std::optional<store::AttemptRecord> attempt = vit->second.attempt;
      absl::Status s = Execute(victim, PlanPreempting(vit->second, name, reason));
      note(s);
      if (!s.ok()) continue;
      // Its slots are the waiting job's until they are released.
      if (attempt) {
        for (const std::string& w : attempt->worker_ids()) {
          reserved_[q.id].insert({w, AttemptKey{victim, attempt->attempt()}});
        }
      }
      for (policy::RunningAttempt& r : running) {
        if (r.job_id == victim) r.stopping = true;
      }
    }
  }
}

std::optional<tally::v1::Job> Scheduler::ActiveJobView(int64_t job_id) const {
  auto it = active_.find(job_id);
  if (it == active_.end()) return std::nullopt;
  const ActiveJob& job = it->second;
  tally::v1::Job view = job.rec.job();
  const bool running =
      view.state() == tally::v1::JOB_STATE_RUNNING && job.attempt.has_value();
  *view.mutable_cost() = ledger_.Accrue(view, running, clock_->Now()).cost;
  return view;
}

absl::Status Scheduler::SetPrices(ledger::PriceTable prices) {
  const absl::Time now = clock_->Now();
  // What ran so far is committed at the old prices.
  std::vector<int64_t> ids;
  for (const auto& [id, job] : active_) ids.push_back(id);
  absl::Status failed;
  for (int64_t id : ids) {
    auto it = active_.find(id);
    if (it == active_.end()) continue;
    if (absl::Status s = Execute(id, NewPlan(it->second, now)); !s.ok() && failed.ok()) {
      failed = absl::Status(s.code(), absl::StrCat("jobs/", id, ": its spend at the old prices "
                                                   "was not committed: ", s.message()));
    }
  }
  if (!failed.ok()) return failed;
  for (const auto& [gpu_type, price] : prices.usd_per_gpu_hour) AddGpuType(gpu_type);
  ledger_.SetPrices(std::move(prices));
  return absl::OkStatus();
}

absl::StatusOr<tally::v1::CostEstimate> Scheduler::EstimateCost(tally::v1::JobSpec spec) const {
  RETURN_IF_ERROR(PrepareJobSpec(&spec));
  return ledger_.Estimate(spec);
}

std::map<std::string, int64_t> Scheduler::TenantGpusInUse() const {
  std::map<std::string, int64_t> in_use;
  for (const auto& [id, job] : active_) {
    if (job.rec.job().state() != tally::v1::JOB_STATE_RUNNING) continue;
    in_use[job.rec.job().tenant()] += job.attempt ? job.attempt->worker_ids_size()
                                                  : job.rec.job().spec().resources().gpu_count();
  }
  return in_use;
}

void Scheduler::SetQuotas(ledger::TenantQuotas quotas) {
  options_.quotas = std::move(quotas);
  UpdateGauges();
}

absl::Status Scheduler::CheckTenantQuota(const std::string& tenant) const {
  std::optional<ledger::QuotaStop> q =
      ledger::CheckDollarQuota(tenant, options_.quotas, spend_, clock_->Now());
  if (!q) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat(q->reason, " (", q->detail, "); no new work until the window has room"));
}

void Scheduler::UpdateGauges() {
  queue_depth_->Set(QueueDepth());
  UpdateScaleGauges();
  // Tenants: those with a quota, spend in the month, or running jobs.
  const absl::Time now = clock_->Now();
  std::set<std::string> tenants;
  for (const auto& [t, q] : options_.quotas) tenants.insert(t);
  for (const std::string& t : spend_.Tenants()) tenants.insert(t);
  const std::map<std::string, int64_t> in_use = TenantGpusInUse();
  for (const auto& [t, n] : in_use) tenants.insert(t);
  for (const std::string& t : tenants) {
    tenant_spend_->Add({{"tenant", t}, {"window", "day"}})
        .Set(spend_.Window(t, now, ledger::kQuotaDay));
    tenant_spend_->Add({{"tenant", t}, {"window", "month"}})
        .Set(spend_.Window(t, now, ledger::kQuotaMonth));
    auto n = in_use.find(t);
    tenant_gpus_->Add({{"tenant", t}, {"state", "in_use"}})
        .Set(n == in_use.end() ? 0.0 : static_cast<double>(n->second));
    auto q = options_.quotas.find(t);
    if (q == options_.quotas.end()) continue;
    if (q->second.max_gpus > 0) {
      tenant_gpus_->Add({{"tenant", t}, {"state", "quota"}}).Set(q->second.max_gpus);
    }
    if (q->second.max_dollars_per_day > 0) {
      tenant_quota_->Add({{"tenant", t}, {"window", "day"}}).Set(q->second.max_dollars_per_day);
    }
    if (q->second.max_dollars_per_month > 0) {
      tenant_quota_->Add({{"tenant", t}, {"window", "month"}})
          .Set(q->second.max_dollars_per_month);
    }
  }
  std::map<metrics::Labels, double> workers, slots;
  for (const auto& [id, ws] : workers_.all()) {
    const std::string& type = ws.rec.gpu_type().empty() ? "unknown" : ws.rec.gpu_type();
    ++workers[{{"gpu_type", type}, {"state", ws.connected ? "connected" : "disconnected"}}];
    if (!ws.connected) continue;
    slots[{{"gpu_type", type}, {"state", "used"}}] += ws.Used();
    slots[{{"gpu_type", type}, {"state", "free"}}] += std::max(0, ws.rec.slots() - ws.Used());
  }
  // A series seen once stays, at 0 when it empties, so alerts see the drop
  // rather than a vanished series.
  for (const auto& labels : seen_worker_labels_) {
    if (!workers.count(labels)) workers[labels] = 0;
  }
  for (const auto& labels : seen_slot_labels_) {
    if (!slots.count(labels)) slots[labels] = 0;
  }
  for (const auto& [labels, v] : workers) {
    workers_gauge_->Add(labels).Set(v);
    seen_worker_labels_.insert(labels);
  }
  for (const auto& [labels, v] : slots) {
    slots_gauge_->Add(labels).Set(v);
    seen_slot_labels_.insert(labels);
  }
}

void Scheduler::AddGpuType(const std::string& gpu_type) {
  cost_total_->Add({{"gpu_type", gpu_type}});
  lost_total_->Add({{"gpu_type", gpu_type}});
  redone_total_->Add({{"gpu_type", gpu_type}});
  for (const char* cause :
       {"sigterm", "sigint", "notice_file", "idle", "priority", "experiment", "unknown"}) {
    preemptions_->Add({{"gpu_type", gpu_type}, {"cause", cause}});
  }
  workers_lost_->Add({{"gpu_type", gpu_type}});
  for (const char* cause : {"sigterm", "sigint", "notice_file", "idle"}) {
    worker_exits_->Add({{"gpu_type", gpu_type}, {"cause", cause}});
  }
  job_metrics_.AddGpuType(gpu_type);
}

int64_t Scheduler::QueueDepth() const {
  int64_t n = 0;
  // Held jobs (an experiment's rung) are not waiting for capacity.
  for (const auto& [id, job] : active_) {
    n += job.rec.job().state() == tally::v1::JOB_STATE_QUEUED && job.rec.job().hold().empty();
  }
  return n;
}

std::vector<policy::QueuedJob> Scheduler::QueuedJobs() const {
  std::vector<policy::QueuedJob> queued;
  for (const auto& [id, job] : active_) {
    if (job.rec.job().state() != tally::v1::JOB_STATE_QUEUED) continue;
    if (!job.rec.job().hold().empty()) continue;  // held (an experiment's rung)
    const auto& spec = job.rec.job().spec();
    queued.push_back({id, spec.priority(), FromProto(job.rec.job().create_time()),
                      spec.resources().gpu_type(), spec.resources().gpu_count(),
                      spec.resources().capacity()});
    if (job.rec.job().preemption().count() > 0 && spec.resources().gpu_count() > 1) {
      // A preempted job resumes at any world size its micro-batches allow
      // rather than wait for all its slots (its checkpoint holds the whole
      // model).
      std::vector<int> sizes = AllowedWorldSizes(spec);
      queued.back().smaller_counts.assign(sizes.begin() + 1, sizes.end());
    }
  }
  return queued;
}

std::vector<policy::QueuedJob> Scheduler::OfferUnderQuotas(
    std::vector<policy::QueuedJob> queued, absl::Time now,
    std::vector<std::pair<int64_t, std::string>>* held) const {
  if (options_.quotas.empty() || queued.empty()) return queued;
  std::stable_sort(queued.begin(), queued.end(), policy::OfferedBefore);
  std::map<std::string, int64_t> in_use = TenantGpusInUse();
  std::vector<policy::QueuedJob> offered;
  for (policy::QueuedJob& q : queued) {
    const tally::v1::Job& j = active_.at(q.id).rec.job();
    auto quota = options_.quotas.find(j.tenant());
    if (quota == options_.quotas.end()) {
      offered.push_back(std::move(q));
      continue;
    }
    // A tenant at a dollar cap starts nothing new. The reasons name the
    // limit, not the moving figures, so a job says it once.
    if (std::optional<ledger::QuotaStop> cap =
            ledger::CheckDollarQuota(j.tenant(), options_.quotas, spend_, now)) {
      if (held != nullptr) {
        held->emplace_back(q.id, absl::StrCat("waiting: tenant ", j.tenant(), " is at its ",
                                              cap->limit, " (", cap->detail, ")"));
      }
      continue;
    }
    if (quota->second.max_gpus > 0) {
      int64_t& used = in_use[j.tenant()];
      if (used + q.gpu_count > quota->second.max_gpus) {
        if (held != nullptr) {
          held->emplace_back(q.id, absl::StrCat("waiting: tenant ", j.tenant(),
                                                " is at its max_gpus ", quota->second.max_gpus,
                                                " (this job needs ", q.gpu_count, ")"));
        }
        continue;
      }
      used += q.gpu_count;
    }
    offered.push_back(std::move(q));
  }
  return offered;
}

std::map<std::string, int64_t> Scheduler::GpusWanted() const {
  std::map<std::string, int64_t> wanted;
  for (const auto& [type, price] : ledger_.prices().usd_per_gpu_hour) wanted[type];
  for (const auto& [id, ws] : workers_.all()) {
    if (!ws.rec.gpu_type().empty()) wanted[ws.rec.gpu_type()];
  }
  for (const auto& [id, job] : active_) {
    const tally::v1::Job& j = job.rec.job();
    if (j.state() != tally::v1::JOB_STATE_RUNNING) continue;
    wanted[j.spec().resources().gpu_type()] +=
        job.attempt ? job.attempt->worker_ids_size() : j.spec().resources().gpu_count();
  }
  // The queued jobs Tick would offer to placement under the tenants' quotas.
  for (const policy::QueuedJob& q : OfferUnderQuotas(QueuedJobs(), clock_->Now(), nullptr)) {
    wanted[q.gpu_type] += q.gpu_count;
  }
  return wanted;
}

std::map<std::string, int64_t> Scheduler::IdleWorkers() const {
  return workers_.Idle(clock_->Now());
}

void Scheduler::UpdateScaleGauges() {
  const std::map<std::string, int64_t> wanted = GpusWanted();
  const std::map<std::string, int64_t> idle = IdleWorkers();
  std::set<std::string> types;
  for (const auto& [type, n] : wanted) types.insert(type);
  for (const auto& [type, n] : idle) types.insert(type);
  for (const std::string& type : scale_gauge_types_) {
    if (types.count(type)) continue;
    gpus_wanted_->Remove({{"gpu_type", type}});
    workers_idle_->Remove({{"gpu_type", type}});
  }
  for (const std::string& type : types) {
    auto w = wanted.find(type);
    auto i = idle.find(type);
    gpus_wanted_->Add({{"gpu_type", type}})
        .Set(w == wanted.end() ? 0.0 : static_cast<double>(w->second));
    workers_idle_->Add({{"gpu_type", type}})
        .Set(i == idle.end() ? 0.0 : static_cast<double>(i->second));
  }
  scale_gauge_types_ = std::move(types);
}

std::vector<WorkerView> Scheduler::Workers() const { return workers_.Views(); }

}  // namespace tally::sched
