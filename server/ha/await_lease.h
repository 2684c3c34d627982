// The standby's loop: wait until this tallyd holds the leader lease.
#ifndef TALLY_SERVER_HA_AWAIT_LEASE_H_
#define TALLY_SERVER_HA_AWAIT_LEASE_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/ha/leader_lease.h"

namespace tally::ha {

struct Acquired {
  int64_t epoch = 0;
  // AwaitOptions::clock->Elapsed() read before the acquiring statement was
  // sent: LeaseKeeper's acquired_at (give the keeper the same clock).
  absl::Duration sent;
};

struct AwaitOptions {
  // Between attempts; lease_timeout/5 in tallyd.
  absl::Duration poll_interval = absl::Seconds(2);
  // Run until it succeeds before the first attempt: opens (and migrates) the
  // store, which creates the lease table. UNAVAILABLE is retried every
  // poll_interval; any other error ends the wait with it.
  std::function<absl::Status()> prepare;
  // Sleeps up to the given time; false means stop waiting (SIGTERM).
  std::function<bool(absl::Duration)> wait;
  // Told who leads whenever that changes ("HOST:PORT (epoch N)").
  std::function<void(const std::string&)> on_leader;
  // Stamps Acquired::sent; nothing here decides on time (`wait` paces the
  // attempts). Not owned; must outlive the call.
  const MonotonicClock* clock = RealMonotonicClock::Get();
};

// Tries at once, then every poll_interval, until the lease is ours (its
// epoch), `wait` says stop (nullopt) or `prepare` fails for good (its error).
// Connection errors are logged when they change, not on every attempt.
absl::StatusOr<std::optional<Acquired>> AwaitLease(LeaderLease* lease,
                                                   const AwaitOptions& options);

}  // namespace tally::ha

#endif  // TALLY_SERVER_HA_AWAIT_LEASE_H_
