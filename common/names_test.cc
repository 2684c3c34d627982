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

TEST(NamesTest, MessageEscapesTheName) {
  auto id = ParseJobName("jobs/\x1b[2J", "name");
  EXPECT_EQ(id.status().message(),
            "name: expected a job name like \"jobs/42\", got \"jobs/\\x1b[2J\"");
}

}  // namespace
}  // namespace tally
