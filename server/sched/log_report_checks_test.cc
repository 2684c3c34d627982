#include "server/sched/log_report_checks.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sched/report_checks.h"

namespace tally::sched {
namespace {

using ::testing::HasSubstr;

tally::v1::LogBatch Batch(int lines = 1) {
  tally::v1::LogBatch b;
  b.set_job("jobs/1");
  b.set_attempt(1);
  for (int i = 0; i < lines; ++i) {
    auto* l = b.add_lines();
    l->set_text("step 1");
    l->set_level("info");
    l->set_source("trainer");
    l->mutable_time()->set_seconds(1765000000);
  }
  return b;
}

std::string Refusal(const tally::v1::LogBatch& b) {
  absl::Status s = CheckLogBatch(b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(CheckLogBatch, TakesAWellFormedBatch) {
  EXPECT_TRUE(CheckLogBatch(Batch(512)).ok());
  tally::v1::WorkerMessage m;
  *m.mutable_logs() = Batch();
  EXPECT_TRUE(CheckReportFigures(m).ok());
  EXPECT_EQ(ReportedAttempt(m), std::make_pair(std::string("jobs/1"), 1));
}

TEST(CheckLogBatch, RefusesWhatIsOverTheLimitsNamingTheField) {
  EXPECT_THAT(Refusal(Batch(513)), HasSubstr("logs.lines: at most 512"));
  tally::v1::LogBatch big = Batch(100);
  for (auto& l : *big.mutable_lines()) l.set_text(std::string(4000, 'x'));
  EXPECT_THAT(Refusal(big), HasSubstr("bytes of text a batch"));
  tally::v1::LogBatch b = Batch();
  b.mutable_lines(0)->set_text(std::string(4097, 'x'));
  EXPECT_THAT(Refusal(b), HasSubstr("logs.lines[0].text: at most 4096 bytes"));
  b = Batch();
  b.mutable_lines(0)->set_text("two\nlines");
  EXPECT_THAT(Refusal(b), HasSubstr("no newline"));
}

TEST(CheckLogBatch, RefusesFieldsOnlyTallydSetsAndBadLabels) {
  tally::v1::LogBatch b = Batch();
  b.mutable_lines(0)->set_level("loud");
  EXPECT_THAT(Refusal(b), HasSubstr("logs.lines[0].level"));
  b = Batch();
  b.mutable_lines(0)->set_source("tally");  // markers are tallyd's
  EXPECT_THAT(Refusal(b), HasSubstr("logs.lines[0].source"));
  b = Batch();
  b.mutable_lines(0)->set_sequence(5);
  EXPECT_THAT(Refusal(b), HasSubstr("tallyd's to set"));
  b = Batch();
  b.mutable_lines(0)->clear_time();
  EXPECT_THAT(Refusal(b), HasSubstr("logs.lines[0].time"));
  b = Batch();
  b.set_attempt(0);
  EXPECT_THAT(Refusal(b), HasSubstr("attempt"));
  b = Batch();
  b.set_dropped_bytes(-1);
  EXPECT_THAT(Refusal(b), HasSubstr("logs.dropped_bytes"));
  b = Batch();
  b.set_rank(-1);
  EXPECT_THAT(Refusal(b), HasSubstr("logs.rank"));
}

}  // namespace
}  // namespace tally::sched
