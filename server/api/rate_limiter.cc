#include "server/api/rate_limiter.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace tally::api {

double RateLimiter::TokensAt(const Bucket& b, absl::Time now) const {
  const double burst = static_cast<double>(options_.burst);
  // A clock that steps back refills nothing.
  const double elapsed = std::max(0.0, absl::ToDoubleSeconds(now - b.updated));
  return std::min(burst, b.tokens + elapsed * options_.per_second);
}

void RateLimiter::Forget(absl::Time now) {
  if (buckets_.size() < kMaxTracked) return;
  const double burst = static_cast<double>(options_.burst);
  for (auto it = buckets_.begin(); it != buckets_.end();) {
    // A full bucket is the same as a new one.
    it = TokensAt(it->second, now) >= burst ? buckets_.erase(it) : std::next(it);
  }
}

absl::Status RateLimiter::Take(const std::string& principal, absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (options_.per_second <= 0) return absl::OkStatus();
  auto it = buckets_.find(principal);
  if (it == buckets_.end()) {
    Forget(now);
    it = buckets_.emplace(principal, Bucket{static_cast<double>(options_.burst), now}).first;
  }
  Bucket& b = it->second;
  b.tokens = TokensAt(b, now);
  b.updated = std::max(b.updated, now);
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return absl::OkStatus();
  }
  const absl::Duration wait = absl::Seconds((1 - b.tokens) / options_.per_second);
  return absl::ResourceExhaustedError(absl::StrCat(
      EscapeUnprintable(principal), " is over its limit of ", options_.per_second, " ",
      options_.what, " per second (", options_.rate_key, ", bursts of ", options_.burst, ", ",
      options_.burst_key, " in tallyd's --config); retry in ",
      absl::FormatDuration(absl::Ceil(wait, absl::Milliseconds(1)))));
}

void RateLimiter::SetLimits(double per_second, int64_t burst) {
  absl::MutexLock lock(&mu_);
  options_.per_second = per_second;
  options_.burst = std::max<int64_t>(burst, 1);
  for (auto& [unused, b] : buckets_) {
    b.tokens = std::min(b.tokens, static_cast<double>(options_.burst));
  }
}

absl::Duration RateLimiter::WaitFor(const std::string& principal, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  if (options_.per_second <= 0) return absl::ZeroDuration();
  auto it = buckets_.find(principal);
  if (it == buckets_.end()) return absl::ZeroDuration();
  const double tokens = TokensAt(it->second, now);
  if (tokens >= 1) return absl::ZeroDuration();
  return absl::Seconds((1 - tokens) / options_.per_second);
}

size_t RateLimiter::num_tracked() const {
  absl::MutexLock lock(&mu_);
  return buckets_.size();
}

}  // namespace tally::api
