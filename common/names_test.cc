#include "common/names.h"

#include "gtest/gtest.h"

namespace tally {
namespace {

TEST(NamesTest, RoundTrip) {
  EXPECT_EQ(JobName(42), "jobs/42");
  EXPECT_EQ(*ParseJobName("jobs/42"), 42);
}

TEST(NamesTest, RejectsMalformed) {
  for (const char* bad : {"", "jobs/", "jobs/0", "jobs/-1", "job/1", "jobs/1x", "42"}) {
    auto id = ParseJobName(bad, "name");
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace tally
