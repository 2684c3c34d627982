// Scheduler: the periodic pass (Tick) and the preemptions it decides for
// jobs still waiting.
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

using tally::v1::JobState;

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
  note(LoseSilentWorkers(now));
  // Series retention and quota windows move by seconds and hours: once a
  // second is enough (each walks every job with series or every tenant).
  if (now - last_housekeeping_ >= absl::Seconds(1)) {
    metrics_.jobs().Expire(now);
    spend_.Prune(now);
    last_housekeeping_ = now;
  }
  note(EnforceBudgetsAndDeadlines(now));
  note(StartWhatFits(now));
  UpdateGauges();
  return first_error;
}

absl::Status Scheduler::LoseSilentWorkers(absl::Time now) {
  absl::Status first_error;
  auto note = [&](const absl::Status& s) {
    if (!s.ok() && first_error.ok()) first_error = s;
  };
  // Workers silent past the timeout lose what they hold. Each attempt's
  // loss commits on its own; one that fails stays held and is retried.
  for (const std::string& worker_id : workers_.Ids()) {
    WorkerState& ws = *workers_.Find(worker_id);
    // The silence clock pauses while the store refuses writes: tallyd then
    // ends the streams whose reports it cannot commit (and refuses hellos),
    // so a worker goes unheard through no fault of its own.
    const absl::Duration silent =
        (now - ws.last_seen) - StoreDownBetween(ws.last_seen, now);
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
      absl::StatusOr<Plan> p = WithCheckpoints(jit->second, [&](const Checkpoints& cks) {
        return LoseAttempt(Ctx(now), jit->second, cks, draining, reason);
      });
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
      metrics_.OnWorkerLost(ws.rec.gpu_type());
    }
    if (!ws.connected && all_released && ws.unconfirmed_exits.empty()) workers_.Forget(worker_id);
  }
  return first_error;
}

absl::Status Scheduler::EnforceBudgetsAndDeadlines(absl::Time now) {
  absl::Status first_error;
  auto note = [&](const absl::Status& s) {
    if (!s.ok() && first_error.ok()) first_error = s;
  };
  // On a view of each running job.
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
      note(Execute(id, PlanStopNow(Ctx(), job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED,
                                   "budget_exhausted", stop->reason, stop->detail)));
    } else if (quota) {
      // The tenant's running jobs together reached its cap: each stops (the
      // job ended here commits its spend, so the next is judged on it).
      Plan plan = PlanStopNow(Ctx(), job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, "budget_exhausted",
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
      const std::string how = absl::StrCat("the workers did not confirm the stop within ",
                                           ShortSeconds(options_.stop_grace));
      absl::StatusOr<Plan> p = WithCheckpoints(
          job, [&](const Checkpoints& cks) { return PlanFinishStop(Ctx(), job, cks, how); });
      note(p.ok() ? Execute(id, *std::move(p)) : p.status());
    } else if (!view.preemption().pending_for().empty() &&
               now >= FromProto(view.preemption().pending_deadline())) {
      // The workers did not confirm: preempted without their checkpoint
      // (their slots stay held until they report the exit or are lost).
      const std::string reason =
          absl::StrCat(view.preemption().pending_reason(), "; the workers did not confirm within ",
                       ShortSeconds(options_.stop_grace));
      absl::StatusOr<Plan> p = WithCheckpoints(job, [&](const Checkpoints& cks) {
        return PlanPreempted(Ctx(), job, cks, OrderedPreemptionCause(view), reason, 0);
      });
      note(p.ok() ? Execute(id, *std::move(p)) : p.status());
    } else {
      metrics_.jobs().Update(view, cost);
    }
  }
  return first_error;
}

void Scheduler::DropBehindAwaiting(std::vector<policy::QueuedJob>& queued) {
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
}

absl::Status Scheduler::StartWhatFits(absl::Time now) {
  absl::Status first_error;
  auto note = [&](const absl::Status& s) {
    if (!s.ok() && first_error.ok()) first_error = s;
  };
  // With a tenant's max_gpus, its jobs are offered to the placement in
  // priority, then submission, order while they fit under it; past it, a
  // job waits and says why.
  std::vector<policy::QueuedJob> queued = QueuedJobs();
  DropBehindAwaiting(queued);
  std::vector<std::pair<int64_t, std::string>> over_quota;
  queued = OfferUnderQuotas(std::move(queued), now, &over_quota);
  // A job held back by its tenant's quota says so (once, not every tick).
  for (const auto& [id, why] : over_quota) {
    const ActiveJob& job = active_.at(id);
    if (job.rec.job().state_reason() == why) continue;
    Plan p = NewPlan(Ctx(now), job);
    p.rec.mutable_job()->set_state_reason(why);
    AddEvent(p, "waiting", why, "");
    note(Execute(id, std::move(p)));
  }
  if (!queued.empty()) {
    std::set<int64_t> started;
    for (const auto& placed : policy::PlaceJobs(queued, workers_.FreeSlots(now))) {
      const ActiveJob& job = active_.at(placed.job_id);
      // Only a gang needs a rendezvous (finding those in use walks every job).
      const std::set<std::string> in_use =
          placed.rank_workers.size() > 1 ? RendezvousInUse() : std::set<std::string>();
      absl::StatusOr<Plan> p = WithAllCheckpoints(job, [&](const Checkpoints& cks) {
        return PlanStart(Ctx(), job, cks, placed.rank_workers, in_use);
      });
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
      absl::Status s = Execute(victim, PlanPreempting(Ctx(), vit->second, name, reason));
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

}  // namespace tally::sched
