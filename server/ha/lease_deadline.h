// LeaseDeadline: when a leader that holds the lease must stop acting as one.
#ifndef TALLY_SERVER_HA_LEASE_DEADLINE_H_
#define TALLY_SERVER_HA_LEASE_DEADLINE_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "common/clock.h"

namespace tally::ha {

// The lease counts as lost from exactly lease_timeout after the last
// successful renewal (or the acquisition) was sent, on `clock`. Counting from
// the send, not the reply, keeps the deadline no later than the row's
// expires_at, which the database sets when it runs the statement.
//
// Thread-safe: one thread calls Renewed(), any thread may call Expired() and
// Deadline(). `clock` is not owned and must outlive the deadline.
class LeaseDeadline {
 public:
  // `acquired_at`: clock->Elapsed() read before the acquiring statement was
  // sent.
  LeaseDeadline(const MonotonicClock* clock, absl::Duration lease_timeout,
                absl::Duration acquired_at);

  // A renewal sent at `sent` (clock->Elapsed() before sending) succeeded.
  void Renewed(absl::Duration sent);
  // True once the clock reaches Deadline().
  bool Expired() const;
  // Last renewal (or acquisition) + lease_timeout, on the clock.
  absl::Duration Deadline() const;

  const MonotonicClock* clock() const { return clock_; }
  absl::Duration lease_timeout() const { return lease_timeout_; }

 private:
  const MonotonicClock* const clock_;
  const absl::Duration lease_timeout_;
  // When the last successful renewal (or the acquisition) was sent, in
  // nanoseconds of clock_->Elapsed(): written by the renewal thread, read by
  // the watcher.
  std::atomic<int64_t> last_renewed_;
};

}  // namespace tally::ha

#endif  // TALLY_SERVER_HA_LEASE_DEADLINE_H_
