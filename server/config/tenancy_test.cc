#include "server/config/tenancy.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/tallyd_config.h"

namespace tally::config {
namespace {

using ::testing::HasSubstr;

TEST(TenancyTest, DefaultsCapEveryTenantAt100AndKeepPreemptionInside) {
  absl::StatusOr<TallydConfig> c = ParseTallydConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenancy.MaxPriority("research"), 100);
  EXPECT_FALSE(c->tenancy.cross_tenant_preemption);
  EXPECT_TRUE(c->tenancy.CheckPriority("research", 100).ok());
  absl::Status s = c->tenancy.CheckPriority("research", 101);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.priority: 101 is above the maximum of 100"));
  // The global tenant (a global admin's jobs) is not capped.
  EXPECT_TRUE(c->tenancy.CheckPriority("", 1000).ok());
}

TEST(TenancyTest, PerTenantOverrides) {
  absl::StatusOr<TallydConfig> c = ParseTallydConfig(
      "tenancy:\n"
      "  max_priority: 10\n"
      "  tenant_max_priority: {research: 500, batch: -5}\n"
      "  cross_tenant_preemption: true\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tenancy.MaxPriority("research"), 500);
  EXPECT_EQ(c->tenancy.MaxPriority("batch"), -5);
  EXPECT_EQ(c->tenancy.MaxPriority("dev"), 10);
  EXPECT_TRUE(c->tenancy.cross_tenant_preemption);
  EXPECT_TRUE(c->tenancy.CheckPriority("research", 500).ok());
  EXPECT_FALSE(c->tenancy.CheckPriority("batch", 0).ok());
  EXPECT_THAT(c->tenancy.CheckPriority("dev", 11, "variants[1].priority").message(),
              HasSubstr("variants[1].priority: 11 is above the maximum of 10 for tenant dev"));
}

TEST(TenancyTest, BadValuesNameTheKey) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  for (const Case& c : {
           Case{"tenancy: 5\n", "tenancy (line 1): expected a mapping"},
           Case{"tenancy: {max_priority: 2000}\n", "tenancy.max_priority (line 1): must be"},
           Case{"tenancy: {max_priority: 1.5}\n", "whole number"},
           Case{"tenancy: {tenant_max_priority: {research: x}}\n",
                "tenancy.tenant_max_priority.research (line 1): not a number"},
           Case{"tenancy: {cross_tenant_preemption: maybe}\n", "expected true or false"},
           Case{"tenancy: {max_prio: 5}\n", "tenancy.max_prio (line 1): unknown key"},
       }) {
    absl::StatusOr<TallydConfig> parsed = ParseTallydConfig(c.yaml);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.yaml;
  }
}

}  // namespace
}  // namespace tally::config
