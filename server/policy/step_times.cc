#include "server/policy/step_times.h"

#include <algorithm>
#include <cmath>

namespace tally::policy {

bool AddStepTime(double seconds, StepTimeSample* s) {
  if (!(std::isfinite(seconds) && seconds > 0 && seconds < 86400)) return false;
  if (s->stride < 1) s->stride = 1;
  const int64_t index = s->reports++;
  if (index % s->stride != 0) return true;
  s->seconds.push_back(seconds);
  if (static_cast<int>(s->seconds.size()) >= kMaxStepTimes) {
    // Keep values 0, 2, 4, ...: reports 0, 2 x stride, ...
    std::vector<double> kept;
    for (size_t i = 0; i < s->seconds.size(); i += 2) kept.push_back(s->seconds[i]);
    s->seconds = std::move(kept);
    s->stride *= 2;
  }
  return true;
}

std::optional<StepTimeSummary> Summarize(const std::vector<double>& seconds) {
  std::vector<double> v;
  for (double x : seconds) {
    if (std::isfinite(x) && x > 0) v.push_back(x);
  }
  if (v.empty()) return std::nullopt;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  // Nearest rank: the smallest value with at least q of the sample at or
  // below it.
  auto rank = [&](double q) {
    const size_t r = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
    return v[std::min(n, std::max<size_t>(1, r)) - 1];
  };
  StepTimeSummary s;
  s.n = static_cast<int64_t>(n);
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.p10 = rank(0.1);
  s.p90 = rank(0.9);
  return s;
}

}  // namespace tally::policy
