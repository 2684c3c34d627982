#include "server/ha/lease_deadline.h"

#include "common/clock.h"
#include "gtest/gtest.h"

namespace tally::ha {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(10);
constexpr absl::Duration kTick = absl::Nanoseconds(1);

// Advances `clock` to 1 ns short of `at`, where `deadline` must not have
// expired, then to `at`, where it must have.
void ExpectExpiresAt(FakeMonotonicClock& clock, const LeaseDeadline& deadline,
                     absl::Duration at) {
  ASSERT_LT(clock.Elapsed(), at - kTick);
  clock.Advance(at - kTick - clock.Elapsed());
  EXPECT_FALSE(deadline.Expired()) << "1 ns before the deadline";
  clock.Advance(kTick);
  EXPECT_TRUE(deadline.Expired()) << "at the deadline";
}

TEST(LeaseDeadlineTest, ExpiresExactlyAtTheTimeoutNotBefore) {
  FakeMonotonicClock clock;
  const absl::Duration acquired = clock.Elapsed();
  LeaseDeadline deadline(&clock, kTimeout, acquired);
  EXPECT_EQ(deadline.Deadline(), acquired + kTimeout);
  EXPECT_FALSE(deadline.Expired());
  ExpectExpiresAt(clock, deadline, acquired + kTimeout);
  clock.Advance(absl::Hours(1));
  EXPECT_TRUE(deadline.Expired());
}

TEST(LeaseDeadlineTest, CountsFromWhenTheAcquisitionWasSent) {
  // The acquiring statement took 4 s to answer: the lease has 6 s left.
  FakeMonotonicClock clock;
  const absl::Duration sent = clock.Elapsed();
  clock.Advance(absl::Seconds(4));
  LeaseDeadline deadline(&clock, kTimeout, sent);
  ExpectExpiresAt(clock, deadline, sent + kTimeout);
}

TEST(LeaseDeadlineTest, RenewalMovesTheDeadline) {
  FakeMonotonicClock clock;
  const absl::Duration acquired = clock.Elapsed();
  LeaseDeadline deadline(&clock, kTimeout, acquired);
  clock.Advance(absl::Seconds(8));
  const absl::Duration renewed = clock.Elapsed();
  deadline.Renewed(renewed);
  EXPECT_EQ(deadline.Deadline(), renewed + kTimeout);
  // Past the first deadline, the lease holds until the second.
  clock.Advance(absl::Seconds(3));
  EXPECT_GT(clock.Elapsed(), acquired + kTimeout);
  ExpectExpiresAt(clock, deadline, renewed + kTimeout);
}

TEST(LeaseDeadlineTest, RenewalCountsFromItsSendNotItsReply) {
  FakeMonotonicClock clock;
  LeaseDeadline deadline(&clock, kTimeout, clock.Elapsed());
  clock.Advance(absl::Seconds(3));
  const absl::Duration sent = clock.Elapsed();
  clock.Advance(absl::Seconds(2));  // the statement's round trip
  deadline.Renewed(sent);
  EXPECT_EQ(deadline.Deadline(), sent + kTimeout);
  ExpectExpiresAt(clock, deadline, sent + kTimeout);
}

}  // namespace
}  // namespace tally::ha
