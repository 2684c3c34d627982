// What several runs of one recipe say together (pure): the mean of a figure
// over replicates with a 90% interval, and whether a ratio is told apart
// from 1. A verdict is a distribution: one run is one sample, and the seed
// can move a run's loss by more than the recipe does.
#ifndef TALLY_SERVER_POLICY_REPLICATES_H_
#define TALLY_SERVER_POLICY_REPLICATES_H_

#include <optional>
#include <string>

#include "absl/types/span.h"

namespace tally::policy {

struct Interval {
  double mean = 0;
  double low = 0;   // 90% two-sided interval of the mean
  double high = 0;
  int n = 0;
  bool Contains(double x) const { return low <= x && x <= high; }
};

// Student's t quantile for a two-sided 90% interval (the 95th percentile)
// with `df` >= 1 degrees of freedom; the normal's 1.645 past 30.
double StudentT90(int df);

// The arithmetic mean of `values` and its 90% interval, mean +- t * s /
// sqrt(n) with the sample standard deviation s. One value: low = high =
// mean. Nullopt for none, or for a value that is not finite.
std::optional<Interval> MeanInterval90(absl::Span<const double> values);

// Ratios (each > 0 and finite): the geometric mean and the 90% interval
// taken on their logarithms, so that 0.5x and 2x are as far from 1.
// Nullopt for none, or for a ratio that is not positive and finite.
std::optional<Interval> RatioInterval90(absl::Span<const double> ratios);

// "cheaper" (the interval is all below 1), "dearer" (all above), "no clear
// difference" (it contains 1) or, from one ratio, "one run: no interval".
std::string RatioVerdict(const Interval& ratio);

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_REPLICATES_H_
