#include "common/flag_env.h"

#include <map>
#include <string>

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(FlagEnvTest, FlagThenEnvironmentThenDefault) {
  std::map<std::string, std::string> env = {{"TALLY_SET", "from-env"}, {"TALLY_EMPTY", ""}};
  Environment read = [&](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
  EXPECT_EQ(FlagOrEnv("flag", "TALLY_SET", "default", read), "flag");
  EXPECT_EQ(FlagOrEnv("", "TALLY_SET", "default", read), "from-env");
  EXPECT_EQ(FlagOrEnv("", "TALLY_EMPTY", "default", read), "default");
  EXPECT_EQ(FlagOrEnv("", "TALLY_UNSET", "default", read), "default");
  EXPECT_EQ(FlagOrEnv("", "TALLY_UNSET", "", read), "");
  EXPECT_FALSE(FromEnv("flag", "TALLY_SET", read));
  EXPECT_TRUE(FromEnv("", "TALLY_SET", read));
  EXPECT_FALSE(FromEnv("", "TALLY_EMPTY", read));
}

}  // namespace
}  // namespace tally
