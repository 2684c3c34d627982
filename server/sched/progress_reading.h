// ProgressReading: what one progress report measures, read against the job
// as the scheduler holds it. Pure: the scheduler applies it to the job in
// memory (ApplyProgressReading). Progress figures are measurements, not
// decisions: they reach the store with the job's next commit (a progress
// event at most every progress_event_interval, or any other change), and
// each report measures them afresh, so a restart loses at most one
// interval's worth. The routing collapse read here feeds the next
// evaluation's warning (DecideEval).
#ifndef TALLY_SERVER_SCHED_PROGRESS_READING_H_
#define TALLY_SERVER_SCHED_PROGRESS_READING_H_

#include <optional>
#include <string>
#include <vector>

#include "server/metrics/job_metrics.h"
#include "server/sched/active_job.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

struct ProgressReading {
  int32_t attempt = 0;
  int64_t step = 0;
  int64_t tokens = 0;
  // Only from a worker that trained (Progress.trained).
  std::optional<double> train_loss;
  std::optional<int64_t> padding_tokens;
  // A steady-state step time for the job's sample: a new step of the same
  // attempt, past its start-up reports (policy::kStartupReports).
  std::optional<double> step_seconds;
  // Each MoE layer's health (metrics::AssessMoeLayer); empty for a dense
  // model or a report without MoE loads.
  std::vector<metrics::MoeLayerHealth> moe;
  // With MoE loads: whether some layer's routing collapsed, and where (the
  // first such layer, in words); unchanged otherwise.
  bool moe_reported = false;
  bool routing_collapsed = false;
  std::string collapse_where;
};

ProgressReading ReadProgress(const ActiveJob& job, const tally::v1::Progress& p);

// The reading applied to the job in memory (a trained report's loss also
// to the job's train_curve, by AddTrainPoint).
void ApplyProgressReading(const ProgressReading& r, ActiveJob& job);

// The most points Job.train_curve keeps.
inline constexpr int kMaxTrainPoints = 2048;

// `point` added to `job`'s train_curve: points at or past its step (a
// resumed attempt redoing steps) are dropped first; a step less than
// train_curve_every after the last kept one is skipped; a full curve
// (`max_points`) drops every other point and doubles train_curve_every (from
// the curve's mean spacing when 0), so a long run keeps an even sample.
void AddTrainPoint(const tally::v1::TrainPoint& point, tally::v1::Job& job,
                   int max_points = kMaxTrainPoints);

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_PROGRESS_READING_H_
