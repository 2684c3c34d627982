#include "server/policy/target.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace tally::policy {
namespace {

CurvePoint P(int64_t step, double loss, double usd) {
  return {step, step * 100, usd, usd * 1000, loss};
}

TEST(TargetTest, InterpolatesBetweenTheEvaluationsThatStraddleTheTarget) {
  struct Case {
    const char* name;
    std::vector<CurvePoint> curve;
    double target;
    bool reached;
    double cost_usd;
    int64_t at_step;
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Case& c : std::vector<Case>{
           {"midway", {P(0, 5, 0), P(10, 4, 1), P(20, 3, 2)}, 3.5, true, 1.5, 20},
           {"a quarter of the way", {P(0, 5, 0), P(10, 4, 1), P(20, 2, 3)}, 3.5, true, 1.5, 20},
           {"exactly on an evaluation", {P(0, 5, 0), P(10, 4, 1), P(20, 3, 2)}, 4.0, true, 1.0, 10},
           {"the step-0 evaluation reaches it", {P(0, 2, 0), P(10, 1, 1)}, 2.5, true, 0.0, 0},
           {"never", {P(0, 5, 0), P(10, 4, 1)}, 3.0, false, 0, 0},
           {"empty", {}, 3.0, false, 0, 0},
           {"a NaN before the crossing is not a point",
            {P(0, 5, 0), P(10, nan, 1), P(20, 3, 2)}, 4.0, true, 1.0, 20},
           {"the first crossing counts, not a later dip",
            {P(0, 5, 0), P(10, 3, 1), P(20, 4, 2), P(30, 2, 3)}, 3.5, true, 0.75, 10},
           {"no target", {P(0, 5, 0), P(10, 1, 1)}, 0, false, 0, 0},
           {"a NaN target", {P(0, 5, 0), P(10, 1, 1)}, nan, false, 0, 0},
       }) {
    auto x = FindTargetCrossing(c.curve, c.target);
    ASSERT_EQ(x.has_value(), c.reached) << c.name;
    if (!x) continue;
    EXPECT_NEAR(x->cost_usd, c.cost_usd, 1e-12) << c.name;
    EXPECT_NEAR(x->gpu_seconds, c.cost_usd * 1000, 1e-9) << c.name;
    EXPECT_EQ(x->at.step, c.at_step) << c.name;
  }
}

TEST(TargetTest, TokensAreInterpolatedLikeDollars) {
  auto x = FindTargetCrossing({P(10, 4, 1), P(20, 3, 2)}, 3.75);
  ASSERT_TRUE(x.has_value());
  EXPECT_NEAR(x->tokens, 1250, 1e-9);
  EXPECT_NEAR(x->cost_usd, 1.25, 1e-12);
}

}  // namespace
}  // namespace tally::policy
