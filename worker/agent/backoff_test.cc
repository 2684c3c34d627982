#include "worker/agent/backoff.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace tally::worker {
namespace {

constexpr absl::Duration kShort = absl::Seconds(1);  // a connection that failed soon

TEST(BackoffTest, WaitsDoubleUpToTheCapAndAJitteredWaitStaysInItsRange) {
  struct Row {
    absl::Duration lasted;
    absl::Duration bound;  // each wait is in [bound/2, bound)
  };
  const std::vector<Row> rows = {
      {kShort, absl::Milliseconds(200)},
      {kShort, absl::Milliseconds(400)},
      {kShort, absl::Milliseconds(800)},
      {kShort, absl::Milliseconds(1600)},
      {kShort, absl::Milliseconds(3200)},
      {kShort, absl::Seconds(5)},  // capped
      {kShort, absl::Seconds(5)},
      {absl::Seconds(10), absl::Seconds(5)},  // exactly 10 s: not long enough to reset
      {absl::Seconds(11), absl::Milliseconds(200)},  // a long connection: from the start
      {kShort, absl::Milliseconds(400)},
      {absl::Minutes(5), absl::Milliseconds(200)},
  };
  for (uint32_t seed : {1u, 2u, 12345u}) {
    Backoff b(absl::Milliseconds(200), absl::Seconds(5), seed);
    for (size_t i = 0; i < rows.size(); ++i) {
      const absl::Duration wait = b.Next(rows[i].lasted);
      EXPECT_GE(wait, rows[i].bound / 2) << "seed " << seed << ", row " << i;
      EXPECT_LT(wait, rows[i].bound) << "seed " << seed << ", row " << i;
    }
  }
}

TEST(BackoffTest, TheBoundIsWhatTheNextWaitIsDrawnBelow) {
  Backoff b(absl::Milliseconds(10), absl::Milliseconds(40), /*seed=*/7);
  EXPECT_EQ(b.bound(), absl::Milliseconds(10));
  b.Next(kShort);
  EXPECT_EQ(b.bound(), absl::Milliseconds(20));
  b.Next(kShort);
  b.Next(kShort);
  b.Next(kShort);
  EXPECT_EQ(b.bound(), absl::Milliseconds(40));
  b.Next(absl::Seconds(30));  // reset, then the wait from 10 ms
  EXPECT_EQ(b.bound(), absl::Milliseconds(20));
}

TEST(BackoffTest, TheResetThresholdIsConfigurable) {
  Backoff b(absl::Milliseconds(100), absl::Seconds(1), /*seed=*/3, absl::Seconds(2));
  b.Next(kShort);
  b.Next(kShort);
  EXPECT_EQ(b.bound(), absl::Milliseconds(400));
  const absl::Duration wait = b.Next(absl::Seconds(3));
  EXPECT_LT(wait, absl::Milliseconds(100));
}

TEST(BackoffTest, TheSameSeedGivesTheSameWaitsAndAnotherSeedOthers) {
  Backoff a(absl::Seconds(1), absl::Seconds(1), /*seed=*/42);
  Backoff same(absl::Seconds(1), absl::Seconds(1), /*seed=*/42);
  Backoff other(absl::Seconds(1), absl::Seconds(1), /*seed=*/43);
  int differ = 0;
  for (int i = 0; i < 20; ++i) {
    const absl::Duration w = a.Next(kShort);
    EXPECT_EQ(w, same.Next(kShort)) << i;
    differ += w != other.Next(kShort);
  }
  EXPECT_GT(differ, 15);
}

TEST(BackoffTest, TheJitterSpreadsOverTheWholeRange) {
  // With the bound fixed at 1 s, waits spread over [0.5 s, 1 s): a fleet
  // that lost tallyd does not come back in lockstep.
  Backoff b(absl::Seconds(1), absl::Seconds(1), /*seed=*/99);
  absl::Duration lo = absl::InfiniteDuration(), hi = absl::ZeroDuration();
  int below_three_quarters = 0;
  constexpr int kDraws = 2000;
  for (int i = 0; i < kDraws; ++i) {
    const absl::Duration w = b.Next(kShort);
    lo = std::min(lo, w);
    hi = std::max(hi, w);
    below_three_quarters += w < absl::Milliseconds(750);
  }
  EXPECT_GE(lo, absl::Milliseconds(500));
  EXPECT_LT(lo, absl::Milliseconds(510));
  EXPECT_LT(hi, absl::Seconds(1));
  EXPECT_GT(hi, absl::Milliseconds(990));
  // About half below the middle (uniform), far from all or none.
  EXPECT_GT(below_three_quarters, kDraws * 4 / 10);
  EXPECT_LT(below_three_quarters, kDraws * 6 / 10);
}

}  // namespace
}  // namespace tally::worker
