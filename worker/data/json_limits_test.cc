#include "worker/data/json_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace tally::data {
namespace {

TEST(JsonLimitsTest, CountsNestingOutsideStrings) {
  EXPECT_FALSE(JsonNestsDeeperThan("{\"a\": [1, {\"b\": []}]}", 4));
  EXPECT_TRUE(JsonNestsDeeperThan("{\"a\": [1, {\"b\": []}]}", 3));
  EXPECT_FALSE(JsonNestsDeeperThan("{\"a\": \"[[[[{{{{\"}", 1));
  EXPECT_FALSE(JsonNestsDeeperThan("{\"a\": \"\\\"[[[[\"}", 1));
  EXPECT_TRUE(JsonNestsDeeperThan(std::string(1000000, '['), 64));
  EXPECT_FALSE(JsonNestsDeeperThan("]]]]{}", 1));
  EXPECT_FALSE(JsonNestsDeeperThan("", 0));
}

}  // namespace
}  // namespace tally::data
