#include "server/ledger/tenant_quota.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::ledger {
namespace {

using ::testing::HasSubstr;

const absl::Time kNoon = absl::FromUnixSeconds(1'800'000'000);  // an hour boundary + x

TEST(TenantSpendTest, WindowsSumTheHoursTheyCover) {
  TenantSpend s;
  const int64_t now = TenantSpend::HourOf(kNoon);
  s.Add("research", now, 1.0);
  s.Add("research", now - 23, 2.0);       // inside the day
  s.Add("research", now - 24, 4.0);       // a day ago: outside the day, inside the month
  s.Add("research", now - 24 * 30, 8.0);  // outside the month
  s.Add("dev", now, 16.0);
  EXPECT_DOUBLE_EQ(s.Window("research", kNoon, kQuotaDay), 3.0);
  EXPECT_DOUBLE_EQ(s.Window("research", kNoon, kQuotaMonth), 7.0);
  EXPECT_DOUBLE_EQ(s.Window("dev", kNoon, kQuotaDay), 16.0);
  EXPECT_DOUBLE_EQ(s.Window("nobody", kNoon, kQuotaDay), 0.0);
  // Nothing negative, NaN or infinite is counted.
  s.Add("research", now, -5.0);
  s.Add("research", now, std::nan(""));
  EXPECT_DOUBLE_EQ(s.Window("research", kNoon, kQuotaDay), 3.0);
  // The window rolls: a day later only the later hours count.
  EXPECT_DOUBLE_EQ(s.Window("research", kNoon + absl::Hours(23), kQuotaDay), 1.0);
  s.Prune(kNoon);
  EXPECT_DOUBLE_EQ(s.Window("research", kNoon, kQuotaMonth + absl::Hours(24)), 7.0);
}

TEST(CheckDollarQuotaTest, StopsAtTheFirstWindowReached) {
  TenantSpend s;
  TenantQuotas q{{"research", {0, 10.0, 100.0}}, {"open", {4, 0, 0}}};
  s.Add("research", TenantSpend::HourOf(kNoon), 9.0);
  EXPECT_FALSE(CheckDollarQuota("research", q, s, kNoon));
  EXPECT_FALSE(CheckDollarQuota("unlisted", q, s, kNoon));
  EXPECT_FALSE(CheckDollarQuota("open", q, s, kNoon));
  // Spend not yet committed counts.
  auto stop = CheckDollarQuota("research", q, s, kNoon, 1.5);
  ASSERT_TRUE(stop);
  EXPECT_THAT(stop->reason, HasSubstr("tenant quota: research"));
  EXPECT_THAT(stop->reason, HasSubstr("max_dollars_per_day"));
  EXPECT_THAT(stop->detail, HasSubstr("tenants.research.max_dollars_per_day"));
  // The month, with the day unlimited.
  q["research"].max_dollars_per_day = 0;
  s.Add("research", TenantSpend::HourOf(kNoon) - 100, 95.0);
  stop = CheckDollarQuota("research", q, s, kNoon);
  ASSERT_TRUE(stop);
  EXPECT_THAT(stop->reason, HasSubstr("max_dollars_per_month"));
}

}  // namespace
}  // namespace tally::ledger
