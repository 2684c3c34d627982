#include "worker/agent/backoff.h"

#include <algorithm>

namespace tally::worker {

Backoff::Backoff(absl::Duration initial, absl::Duration max, uint32_t seed,
                 absl::Duration reset_after)
    : initial_(initial), max_(max), reset_after_(reset_after), bound_(initial), rng_(seed) {}

absl::Duration Backoff::Next(absl::Duration lasted) {
  if (lasted > reset_after_) bound_ = initial_;
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  const absl::Duration wait = bound_ * jitter(rng_);
  bound_ = std::min(bound_ * 2, max_);
  return wait;
}

}  // namespace tally::worker
