#include "server/policy/replicates.h"

#include <cmath>
#include <vector>

namespace tally::policy {

double StudentT90(int df) {
  // t_{0.95, df}, df = 1..30.
  static constexpr double kT[] = {6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860,
                                  1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753, 1.746,
                                  1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711,
                                  1.708, 1.706, 1.703, 1.701, 1.699, 1.697};
  if (df < 1) df = 1;
  return df <= 30 ? kT[df - 1] : 1.645;
}

std::optional<Interval> MeanInterval90(absl::Span<const double> values) {
  if (values.empty()) return std::nullopt;
  double sum = 0;
  for (double v : values) {
    if (!std::isfinite(v)) return std::nullopt;
    sum += v;
  }
  Interval i;
  i.n = static_cast<int>(values.size());
  i.mean = sum / i.n;
  i.low = i.high = i.mean;
  if (i.n < 2) return i;
  double ss = 0;
  for (double v : values) ss += (v - i.mean) * (v - i.mean);
  const double half = StudentT90(i.n - 1) * std::sqrt(ss / (i.n - 1)) / std::sqrt(i.n);
  i.low = i.mean - half;
  i.high = i.mean + half;
  return i;
}

std::optional<Interval> RatioInterval90(absl::Span<const double> ratios) {
  std::vector<double> logs;
  logs.reserve(ratios.size());
  for (double r : ratios) {
    if (!(std::isfinite(r) && r > 0)) return std::nullopt;
    logs.push_back(std::log(r));
  }
  std::optional<Interval> l = MeanInterval90(logs);
  if (!l) return std::nullopt;
  return Interval{std::exp(l->mean), std::exp(l->low), std::exp(l->high), l->n};
}

std::string RatioVerdict(const Interval& ratio) {
  if (ratio.n < 2) return "one run: no interval";
  if (ratio.high < 1) return "cheaper";
  if (ratio.low > 1) return "dearer";
  return "no clear difference";
}

}  // namespace tally::policy
