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

using tally::v1::JobState;

// The job's latest evaluation, from its curve (which must not be empty).
tally::v1::EvalResult LatestEval(const tally::v1::Job& j) {
  const tally::v1::EvalPoint& last = j.curve(j.curve_size() - 1);
  tally::v1::EvalResult ev;
  ev.set_step(last.step());
  ev.set_tokens(last.tokens());
  ev.set_val_loss(last.val_loss());
  if (last.has_quantized_val_loss()) ev.set_quantized_val_loss(last.quantized_val_loss());
  return ev;
}

}  // namespace

Scheduler::Scheduler(store::JobStore* store, WorkerChannel* channel, const Clock* clock,
                     metrics::Registry* registry, SchedulerOptions options)
    : store_(store),
      channel_(channel),
      clock_(clock),
      options_(options),
      ledger_(options.prices),
      workers_(options.heartbeat_timeout),
      metrics_(registry, store, options.job_metrics),
      log_metrics_(registry) {
  observers_.push_back(metrics_.job_observer());
  for (const auto& [gpu_type, price] : options_.prices.usd_per_gpu_hour) metrics_.AddGpuType(gpu_type);
}

Scheduler::~Scheduler() = default;

// ---------------------------------------------------------------- commit, act

void Scheduler::NoteStoreFailure(const absl::Status& s) {
  // The store's own trouble (a full disk, a lost connection), not a write
  // it refused for what it said.
  if (!(absl::IsUnavailable(s) || absl::IsResourceExhausted(s) || absl::IsDeadlineExceeded(s) ||
        absl::IsAborted(s) || absl::IsInternal(s) || absl::IsUnknown(s) || absl::IsDataLoss(s))) {
    return;
  }
  const absl::Time now = clock_->Now();
  if (store_down_since_ == absl::InfiniteFuture()) store_down_since_ = now;
  store_last_failure_ = now;
}

void Scheduler::NoteStoreSuccess() {
  if (store_down_since_ == absl::InfiniteFuture()) return;
  store_down_.emplace_back(store_down_since_, clock_->Now());
  store_down_since_ = absl::InfiniteFuture();
  constexpr size_t kKeptOutages = 64;
  while (store_down_.size() > kKeptOutages) store_down_.pop_front();
}

absl::Duration Scheduler::StoreDownBetween(absl::Time from, absl::Time to) const {
  if (store_down_.empty() && store_down_since_ == absl::InfiniteFuture()) {
    return absl::ZeroDuration();  // the store never failed: every tick's case
  }
  // Each outage, and after it the time a worker it turned away may take to
  // come back (up to its longest wait between connections); an outage still
  // open counts to its latest failure only, so a store that works again
  // before any write tried it does not hide a dead worker.
  std::vector<std::pair<absl::Time, absl::Time>> spans;
  for (const auto& [a, b] : store_down_) spans.emplace_back(a, b + kReconnectAllowance);
  if (store_down_since_ != absl::InfiniteFuture()) {
    spans.emplace_back(store_down_since_, store_last_failure_ + kReconnectAllowance);
  }
  // Chronological; merged where the allowances overlap.
  absl::Duration down;
  absl::Time covered = from;
  for (auto [a, b] : spans) {
    a = std::max(a, covered);
    b = std::min(b, to);
    if (b > a) {
      down += b - a;
      covered = b;
    }
  }
  return down;
}

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
  if (absl::Status s = store_->Commit(m); !s.ok()) {
    NoteStoreFailure(s);
    return s;
  }
  NoteStoreSuccess();
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
  metrics_.OnPlanCommitted(plan, job.rec.job());
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
  ASSIGN_OR_RETURN(std::vector<store::SpendRecord> spent,
                   store_->ListSpend(ledger::TenantSpend::HourOf(now) -
                                     absl::ToInt64Hours(ledger::kQuotaMonth)));
  for (const store::SpendRecord& r : spent) spend_.Add(r.tenant, r.hour, r.usd);
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
      Plan p = NewPlan(Ctx(now), active_[id]);
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
      if (!metrics_.jobs().WithinRetention(r.job(), now)) continue;
      std::map<std::string, int64_t> ended_by_outcome;
      if (r.job().attempt() > 0) {
        ASSIGN_OR_RETURN(std::vector<store::AttemptRecord> attempts, store_->ListAttempts(r.id()));
        for (const auto& a : attempts) {
          if (a.state() != store::ATTEMPT_STATE_RUNNING) ++ended_by_outcome[Outcome(a.state())];
        }
      }
      metrics_.jobs().RestoreEnded(r.job(), ended_by_outcome, now);
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
    metrics_.OnSubmitted();
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
  Plan p = PlanStopNow(Ctx(), it->second, tally::v1::JOB_STATE_CANCELLED, "cancelled", why, "");
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
  Plan p = NewPlan(Ctx(), job);
  tally::v1::Job& j = *p.rec.mutable_job();
  j.set_target_val_loss(target);
  j.clear_target_reached();
  AddEvent(p, "target",
           absl::StrFormat("target %s %.4f: %s", policy::LossMetricName(MetricOf(j)), target,
                           why),
           "");
  if (std::optional<EvalEvent> reached = RecordTargetReached(j)) {
    AddEvent(p, *reached);
    const std::string& reason = reached->reason;
    const tally::v1::EvalResult ev = LatestEval(j);
    if (j.state() == tally::v1::JOB_STATE_RUNNING && p.attempt &&
        ev.step() < j.spec().training().max_steps()) {
      PendingStopFor(Ctx(), p, tally::v1::JOB_STATE_SUCCEEDED, "succeeded", reason,
                     policy::rules::kTarget, ev);
    } else if (j.state() == tally::v1::JOB_STATE_QUEUED) {
      Plan stop = PlanStopNow(Ctx(), job, tally::v1::JOB_STATE_SUCCEEDED, "succeeded", reason, "");
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
  Plan p = NewPlan(Ctx(), job);
  const tally::v1::Job& j = p.rec.job();
  if (j.state() == tally::v1::JOB_STATE_RUNNING && p.attempt && j.curve_size() > 0) {
    PendingStopFor(Ctx(), p, state, type, reason, rule, LatestEval(j));
  } else {
    p = PlanStopNow(Ctx(), job, state, type, reason, absl::StrCat("rule ", rule));
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
  Plan p = NewPlan(Ctx(), job);
  if (!current.preemption().pending_for().empty()) {
    // Already leaving its slot (for a job of higher priority): that
    // preemption stands; once requeued, the hold keeps it there.
    AddEvent(p, "held", reason, "kept out of placement until released, once its preemption ends");
  } else if (current.state() == tally::v1::JOB_STATE_RUNNING && p.attempt) {
    // Out of its slot first: it checkpoints and requeues, held.
    p = PlanPreempting(Ctx(), job, holder, reason);
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
  Plan p = NewPlan(Ctx(), job);
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

PlanContext Scheduler::Ctx(absl::Time now) const {
  PlanContext ctx;
  ctx.now = now;
  ctx.stop_grace = options_.stop_grace;
  ctx.ledger = &ledger_;
  ctx.workers = &workers_;
  return ctx;
}

absl::StatusOr<Checkpoints> Scheduler::CheckpointsOf(const ActiveJob& job) const {
  return store_->ListCheckpoints(job.rec.id());
}

absl::StatusOr<Checkpoints> Scheduler::EndingCheckpoints(const ActiveJob& job) const {
  if (job.rec.job().has_pending_stop()) return CheckpointsOf(job);
  ASSIGN_OR_RETURN(std::optional<tally::v1::Checkpoint> latest, LatestCheckpoint(job));
  return latest ? Checkpoints{*latest} : Checkpoints{};
}

absl::StatusOr<std::optional<tally::v1::Checkpoint>> Scheduler::LatestCheckpoint(
    const ActiveJob& job) const {
  // Read from the store once per job life in this process (e.g. after a
  // restart); afterwards the job keeps its latest checkpoint.
  if (job.last_checkpoint) return job.last_checkpoint;
  ASSIGN_OR_RETURN(Checkpoints cks, CheckpointsOf(job));
  if (cks.empty()) return std::optional<tally::v1::Checkpoint>();
  return std::optional<tally::v1::Checkpoint>(cks.back());
}

std::set<std::string> Scheduler::RendezvousInUse() const {
  std::set<std::string> in_use;
  for (const auto& [id, job] : active_) {
    if (job.attempt && job.attempt->worker_ids_size() > 1) in_use.insert(job.attempt->rendezvous());
  }
  return in_use;
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
    if (absl::Status s = Execute(id, NewPlan(Ctx(now), it->second)); !s.ok() && failed.ok()) {
      failed = absl::Status(s.code(), absl::StrCat("jobs/", id, ": its spend at the old prices "
                                                   "was not committed: ", s.message()));
    }
  }
  if (!failed.ok()) return failed;
  for (const auto& [gpu_type, price] : prices.usd_per_gpu_hour) metrics_.AddGpuType(gpu_type);
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
  metrics_.SetQueueDepth(QueueDepth());
  metrics_.SetScale(GpusWanted(), IdleWorkers());
  // Tenants: those with a quota, spend in the month, or running jobs.
  const absl::Time now = clock_->Now();
  std::set<std::string> tenants;
  for (const auto& [t, q] : options_.quotas) tenants.insert(t);
  for (const std::string& t : spend_.Tenants()) tenants.insert(t);
  const std::map<std::string, int64_t> in_use = TenantGpusInUse();
  for (const auto& [t, n] : in_use) tenants.insert(t);
  for (const std::string& t : tenants) {
    auto n = in_use.find(t);
    auto q = options_.quotas.find(t);
    metrics_.SetTenant(t, spend_.Window(t, now, ledger::kQuotaDay),
                       spend_.Window(t, now, ledger::kQuotaMonth),
                       n == in_use.end() ? 0 : n->second,
                       q == options_.quotas.end() ? nullptr : &q->second);
  }
  metrics_.SetFleet(workers_);
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

std::vector<WorkerView> Scheduler::Workers() const { return workers_.Views(); }

}  // namespace tally::sched
