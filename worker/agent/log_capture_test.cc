#include "worker/agent/log_capture.h"

#include "worker/agent/outbox.h"

#include <string>

#include "common/log_lines.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace tally::worker {
namespace {

CapturedLine Captured(const std::string& job, int32_t attempt, const std::string& text) {
  CapturedLine c;
  c.key = {job, attempt, 0};
  c.line.set_text(text);
  c.line.set_level("info");
  c.line.set_source("trainer");
  return c;
}

TEST(BatchLines, OneAttemptABatchWithinTheLimits) {
  std::vector<CapturedLine> lines;
  for (int i = 0; i < kMaxLogBatchLines + 3; ++i) lines.push_back(Captured("jobs/1", 1, "x"));
  lines.push_back(Captured("jobs/2", 1, "y"));
  const auto batches = BatchLines(lines, {});
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].lines_size(), kMaxLogBatchLines);
  EXPECT_EQ(batches[1].lines_size(), 3);
  EXPECT_EQ(batches[2].job(), "jobs/2");
}

TEST(BatchLines, BytesSplitBatchesAndDropsRideOnTheFirstOfTheirAttempt) {
  std::vector<CapturedLine> lines;
  for (int i = 0; i < 100; ++i) lines.push_back(Captured("jobs/1", 1, std::string(4000, 'a')));
  const auto batches = BatchLines(lines, {{AttemptLogKey{"jobs/1", 1, 0}, 77},
                                          {AttemptLogKey{"jobs/9", 2, 1}, 5}});
  ASSERT_EQ(batches.size(), 3u);  // 65 lines fit 256 KiB, then 35; then jobs/9's count
  EXPECT_EQ(batches[0].lines_size(), 65);
  EXPECT_EQ(batches[0].dropped_bytes(), 77);
  EXPECT_EQ(batches[1].dropped_bytes(), 0);
  EXPECT_EQ(batches[2].job(), "jobs/9");
  EXPECT_EQ(batches[2].lines_size(), 0);
  EXPECT_EQ(batches[2].dropped_bytes(), 5);
}

TEST(LogCapture, SplitsLinesAndDropsTheOldestPastItsLimit) {
  LogCapture capture(/*max_bytes=*/10);
  const AttemptLogKey key{"jobs/1", 1, 0};
  capture.Add(key, "info", "trainer", "aaaa\nbbbb\n", absl::FromUnixSeconds(5));
  capture.Add(key, "error", "trainer", "cccc", absl::FromUnixSeconds(6));
  const auto batches = capture.TakeBatches();
  ASSERT_EQ(batches.size(), 1u);
  // "aaaa", "bbbb" and "cccc" (no empty line for the last newline) are 12
  // bytes: "aaaa" went.
  EXPECT_EQ(batches[0].dropped_bytes(), 4);
  ASSERT_EQ(batches[0].lines_size(), 2);
  EXPECT_EQ(batches[0].lines(0).text(), "bbbb");
  EXPECT_EQ(batches[0].lines(1).text(), "cccc");
  EXPECT_EQ(batches[0].lines(1).level(), "error");
  EXPECT_EQ(batches[0].lines(1).time().seconds(), 6);
  EXPECT_TRUE(capture.TakeBatches().empty());
}

TEST(AttemptLogScope, CapturesOnlyThisThreadsSpdlogLines) {
  InstallAttemptLogSink();
  LogCapture capture;
  {
    AttemptLogScope scope(&capture, {"jobs/3", 1, 0}, "trainer");
    spdlog::warn("inside {}", 1);
  }
  spdlog::info("outside");
  const auto batches = capture.TakeBatches();
  ASSERT_EQ(batches.size(), 1u);
  ASSERT_EQ(batches[0].lines_size(), 1);
  EXPECT_EQ(batches[0].lines(0).text(), "inside 1");
  EXPECT_EQ(batches[0].lines(0).level(), "warning");
}

// A worker out of reach keeps at most Outbox::kMaxQueuedLogBytes of log
// text: the oldest batches go, and the next batch of their attempt says how
// many bytes; other reports stay.
TEST(OutboxLogs, OldestBatchesGoPastTheLimitAndTheNextSaysHowMuch) {
  Outbox outbox;
  const int64_t per_batch = 200 << 10;
  const int n = static_cast<int>(Outbox::kMaxQueuedLogBytes / per_batch) + 3;
  tally::v1::WorkerMessage exit;
  exit.mutable_exit()->set_job("jobs/1");
  exit.mutable_exit()->set_attempt(1);
  outbox.Push(exit);
  for (int i = 0; i < n; ++i) {
    tally::v1::WorkerMessage m;
    m.mutable_logs()->set_job("jobs/2");
    m.mutable_logs()->set_attempt(1);
    m.mutable_logs()->add_lines()->set_text(std::string(per_batch, 'a' + i % 26));
    outbox.Push(m);
  }
  int64_t bytes = 0, dropped = 0;
  ASSERT_TRUE(outbox.messages().front().has_exit());
  for (const auto& m : outbox.messages()) {
    if (!m.has_logs()) continue;
    bytes += static_cast<int64_t>(m.logs().lines(0).text().size());
    dropped += m.logs().dropped_bytes();
  }
  EXPECT_LE(bytes, Outbox::kMaxQueuedLogBytes);
  EXPECT_EQ(bytes + dropped, n * per_batch);
  EXPECT_GT(dropped, 0);
}

}  // namespace
}  // namespace tally::worker
