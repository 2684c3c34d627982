// Backoff: how long the agent waits before connecting to tallyd again.
// Exponential with jitter: the n-th wait in a row is drawn uniformly from
// [b/2, b), where b = initial * 2^(n-1), capped at `max`, so a fleet that
// lost tallyd does not come back in lockstep. A connection that lasted more
// than `reset_after` starts the sequence again at `initial`.
//
// A pure policy: time comes in as an argument, randomness as a seed (the
// same seed gives the same waits). Not thread-safe.
#ifndef TALLY_WORKER_AGENT_BACKOFF_H_
#define TALLY_WORKER_AGENT_BACKOFF_H_

#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace tally::worker {

class Backoff {
 public:
  static constexpr absl::Duration kDefaultResetAfter = absl::Seconds(10);

  Backoff(absl::Duration initial, absl::Duration max, uint32_t seed,
          absl::Duration reset_after = kDefaultResetAfter);

  // The wait before the next connection, after one that lasted `lasted`
  // (from the attempt to the end of its stream).
  absl::Duration Next(absl::Duration lasted);
  // The bound the next wait is drawn below (unless a long connection
  // resets it first).
  absl::Duration bound() const { return bound_; }

 private:
  const absl::Duration initial_, max_, reset_after_;
  absl::Duration bound_;
  std::mt19937 rng_;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_BACKOFF_H_
