// JobMetrics: the per-job Prometheus series (label tally_job="jobs/N"): step,
// losses, tokens, dollars, patience, budget, and the FP8 and MoE gauges a
// worker's progress reports carry. It keeps the label bookkeeping so that a
// job's every series goes when the job ends.
//
// It is fed only with what has committed (the scheduler's commit observer
// passes it the stored record, or a view of it with cost accrued to now) and
// with progress reports, which are measurements, not state.
//
// Thread-safety: not thread-safe; the scheduler serialises calls.
#ifndef TALLY_SERVER_METRICS_JOB_METRICS_H_
#define TALLY_SERVER_METRICS_JOB_METRICS_H_

#include <map>
#include <set>
#include <string>
#include <utility>

#include "server/metrics/registry.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/workers.pb.h"

namespace tally::metrics {

class JobMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit JobMetrics(Registry* registry);

  // The job's gauges from its record while it runs; every series of the job
  // removed once it is terminal.
  void Update(const tally::v1::Job& job) { Update(job, job.cost()); }
  // The same with `cost` in place of the job's own (a view accrued to now).
  void Update(const tally::v1::Job& job, const tally::v1::CostStatus& cost);
  // A checkpoint was recorded and priced.
  void OnCheckpoint(const tally::v1::Job& job, const tally::v1::Checkpoint& checkpoint);
  // A running job's progress report.
  void OnProgress(const tally::v1::Job& job, const tally::v1::Progress& progress);

 private:
  using GaugeFamily = Family<Gauge>;
  void Set(const std::string& job, GaugeFamily* family, Labels labels, double value);
  void Remove(const std::string& job);

  GaugeFamily* step_;
  GaugeFamily* train_loss_;
  GaugeFamily* val_loss_;
  GaugeFamily* best_val_loss_;
  GaugeFamily* tokens_;
  GaugeFamily* useful_tokens_per_second_;
  GaugeFamily* padding_fraction_;
  GaugeFamily* cost_;
  GaugeFamily* checkpoint_cost_;
  GaugeFamily* patience_left_;
  GaugeFamily* budget_fraction_;
  GaugeFamily* fp8_overflows_;
  GaugeFamily* fp8_product_fraction_;
  GaugeFamily* fp8_amax_;
  GaugeFamily* moe_load_;
  GaugeFamily* moe_entropy_;
  GaugeFamily* moe_dropped_;
  GaugeFamily* moe_expert_tokens_;
  GaugeFamily* forecast_;
  GaugeFamily* target_;
  // Every series each job has, so that all go when it ends.
  std::map<std::string, std::set<std::pair<GaugeFamily*, Labels>>> series_;
};

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_JOB_METRICS_H_
