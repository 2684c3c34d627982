// SchedMetrics: every metric family the scheduler exports, registered in one
// place. Counters move from what a committed plan says it did
// (OnPlanCommitted: transitions, attempt outcomes, job ends, dollars,
// preemptions, early stops, queue waits) or from a measurement that changes
// no state (a refused report, a lost or departed worker); gauges are set
// from snapshots the scheduler passes in. It decides nothing and reads no
// clock: the scheduler calls it only after a commit, or for what is not a
// state change.
//
// Thread-safety: not thread-safe; the scheduler's caller serialises calls.
#ifndef TALLY_SERVER_SCHED_SCHED_METRICS_H_
#define TALLY_SERVER_SCHED_SCHED_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "server/ledger/tenant_quota.h"
#include "server/metrics/job_metrics.h"
#include "server/metrics/registry.h"
#include "server/sched/observer.h"
#include "server/sched/plan.h"
#include "server/sched/worker_registry.h"
#include "server/store/job_store.h"

namespace tally::sched {

// "early_stopped": a job state as a label value.
std::string StateLabel(tally::v1::JobState s);
// The rule a job ended by when its plan names none (max_steps for a
// success, budget, cancel, failure; "other").
std::string DefaultEndRule(tally::v1::JobState s);

class SchedMetrics {
 public:
  // Registers the families in `registry`; tally_jobs is read from `store`
  // at scrape time. Both must outlive this object.
  SchedMetrics(metrics::Registry* registry, store::JobStore* store,
               metrics::JobMetricsOptions job_options);

  // The per-job series (tally_job_*), and the observer that keeps them in
  // step with committed changes.
  metrics::JobMetrics& jobs() { return jobs_; }
  CommitObserver* job_observer() { return job_observer_.get(); }

  // What `plan` did, once it has committed; `job` is the job as committed.
  void OnPlanCommitted(const Plan& plan, const tally::v1::Job& job);
  // A submitted job entered QUEUED.
  void OnSubmitted();
  // A report dropped without effect (tally_worker_reports_refused_total).
  void OnReportRefused(const std::string& kind);
  // A worker found silent or gone while holding work; one that left
  // cleanly after its notice (`cause`).
  void OnWorkerLost(const std::string& gpu_type);
  void OnWorkerExited(const std::string& gpu_type, const std::string& cause);
  // The fleet counters of a GPU type, created at 0.
  void AddGpuType(const std::string& gpu_type);

  // Gauges, from the scheduler's snapshots.
  void SetQueueDepth(int64_t n);
  // One tenant's committed spend over a day and a month, the GPUs its
  // running jobs hold, and its quota (null: none).
  void SetTenant(const std::string& tenant, double spend_day, double spend_month,
                 int64_t gpus_in_use, const ledger::TenantQuota* quota);
  // Workers by GPU type and connection, and connected slots used and free.
  // A series seen once stays, at 0 when it empties.
  void SetFleet(const WorkerRegistry& workers);
  // tally_gpus_wanted and tally_workers_idle by GPU type; a type in
  // neither map loses its series.
  void SetScale(const std::map<std::string, int64_t>& wanted,
                const std::map<std::string, int64_t>& idle);

 private:
  // The families, registered in exposition order: queue and job state,
  // outcomes and dollars, then tenants and the fleet.
  void RegisterQueueFamilies(metrics::Registry& registry);
  void RegisterOutcomeFamilies(metrics::Registry& registry);
  void RegisterFleetFamilies(metrics::Registry& registry);

  metrics::JobMetrics jobs_;
  metrics::Family<metrics::Gauge>* jobs_by_state_;
  std::unique_ptr<CommitObserver> job_observer_;
  metrics::Histogram* queue_wait_;
  metrics::Gauge* queue_depth_;
  metrics::Family<metrics::Gauge>* workers_gauge_;
  metrics::Family<metrics::Gauge>* slots_gauge_;
  metrics::Family<metrics::Counter>* attempts_ended_;
  metrics::Family<metrics::Counter>* transitions_;
  metrics::Family<metrics::Counter>* cost_total_;
  metrics::Family<metrics::Counter>* lost_total_;
  metrics::Family<metrics::Counter>* early_stops_;
  metrics::Family<metrics::Counter>* job_ends_;
  metrics::Family<metrics::Counter>* workers_lost_;
  // Workers that left cleanly (a notice, then their stream ended with
  // nothing held), by GPU type and the notice's cause.
  metrics::Family<metrics::Counter>* worker_exits_;
  metrics::Family<metrics::Counter>* refused_reports_;
  metrics::Family<metrics::Counter>* preemptions_;
  metrics::Family<metrics::Counter>* redone_total_;
  metrics::Family<metrics::Gauge>* tenant_spend_;
  metrics::Family<metrics::Gauge>* tenant_quota_;
  metrics::Family<metrics::Gauge>* tenant_gpus_;
  std::set<metrics::Labels> seen_worker_labels_;
  std::set<metrics::Labels> seen_slot_labels_;
  metrics::Family<metrics::Gauge>* gpus_wanted_;
  metrics::Family<metrics::Gauge>* workers_idle_;
  // The GPU types the two gauges above have series for: a type that is
  // neither priced, a worker's, nor a job's any more loses its series, so
  // job specs cannot grow the exposition without bound.
  std::set<std::string> scale_gauge_types_;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_SCHED_METRICS_H_
