#include "server/policy/step_times.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace tally::policy {
namespace {

TEST(StepTimesTest, TheSampleStaysBoundedAndSpansTheRun) {
  StepTimeSample s;
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(AddStepTime(1.0 + i, &s));
  EXPECT_LT(static_cast<int>(s.seconds.size()), kMaxStepTimes);
  EXPECT_GT(static_cast<int>(s.seconds.size()), kMaxStepTimes / 4);
  EXPECT_EQ(s.reports, 10000);
  // Evenly: the first report, then one every `stride`.
  for (size_t i = 0; i < s.seconds.size(); ++i) {
    EXPECT_EQ(s.seconds[i], 1.0 + static_cast<double>(i) * s.stride) << i;
  }
  EXPECT_GT(s.seconds.back(), 9000) << "the sample reaches the end of the run";
  // Garbage is refused, not sampled.
  for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity(), 1e9}) {
    EXPECT_FALSE(AddStepTime(bad, &s)) << bad;
  }
  EXPECT_EQ(s.reports, 10000);
}

TEST(StepTimesTest, TheMedianIgnoresASlowStretch) {
  // A quarter of the run on a busy machine, three times slower: the median
  // (what a recipe cost is priced at) stays the quiet step time, and the
  // spread flags the variant.
  std::vector<double> v;
  for (int i = 0; i < 300; ++i) v.push_back(0.30 + 0.001 * (i % 10));
  for (int i = 0; i < 100; ++i) v.push_back(0.95);
  const auto s = Summarize(v);
  ASSERT_TRUE(s.has_value());
  EXPECT_NEAR(s->median, 0.306, 1e-9);
  EXPECT_NEAR(s->p10, 0.301, 1e-9);
  EXPECT_EQ(s->p90, 0.95);
  EXPECT_TRUE(s->varied());
  // A steady run is not flagged.
  const auto steady = Summarize(std::vector<double>(50, 0.5));
  EXPECT_EQ(steady->median, 0.5);
  EXPECT_EQ(steady->spread(), 0);
  EXPECT_FALSE(steady->varied());
  EXPECT_FALSE(Summarize({}).has_value());
  EXPECT_EQ(Summarize({2.0})->median, 2.0);
  EXPECT_EQ(Summarize({1.0, 3.0})->median, 2.0);
}

}  // namespace
}  // namespace tally::policy
