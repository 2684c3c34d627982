#include "server/ha/lease_deadline.h"

namespace tally::ha {

LeaseDeadline::LeaseDeadline(const MonotonicClock* clock, absl::Duration lease_timeout,
                             absl::Duration acquired_at)
    : clock_(clock),
      lease_timeout_(lease_timeout),
      last_renewed_(absl::ToInt64Nanoseconds(acquired_at)) {}

void LeaseDeadline::Renewed(absl::Duration sent) {
  last_renewed_.store(absl::ToInt64Nanoseconds(sent));
}

absl::Duration LeaseDeadline::Deadline() const {
  return absl::Nanoseconds(last_renewed_.load()) + lease_timeout_;
}

bool LeaseDeadline::Expired() const { return clock_->Elapsed() >= Deadline(); }

}  // namespace tally::ha
