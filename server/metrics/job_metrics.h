// JobMetrics: the per-job Prometheus series (label tally_job="jobs/N"): step,
// losses, tokens, dollars, patience, budget, the FP8 and MoE figures a
// worker's progress reports carry, and tally_job_info (display name, state,
// GPU type, the stop rule once one stopped it, and chosen spec labels, to
// join any per-job series on). It also
// keeps the fleet counters that come from progress reports
// (tally_tokens_total, tally_fp8_values_total, tally_fp8_overflows_total:
// the overflow fraction is the ratio of the last two's rates).
//
// A job's series keep their final values for `retention` after it ends (its
// terminal state is on tally_job_info), so a scrape after the end still sees
// the last step, the final and best loss and the budget it used; then every
// series of the job goes, so cardinality stays bounded. A tallyd restart
// does not cut that short: the scheduler's recovery rebuilds the series of
// jobs that ended within the retention (RestoreEnded).
//
// It is fed only with what has committed (the scheduler's commit observer
// passes it the stored record, or a view of it with cost accrued to now) and
// with progress reports, which are measurements, not state: the counters of
// computed tokens and of FP8 values cast and clamped move when a report
// arrives.
//
// Counting tokens: a worker reports the job's cumulative tokens. The first
// attempt counts from 0; a later attempt (which resumes from a checkpoint)
// and an attempt adopted after a tallyd restart count from their first
// report, so redone work is counted and nothing is counted twice.
//
// Thread-safety: not thread-safe; the scheduler serialises calls.
#ifndef TALLY_SERVER_METRICS_JOB_METRICS_H_
#define TALLY_SERVER_METRICS_JOB_METRICS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "server/metrics/registry.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/workers.pb.h"

namespace tally::metrics {

struct JobMetricsOptions {
  // How long an ended job's series keep their final values. 0: they go at
  // once.
  absl::Duration retention = absl::Minutes(15);
  // Spec label keys copied onto tally_job_info as label_<key> (at most
  // kMaxInfoLabels; each a Prometheus label name: [a-zA-Z_][a-zA-Z0-9_]*).
  std::vector<std::string> info_labels;
  // Per-expert series (tally_job_moe_expert_tokens) a job may have, all
  // layers together; a larger model publishes only the per-layer summary
  // (tally_job_moe_expert_share{stat}, tally_job_moe_idle_experts).
  int max_expert_series = 256;
};

inline constexpr int kMaxInfoLabels = 8;
inline constexpr int kMaxInfoLabelValueBytes = 128;

// INVALID_ARGUMENT naming the tallyd flag for options no deployment should
// run with.
absl::Status ValidateJobMetricsOptions(const JobMetricsOptions& options);

// One MoE layer's routing at a progress report, normalised so that the same
// thresholds mean the same for any number of experts E and top-k: an
// expert's share is the fraction of the layer's tokens routed to it (its
// assignments over all assignments, times k), so each expert's fair share
// is k/E and a share of 1 means every token went to it.
struct MoeLayerHealth {
  int32_t layer = 0;
  int num_experts = 0;
  double fair_share = 0;     // k/E
  double min_share = 0;
  double median_share = 0;
  double busiest_share = 0;
  int busiest_expert = 0;
  int idle_experts = 0;      // below kIdleFractionOfFair of the fair share
  bool collapsed = false;    // see AssessMoeLayer
};

// An expert is idle below this fraction of its fair share.
inline constexpr double kIdleFractionOfFair = 0.1;
// The busiest expert is collapsed onto above this multiple of its fair
// share, or above halfway from its fair share to every token, whichever is
// lower (so the rule can fire for any E and k, including E/k < 3).
inline constexpr double kBusiestOverFair = 3.0;

// The collapse rule (pure): a layer has collapsed when an expert is idle or
// the busiest is above its threshold. `top_k` is clamped to [1, E]. A layer
// that routed no tokens is not collapsed.
MoeLayerHealth AssessMoeLayer(const tally::v1::MoeLayerLoad& load, int top_k);

class JobMetrics {
 public:
  // Registers the families in `registry`, which must outlive this.
  explicit JobMetrics(Registry* registry, JobMetricsOptions options = {});

  // The job's series from its record: tally_job_info for every job, the
  // gauges while it runs and, once it has ended, their final values (kept
  // for the retention).
  void Update(const tally::v1::Job& job) { Update(job, job.cost()); }
  // The same with `cost` in place of the job's own (a view accrued to now).
  void Update(const tally::v1::Job& job, const tally::v1::CostStatus& cost);
  // An attempt started on tallyd's decision (not adopted): it counts from
  // its first token.
  void OnAttemptStarted(const tally::v1::Job& job);
  // An attempt ended with `outcome` (succeeded, failed, lost, stopped,
  // preempted).
  void OnAttemptEnded(const tally::v1::Job& job, const std::string& outcome);
  // A checkpoint was recorded and priced.
  void OnCheckpoint(const tally::v1::Job& job, const tally::v1::Checkpoint& checkpoint);
  // A running job's progress report, with the routing health of each of
  // its MoE layers (AssessMoeLayer; empty for dense models) and the
  // routing-collapse streak as committed.
  void OnProgress(const tally::v1::Job& job, const tally::v1::Progress& progress,
                  const std::vector<MoeLayerHealth>& moe = {});
  // Removes the series of jobs that ended more than the retention ago.
  void Expire(absl::Time now);
  // Whether `job` has ended, less than the retention before `now` (by its
  // end_time): its series are still due.
  bool WithinRetention(const tally::v1::Job& job, absl::Time now) const;
  // After a restart: rebuilds an ended job's series from its stored record
  // for what is left of its retention, counted from its end_time (nothing
  // when WithinRetention is false). Its final gauges and tally_job_info are
  // those Update sets; tally_job_attempts_ended_total takes the counts of
  // its stored attempts by outcome (`ended_by_outcome`), and
  // tally_job_tokens_total the record's tokens, so a counter is not seen to
  // reset and rise again across the restart (tokens redone by an earlier
  // attempt are not in the record: such a job's token counter restarts
  // lower, which Prometheus reads as a reset).
  void RestoreEnded(const tally::v1::Job& job,
                    const std::map<std::string, int64_t>& ended_by_outcome, absl::Time now);
  // Creates the fleet counters of a GPU type at 0, so that its first event
  // shows in rate() and increase().
  void AddGpuType(const std::string& gpu_type);

  // Jobs with series, ended ones included (for tests and benchmarks).
  size_t NumJobs() const { return jobs_.size(); }

 private:
  using GaugeFamily = Family<Gauge>;
  using CounterFamily = Family<Counter>;
  struct Attempt {
    int32_t attempt = 0;
    bool from_zero = false;  // started here: counts from its first token
    bool seen = false;       // a report of it has arrived
    int64_t tokens = 0;
    int64_t padding_tokens = 0;
    int64_t fp8_overflows = 0;
    int64_t fp8_values = 0;
  };
  struct JobSeries {
    std::set<std::pair<GaugeFamily*, Labels>> gauges;
    std::set<std::pair<CounterFamily*, Labels>> counters;
    // The job's {tally_job} gauges by family, so the tick's refresh of
    // every running job finds them without building labels (the metric
    // objects live until Remove).
    std::map<const GaugeFamily*, Gauge*> simple;
    Labels info;
    // What the info series was last made from (state, stop rule): the rest
    // does not change while a job lives.
    tally::v1::JobState info_state = tally::v1::JOB_STATE_UNSPECIFIED;
    std::string info_stop_rule;
    // Its counters exist (at 0 from submission; the running ones once it ran).
    bool counters_created = false;
    bool running_counters_created = false;
    std::optional<absl::Time> ended;
    Attempt attempt;
  };

  void Set(const std::string& job, GaugeFamily* family, Labels labels, double value);
  // Set for a gauge labelled {tally_job} only.
  void SetSimple(JobSeries& s, const std::string& job, GaugeFamily* family, double value);
  Counter& Count(const std::string& job, CounterFamily* family, Labels labels);
  void SetInfo(const tally::v1::Job& job);
  void SetRecordGauges(const tally::v1::Job& job, const tally::v1::CostStatus& cost);
  void Remove(const std::string& job);

  JobMetricsOptions options_;
  GaugeFamily* info_;
  GaugeFamily* step_;
  GaugeFamily* train_loss_;
  GaugeFamily* val_loss_;
  GaugeFamily* quantized_val_loss_;
  GaugeFamily* best_val_loss_;
  CounterFamily* tokens_;
  GaugeFamily* useful_tokens_per_second_;
  GaugeFamily* padding_fraction_;
  GaugeFamily* cost_;
  GaugeFamily* checkpoint_cost_;
  GaugeFamily* patience_left_;
  GaugeFamily* budget_fraction_;
  CounterFamily* attempts_ended_;
  CounterFamily* fp8_overflows_;
  CounterFamily* fp8_values_;
  GaugeFamily* fp8_product_fraction_;
  GaugeFamily* fp8_amax_;
  GaugeFamily* moe_load_;
  GaugeFamily* moe_entropy_;
  GaugeFamily* moe_dropped_;
  GaugeFamily* moe_expert_tokens_;
  GaugeFamily* moe_expert_share_;
  GaugeFamily* moe_idle_experts_;
  GaugeFamily* moe_collapsed_;
  GaugeFamily* moe_collapsed_evals_;
  GaugeFamily* forecast_;
  GaugeFamily* target_;
  CounterFamily* fleet_tokens_;
  CounterFamily* fleet_fp8_overflows_;
  CounterFamily* fleet_fp8_values_;
  std::map<std::string, JobSeries> jobs_;
};

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_JOB_METRICS_H_
