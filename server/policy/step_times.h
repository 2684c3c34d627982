// A job's step times (pure): a bounded sample of its steady-state seconds
// per step that stays spread over the whole run, and the robust figures an
// experiment's recipe cost reads from it.
//
// Sampling: every `stride`-th value is kept; when the sample is full, every
// other kept value is dropped and the stride doubles, so the sample always
// covers the run evenly (the first value, then one every `stride`) in at
// most kMaxStepTimes values, whatever the run's length, and the same
// reports always leave the same sample.
#ifndef TALLY_SERVER_POLICY_STEP_TIMES_H_
#define TALLY_SERVER_POLICY_STEP_TIMES_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace tally::policy {

inline constexpr int kMaxStepTimes = 256;
// An attempt's first progress reports include start-up (the model built,
// the first kernels compiled, caches cold): they are not steady state.
inline constexpr int kStartupReports = 3;
// Step times spread more than this (10th to 90th percentile over the
// median) make a recipe cost less certain: the variant is flagged.
inline constexpr double kVariedSpread = 0.25;

struct StepTimeSample {
  std::vector<double> seconds;
  int64_t stride = 1;
  int64_t reports = 0;  // values offered
};

// Offers one step time; a value that is not a finite positive number below
// a day is ignored (false).
bool AddStepTime(double seconds, StepTimeSample* s);

struct StepTimeSummary {
  double median = 0;
  double p10 = 0, p90 = 0;  // nearest-rank percentiles of the sample
  int64_t n = 0;            // values in the sample
  double spread() const { return median > 0 ? (p90 - p10) / median : 0; }
  bool varied() const { return spread() > kVariedSpread; }
};

// nullopt for an empty sample.
std::optional<StepTimeSummary> Summarize(const std::vector<double>& seconds);

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_STEP_TIMES_H_
