#include "server/config/logs_config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/tallyd_config.h"

namespace tally::config {
namespace {

using ::testing::HasSubstr;

TEST(LogsConfig, DefaultsToFourMiBAndReadsKeepMib) {
  auto none = ParseTallydConfig("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->logs.keep_bytes(), 4 << 20);
  auto c = ParseTallydConfig("logs: {keep_mib: 0.5}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->logs.keep_bytes(), 512 << 10);
}

TEST(LogsConfig, RefusesNamingTheKeyAndLine) {
  auto c = ParseTallydConfig("usd_per_gpu_hour: {cpu: 1}\nlogs: {keep_mib: 0}\n");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("logs.keep_mib (line 2)"));
  c = ParseTallydConfig("logs: {keep: 3}\n");
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("logs.keep (line 1): unknown key"));
  c = ParseTallydConfig("logs: {keep_mib: lots}\n");
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("0.0625-1024"));
  c = ParseTallydConfig("logs: 4\n");
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("logs (line 1): expected a mapping"));
}

}  // namespace
}  // namespace tally::config
