#include "worker/train/lr_schedule.h"

#include "gtest/gtest.h"

namespace tally::train {
namespace {

TEST(LearningRateTest, WarmupThenCosine) {
  struct Case {
    int64_t step;
    double want;
  };
  // lr 1.0, min 0.1, warmup 10, max 110.
  for (const Case& c : std::vector<Case>{{1, 0.1},
                                         {5, 0.5},
                                         {10, 1.0},
                                         {60, 0.55},  // halfway down the cosine
                                         {110, 0.1},
                                         {200, 0.1}}) {
    EXPECT_NEAR(LearningRate(c.step, 1.0, 0.1, 10, 110), c.want, 1e-12) << c.step;
  }
  EXPECT_NEAR(LearningRate(1, 2.0, 0.0, 0, 1), 0.0, 1e-12);  // no warmup, one step
  EXPECT_NEAR(LearningRate(3, 2.0, 0.0, 5, 5), 1.2, 1e-12);  // all warmup
}

TEST(NonFiniteGuardTest, FailsOnlyOnAStreak) {
  NonFiniteGuard g(3);
  EXPECT_FALSE(g.Observe(false));
  EXPECT_FALSE(g.Observe(false));
  EXPECT_FALSE(g.Observe(true));  // the streak resets
  EXPECT_FALSE(g.Observe(false));
  EXPECT_FALSE(g.Observe(false));
  EXPECT_TRUE(g.Observe(false));
  EXPECT_EQ(g.streak(), 3);
}

}  // namespace
}  // namespace tally::train
