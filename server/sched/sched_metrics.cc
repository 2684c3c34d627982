#include "server/sched/sched_metrics.h"

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "server/policy/stop_rules.h"

namespace tally::sched {
namespace {

using tally::v1::JobState;

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

std::string StateLabel(JobState s) { return absl::AsciiStrToLower(StateName(s)); }

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

SchedMetrics::SchedMetrics(metrics::Registry* registry, store::JobStore* store,
                           metrics::JobMetricsOptions job_options)
    : jobs_(registry, std::move(job_options)),
      job_observer_(std::make_unique<JobMetricsObserver>(&jobs_)) {
  RegisterQueueFamilies(*registry);
  RegisterOutcomeFamilies(*registry);
  RegisterFleetFamilies(*registry);
  // Jobs by state come from the store, the source of truth, at scrape time.
  registry->AddCollectCallback([store, jobs = jobs_by_state_] {
    auto counts = store->CountJobsByState();
    if (!counts.ok()) return;
    std::map<JobState, int64_t> by_state(counts->begin(), counts->end());
    for (int s = tally::v1::JOB_STATE_QUEUED; s <= tally::v1::JOB_STATE_FAILED; ++s) {
      const auto state = static_cast<JobState>(s);
      jobs->Add({{"state", StateLabel(state)}}).Set(by_state[state]);
    }
  });
}

void SchedMetrics::RegisterQueueFamilies(metrics::Registry& registry) {
  queue_wait_ = &metrics::BuildHistogram()
                     .Name("tally_queue_wait_seconds")
                     .Help("Time jobs waited in QUEUED before an attempt started.")
                     .Register(registry)
                     .Add({}, metrics::Histogram::ExponentialBuckets(0.1, 2, 18));  // to 3.6 h
  queue_depth_ = &metrics::BuildGauge()
                      .Name("tally_queue_depth")
                      .Help("Jobs waiting in QUEUED (held ones, an experiment's, "
                            "not counted).")
                      .Register(registry)
                      .Add({});
  workers_gauge_ = &metrics::BuildGauge()
                        .Name("tally_workers")
                        .Help("Workers known to tallyd, by GPU type and whether "
                              "they are connected.")
                        .Register(registry);
  slots_gauge_ = &metrics::BuildGauge()
                      .Name("tally_worker_slots")
                      .Help("Slots of connected workers, by GPU type and "
                            "whether they are free or used.")
                      .Register(registry);
  attempts_ended_ = &metrics::BuildCounter()
                         .Name("tally_attempts_ended_total")
                         .Help("Attempts that ended, by outcome (succeeded, "
                               "failed, lost, stopped, preempted: not a failure, the job "
                               "resumes).")
                         .Register(registry);
  transitions_ = &metrics::BuildCounter()
                      .Name("tally_job_transitions_total")
                      .Help("Job state transitions, by the state entered.")
                      .Register(registry);
  jobs_by_state_ = &metrics::BuildGauge()
                    .Name("tally_jobs")
                    .Help("Jobs by state, as stored.")
                    .Register(registry);
  for (int s = tally::v1::JOB_STATE_QUEUED; s <= tally::v1::JOB_STATE_FAILED; ++s) {
    jobs_by_state_->Add({{"state", StateLabel(static_cast<JobState>(s))}});
    transitions_->Add({{"state", StateLabel(static_cast<JobState>(s))}});
  }
  for (const char* outcome : {"succeeded", "failed", "lost", "stopped", "preempted"}) {
    attempts_ended_->Add({{"outcome", outcome}});
  }
}

void SchedMetrics::RegisterOutcomeFamilies(metrics::Registry& registry) {
  cost_total_ = &metrics::BuildCounter()
                     .Name("tally_cost_dollars_total")
                     .Help("Dollars accrued by running attempts, by GPU type.")
                     .Register(registry);
  lost_total_ = &metrics::BuildCounter()
                     .Name("tally_cost_lost_dollars_total")
                     .Help("Dollars spent by failed or lost attempts after their last "
                           "checkpoint, by GPU type.")
                     .Register(registry);
  preemptions_ = &metrics::BuildCounter()
                      .Name("tally_preemptions_total")
                      .Help("Attempts preempted, by GPU type and cause (sigterm, sigint, "
                            "notice_file, idle: a worker's notice; priority: a higher-priority "
                            "job; experiment: an experiment holding its variant at a "
                            "successive-halving rung; unknown). A preemption is not a failure: "
                            "the job resumes.")
                      .Register(registry);
  redone_total_ = &metrics::BuildCounter()
                      .Name("tally_cost_redone_dollars_total")
                      .Help("Dollars preempted attempts spent after their last checkpoint (work "
                            "the next attempt redoes; 0 when the notice checkpoint landed), by "
                            "GPU type.")
                      .Register(registry);
  early_stops_ = &metrics::BuildCounter()
                      .Name("tally_early_stops_total")
                      .Help("Jobs stopped early, by rule.")
                      .Register(registry);
  for (const char* rule : policy::rules::EarlyStopRules()) early_stops_->Add({{"rule", rule}});
  job_ends_ = &metrics::BuildCounter()
                   .Name("tally_job_ends_total")
                   .Help("Jobs that ended, by terminal state and the rule that ended them "
                         "(max_steps, target, patience, divergence, no_gain_over_baseline, "
                         "forecast, budget, cancel, failure, experiment_budget, "
                         "experiment_halving).")
                   .Register(registry);
  for (const auto& [state, rules] : policy::rules::JobEndRules()) {
    for (const char* rule : rules) job_ends_->Add({{"state", state}, {"reason_rule", rule}});
  }
}

void SchedMetrics::RegisterFleetFamilies(metrics::Registry& registry) {
  tenant_spend_ = &metrics::BuildGauge()
                      .Name("tally_tenant_spend_usd")
                      .Help("Dollars a tenant spent over the rolling window (day: 24 h, month: "
                            "30 days), committed.")
                      .Register(registry);
  tenant_quota_ = &metrics::BuildGauge()
                      .Name("tally_tenant_quota_usd")
                      .Help("A tenant's dollar quota over the window (tallyd's --config).")
                      .Register(registry);
  tenant_gpus_ = &metrics::BuildGauge()
                     .Name("tally_tenant_gpus")
                     .Help("GPUs a tenant's running jobs hold (state=in_use) and its max_gpus "
                           "quota (state=quota).")
                     .Register(registry);
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
                              "lost its acknowledgement (repeated), a hello announcing a GPU "
                              "type tallyd's config does not name (hello), a log batch about "
                              "an attempt the worker does not run (logs) or over its limits "
                              "(logs_invalid).")
                        .Register(registry);
  for (const char* kind : {"progress", "eval", "checkpoint", "exit", "checkpoint_path",
                           "progress_out_of_order", "damaged_checkpoint", "invalid",
                           "repeated", "hello", "logs", "logs_invalid"}) {
    refused_reports_->Add({{"kind", kind}});
  }
  gpus_wanted_ = &metrics::BuildGauge()
                      .Name("tally_gpus_wanted")
                      .Help("GPUs wanted, by GPU type: those of running attempts plus those of "
                            "queued jobs that could run if workers existed (a job held back by "
                            "its tenant's dollar quota or max_gpus is left out). An autoscaler's "
                            "target: workers needed = this / GPUs per worker.")
                      .Register(registry);
  workers_idle_ = &metrics::BuildGauge()
                       .Name("tally_workers_idle")
                       .Help("Connected, live, non-draining workers running nothing, by GPU "
                             "type.")
                       .Register(registry);
  workers_lost_ = &metrics::BuildCounter()
                       .Name("tally_workers_lost_total")
                       .Help("Workers found silent past the heartbeat timeout, or whose stream "
                             "ended without a notice or while still holding attempts (their "
                             "attempts are lost), by GPU type. Clean exits are in "
                             "tally_worker_exits_total.")
                       .Register(registry);
  worker_exits_ = &metrics::BuildCounter()
                       .Name("tally_worker_exits_total")
                       .Help("Workers that left cleanly: they sent a notice and their stream "
                             "ended holding nothing, by GPU type and cause (sigterm, sigint: a "
                             "signal, e.g. a pod deleted or scaled down; notice_file: a spot "
                             "reclaim notice; idle: --exit_when_idle, scale to zero). Not "
                             "counted in tally_workers_lost_total.")
                       .Register(registry);
}

void SchedMetrics::OnPlanCommitted(const Plan& plan, const tally::v1::Job& job) {
  const std::string& gpu_type = job.spec().resources().gpu_type();
  for (JobState s : plan.transitions) transitions_->Add({{"state", StateLabel(s)}}).Increment();
  for (const auto& o : plan.attempts_ended) {
    attempts_ended_->Add({{"outcome", o}}).Increment();
    jobs_.OnAttemptEnded(job, o);
  }
  if (plan.finished) {
    const JobState s = job.state();
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
}

void SchedMetrics::OnSubmitted() { transitions_->Add({{"state", "queued"}}).Increment(); }

void SchedMetrics::OnReportRefused(const std::string& kind) {
  refused_reports_->Add({{"kind", kind}}).Increment();
}

void SchedMetrics::OnWorkerLost(const std::string& gpu_type) {
  workers_lost_->Add({{"gpu_type", gpu_type.empty() ? "unknown" : gpu_type}}).Increment();
}

void SchedMetrics::OnWorkerExited(const std::string& gpu_type, const std::string& cause) {
  worker_exits_->Add({{"gpu_type", gpu_type.empty() ? "unknown" : gpu_type}, {"cause", cause}})
      .Increment();
}

void SchedMetrics::AddGpuType(const std::string& gpu_type) {
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
  jobs_.AddGpuType(gpu_type);
}

void SchedMetrics::SetQueueDepth(int64_t n) { queue_depth_->Set(n); }

void SchedMetrics::SetTenant(const std::string& t, double spend_day, double spend_month,
                             int64_t gpus_in_use, const ledger::TenantQuota* quota) {
  tenant_spend_->Add({{"tenant", t}, {"window", "day"}}).Set(spend_day);
  tenant_spend_->Add({{"tenant", t}, {"window", "month"}}).Set(spend_month);
  tenant_gpus_->Add({{"tenant", t}, {"state", "in_use"}}).Set(static_cast<double>(gpus_in_use));
  if (quota == nullptr) return;
  if (quota->max_gpus > 0) tenant_gpus_->Add({{"tenant", t}, {"state", "quota"}}).Set(quota->max_gpus);
  if (quota->max_dollars_per_day > 0) {
    tenant_quota_->Add({{"tenant", t}, {"window", "day"}}).Set(quota->max_dollars_per_day);
  }
  if (quota->max_dollars_per_month > 0) {
    tenant_quota_->Add({{"tenant", t}, {"window", "month"}}).Set(quota->max_dollars_per_month);
  }
}

void SchedMetrics::SetFleet(const WorkerRegistry& registry) {
  std::map<metrics::Labels, double> workers, slots;
  for (const auto& [id, ws] : registry.all()) {
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

void SchedMetrics::SetScale(const std::map<std::string, int64_t>& wanted,
                            const std::map<std::string, int64_t>& idle) {
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

}  // namespace tally::sched
