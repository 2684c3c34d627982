// ExperimentManager: runs experiments (experiments/{id}) on the scheduler.
// Each variant is an ordinary job, labelled experiment and variant; the
// manager decides with pure code (decide.h), commits the experiment's record
// and events in one transaction, and only then acts on the scheduler
// (submit, set a target, stop, cancel). Every act is idempotent and derived
// again on the next pass, so a crash anywhere loses nothing and doubles
// nothing: after a restart, Recover() and the next Reconcile() carry on.
//
// Thread-safety: not thread-safe; it shares the scheduler's lock (the API
// core serialises every call to both).
#ifndef TALLY_SERVER_EXPERIMENTS_MANAGER_H_
#define TALLY_SERVER_EXPERIMENTS_MANAGER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "server/experiments/decide.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler.h"
#include "server/store/job_store.h"

namespace tally::experiments {

class ExperimentManager {
 public:
  // Every pointer must outlive the manager.
  ExperimentManager(store::JobStore* store, sched::Scheduler* scheduler, const Clock* clock,
                    metrics::Registry* registry);

  // Loads the experiments still running (after the scheduler's Recover),
  // and exports every stored experiment's series as last committed (ended
  // ones included), so a restart drops none of them.
  absl::Status Recover();

  // Validates (INVALID_ARGUMENT naming the variant and field), stores the
  // experiment and submits its variants. A repeated request_id returns the
  // experiment the first call made (ALREADY_EXISTS with a different spec).
  // The experiment and its variants' jobs belong to `by`'s tenant.
  absl::StatusOr<tally::v1::Experiment> Create(tally::v1::ExperimentSpec spec,
                                               const std::string& request_id,
                                               const sched::Actor& by = {});
  // As of now: a running experiment's variants with their jobs' live figures.
  absl::StatusOr<tally::v1::Experiment> Get(int64_t id);
  // Newest first, ids below before_id (0: from the newest); with `tenant`,
  // only that tenant's.
  absl::StatusOr<std::vector<tally::v1::Experiment>> List(
      int64_t before_id, int limit, const std::optional<std::string>& tenant = std::nullopt);
  // FAILED_PRECONDITION when it has ended. `by` is recorded as cancelled_by.
  absl::StatusOr<tally::v1::Experiment> Cancel(int64_t id, const std::string& reason,
                                               const std::string& by = "");

  // One pass over every running experiment (each commits on its own; the
  // first error is returned). Also refreshes the experiment metrics.
  absl::Status Reconcile();

  // Told of the experiment's id after each of its commits (watchers wake);
  // called with the caller's lock held: must not block.
  void SetCommitListener(std::function<void(int64_t)> listener) {
    listener_ = std::move(listener);
  }

 private:
  absl::Status ReconcileOne(int64_t id);
  // Variant i's job as it is now (nullopt before it has one).
  std::vector<std::optional<tally::v1::Job>> JobsOf(const store::ExperimentRecord& rec);
  // The timing calibration's job as it is now (nullopt before it has one).
  std::optional<tally::v1::Job> CalibrationJobOf(const store::ExperimentRecord& rec);
  std::optional<tally::v1::Job> JobNamed(const std::string& name);
  // The timing calibration (calibration.h), into a new record: its status
  // and its job's spec, checked as it will be submitted.
  absl::Status PlanTiming(const tally::v1::ExperimentSpec& spec, store::ExperimentRecord* rec);
  absl::Status CommitPlan(Plan& plan);
  absl::Status Act(int64_t id, const Plan& plan);
  tally::v1::Experiment View(const store::ExperimentRecord& rec);
  void Export(const tally::v1::Experiment& e);

  store::JobStore* const store_;
  sched::Scheduler* const scheduler_;
  const Clock* const clock_;
  std::function<void(int64_t)> listener_;
  // Running experiments, as committed.
  std::map<int64_t, store::ExperimentRecord> active_;
  // Jobs that have ended do not change: read once from the store.
  std::map<int64_t, tally::v1::Job> ended_jobs_;

  metrics::Family<metrics::Gauge>* variant_cost_;
  metrics::Family<metrics::Gauge>* variant_val_loss_;
  metrics::Family<metrics::Gauge>* variant_quantized_val_loss_;
  metrics::Family<metrics::Gauge>* variant_cost_to_target_;
  metrics::Family<metrics::Gauge>* variant_recipe_cost_to_target_;
  metrics::Family<metrics::Gauge>* variant_reached_;
  metrics::Family<metrics::Gauge>* target_;
  metrics::Family<metrics::Gauge>* cost_;
};

}  // namespace tally::experiments

#endif  // TALLY_SERVER_EXPERIMENTS_MANAGER_H_
