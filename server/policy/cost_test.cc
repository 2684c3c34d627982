#include "server/policy/cost.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::policy {
namespace {

using ::testing::HasSubstr;

TEST(CostTest, DollarsAreGpuHoursTimesPrice) {
  EXPECT_DOUBLE_EQ(CostUsd(absl::Minutes(30), 4, 2.0), 4.0);
  EXPECT_DOUBLE_EQ(CostUsd(absl::ZeroDuration(), 4, 2.0), 0.0);
}

TEST(CostTest, PricesACheckpointAgainstThePreviousOne) {
  struct Case {
    double cost, val;
    PreviousCheckpoint prev;
    double want_since, want_per_improvement;
  };
  for (const Case& c : std::vector<Case>{
           {10, 2.5, {4, 100, 3.0}, 6, 12},   // $6 for 0.5 nats
           {10, 3.5, {4, 100, 3.0}, 6, 0},    // got worse
           {10, 0, {4, 100, 3.0}, 6, 0},      // no eval at this step
           {10, 2.5, {0, 0, 0}, 10, 0},       // nothing to compare with
       }) {
    auto p = PriceCheckpoint(c.cost, 250, c.val, c.prev);
    EXPECT_DOUBLE_EQ(p.cost_since_previous_usd, c.want_since);
    EXPECT_DOUBLE_EQ(p.usd_per_val_loss_improvement, c.want_per_improvement);
    EXPECT_EQ(p.tokens_since_previous, 250 - c.prev.tokens);
  }
}

TEST(CostTest, EstimatesSecondsAndDollars) {
  // 1e9 FLOPs/token x 1e6 tokens = 1e15 FLOPs; 2 GPUs at 1e12 FLOP/s: 500 s.
  Estimate e = EstimateRun(1e9, 1000000, 2, 1e12, 3.6);
  EXPECT_DOUBLE_EQ(e.seconds, 500);
  EXPECT_DOUBLE_EQ(e.gpu_hours, 1000.0 / 3600);
  EXPECT_DOUBLE_EQ(e.cost_usd, 1.0);
  EXPECT_EQ(EstimateRun(1e9, 10, 1, 0, 3.6).cost_usd, 0);  // unknown throughput
}

}  // namespace
}  // namespace tally::policy
