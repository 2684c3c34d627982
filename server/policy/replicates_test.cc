#include "server/policy/replicates.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tally::policy {
namespace {

TEST(ReplicatesTest, MeanIntervalIsStudentsT) {
  // 2, 4, 6: mean 4, s = 2, t(2) = 2.920 -> half 2.920 * 2 / sqrt(3).
  const auto i = MeanInterval90(std::vector<double>{2, 4, 6});
  ASSERT_TRUE(i);
  EXPECT_EQ(i->n, 3);
  EXPECT_DOUBLE_EQ(i->mean, 4);
  EXPECT_NEAR(i->high - i->mean, 2.920 * 2 / std::sqrt(3.0), 1e-12);
  EXPECT_NEAR(i->mean - i->low, 2.920 * 2 / std::sqrt(3.0), 1e-12);
  // One value: no spread to estimate.
  const auto one = MeanInterval90(std::vector<double>{5});
  ASSERT_TRUE(one);
  EXPECT_EQ(one->low, 5);
  EXPECT_EQ(one->high, 5);
  EXPECT_FALSE(MeanInterval90({}));
  EXPECT_FALSE(MeanInterval90(std::vector<double>{1, std::nan("")}));
  EXPECT_DOUBLE_EQ(StudentT90(1), 6.314);
  EXPECT_DOUBLE_EQ(StudentT90(100), 1.645);
}

TEST(ReplicatesTest, RatiosAreJudgedOnTheirLogarithms) {
  // 0.5 and 2 average to 1 geometrically, not 1.25.
  const auto even = RatioInterval90(std::vector<double>{0.5, 2.0});
  ASSERT_TRUE(even);
  EXPECT_NEAR(even->mean, 1.0, 1e-12);
  EXPECT_NEAR(even->low * even->high, 1.0, 1e-12);  // symmetric in log
  EXPECT_EQ(RatioVerdict(*even), "no clear difference");
  const auto cheaper = RatioInterval90(std::vector<double>{0.60, 0.62, 0.65});
  ASSERT_TRUE(cheaper);
  EXPECT_LT(cheaper->high, 1);
  EXPECT_EQ(RatioVerdict(*cheaper), "cheaper");
  const auto dearer = RatioInterval90(std::vector<double>{1.4, 1.5, 1.45});
  EXPECT_EQ(RatioVerdict(*dearer), "dearer");
  // Seeds that disagree: a wide interval over 1.
  const auto noisy = RatioInterval90(std::vector<double>{0.43, 1.38, 0.9});
  EXPECT_EQ(RatioVerdict(*noisy), "no clear difference");
  EXPECT_EQ(RatioVerdict(*RatioInterval90(std::vector<double>{0.5})), "one run: no interval");
  EXPECT_FALSE(RatioInterval90(std::vector<double>{0.5, 0}));
  EXPECT_FALSE(RatioInterval90(std::vector<double>{std::numeric_limits<double>::infinity()}));
}

}  // namespace
}  // namespace tally::policy
