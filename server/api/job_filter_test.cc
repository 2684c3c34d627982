#include "server/api/job_filter.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::api {
namespace {

using ::testing::HasSubstr;

tally::v1::Job JobAt(int64_t seconds, const std::string& display_name,
                     std::map<std::string, std::string> labels) {
  tally::v1::Job job;
  job.mutable_create_time()->set_seconds(seconds);
  job.mutable_spec()->set_display_name(display_name);
  for (const auto& [k, v] : labels) (*job.mutable_spec()->mutable_labels())[k] = v;
  return job;
}

TEST(JobFilterTest, NoFilterMatchesEveryJob) {
  absl::StatusOr<JobFilter> f = ParseJobFilter(tally::v1::ListJobsRequest());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->empty());
  EXPECT_TRUE(Matches(*f, JobAt(0, "", {})));
}

TEST(JobFilterTest, EveryLabelThePrefixAndTheTimeRange) {
  tally::v1::ListJobsRequest req;
  (*req.mutable_labels())["team"] = "nlp";
  (*req.mutable_labels())["sweep"] = "lr";
  req.set_display_name_prefix("lr-");
  req.mutable_created_after()->set_seconds(100);
  req.mutable_created_before()->set_seconds(200);
  absl::StatusOr<JobFilter> f = ParseJobFilter(req);
  ASSERT_TRUE(f.ok()) << f.status();
  const std::map<std::string, std::string> both = {{"team", "nlp"}, {"sweep", "lr"}, {"x", "y"}};
  EXPECT_TRUE(Matches(*f, JobAt(100, "lr-3e-4", both)));      // after is inclusive
  EXPECT_TRUE(Matches(*f, JobAt(199, "lr-", both)));
  EXPECT_FALSE(Matches(*f, JobAt(200, "lr-3e-4", both)));     // before is exclusive
  EXPECT_FALSE(Matches(*f, JobAt(99, "lr-3e-4", both)));
  EXPECT_FALSE(Matches(*f, JobAt(150, "base-lr-", both)));
  EXPECT_FALSE(Matches(*f, JobAt(150, "lr-1", {{"team", "nlp"}})));
  EXPECT_FALSE(Matches(*f, JobAt(150, "lr-1", {{"team", "nlp"}, {"sweep", "wd"}})));
}

TEST(JobFilterTest, RefusalsNameTheFieldAndTheFix) {
  tally::v1::ListJobsRequest req;
  req.mutable_created_after()->set_seconds(200);
  req.mutable_created_before()->set_seconds(100);
  EXPECT_THAT(std::string(ParseJobFilter(req).status().message()),
              HasSubstr("created_before: 1970-01-01T00:01:40Z is not after created_after"));
  req.Clear();
  req.mutable_created_after()->set_nanos(-1);
  EXPECT_THAT(std::string(ParseJobFilter(req).status().message()), HasSubstr("created_after: not a valid"));
  req.Clear();
  (*req.mutable_labels())[""] = "x";
  EXPECT_THAT(std::string(ParseJobFilter(req).status().message()), HasSubstr("labels[\"\"]: a label key"));
  req.Clear();
  (*req.mutable_labels())["k"] = std::string(257, 'v');
  EXPECT_THAT(std::string(ParseJobFilter(req).status().message()), HasSubstr("at most 256"));
  req.Clear();
  for (int i = 0; i < 17; ++i) (*req.mutable_labels())[std::to_string(i)] = "v";
  EXPECT_THAT(std::string(ParseJobFilter(req).status().message()), HasSubstr("labels: 17 given"));
  req.Clear();
  req.set_display_name_prefix(std::string(300, 'a'));
  EXPECT_THAT(std::string(ParseJobFilter(req).status().message()), HasSubstr("display_name_prefix: 300"));
}

}  // namespace
}  // namespace tally::api
