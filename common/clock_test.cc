#include "common/clock.h"

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(FakeMonotonicClockTest, StandsStillUntilAdvanced) {
  FakeMonotonicClock clock(absl::Seconds(5));
  EXPECT_EQ(clock.Elapsed(), absl::Seconds(5));
  EXPECT_EQ(clock.Elapsed(), absl::Seconds(5));
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(clock.Elapsed(), absl::Seconds(5) + absl::Nanoseconds(1));
  clock.Advance(absl::Minutes(2));
  EXPECT_EQ(clock.Elapsed(), absl::Seconds(125) + absl::Nanoseconds(1));
}

TEST(FakeMonotonicClockTest, NeverGoesBack) {
  FakeMonotonicClock clock;
  const absl::Duration start = clock.Elapsed();
  clock.Advance(-absl::Seconds(1));
  EXPECT_EQ(clock.Elapsed(), start);
}

TEST(RealMonotonicClockTest, NeverGoesBack) {
  const MonotonicClock* clock = RealMonotonicClock::Get();
  EXPECT_EQ(clock, RealMonotonicClock::Get());
  absl::Duration last = clock->Elapsed();
  for (int i = 0; i < 1000; ++i) {
    const absl::Duration now = clock->Elapsed();
    ASSERT_GE(now, last);
    last = now;
  }
}

}  // namespace
}  // namespace tally
