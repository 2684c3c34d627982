#include "server/logs/log_retention.h"

#include <map>

#include "common/log_lines.h"
#include "common/text.h"
#include "gtest/gtest.h"
#include "server/logs/log_notifier.h"

namespace tally::logs {
namespace {

TEST(PlanLogDrop, NothingWithinTheLimit) {
  EXPECT_EQ(PlanLogDrop(100, 100, {{1, 50}, {2, 50}}).lines, 0);
}

TEST(PlanLogDrop, DropsTheOldestDownToNinetyPercent) {
  // 130 kept, limit 100: down to at most 90, so 40 must go: lines 1-2 (20
  // each), not line 3.
  const DropPlan p = PlanLogDrop(130, 100, {{1, 20}, {2, 20}, {3, 20}, {4, 70}});
  EXPECT_EQ(p.through_sequence, 2);
  EXPECT_EQ(p.bytes, 40);
  EXPECT_EQ(p.lines, 2);
}

TEST(PlanLogDrop, NeverMoreThanThereIs) {
  const DropPlan p = PlanLogDrop(1000, 10, {{5, 30}});
  EXPECT_EQ(p.through_sequence, 5);
  EXPECT_EQ(p.lines, 1);
}

tally::v1::LogBatch Batch(int lines, int64_t dropped = 0) {
  tally::v1::LogBatch b;
  b.set_job("jobs/1");
  b.set_attempt(2);
  b.set_rank(1);
  b.set_dropped_bytes(dropped);
  for (int i = 0; i < lines; ++i) {
    auto* l = b.add_lines();
    l->set_text(std::string(68, 'a' + i % 26));  // costs 100
    l->set_level("info");
    l->set_source("trainer");
    l->mutable_time()->set_seconds(1000 + i);
    l->set_attempt(9);  // the batch's attempt wins
  }
  return b;
}

TEST(LinesOfBatch, TakeTheBatchsAttemptAndRankAndMarkWorkerDrops) {
  const auto lines = LinesOfBatch(Batch(2, 4096));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].source(), "tally");
  EXPECT_EQ(lines[0].dropped_bytes(), 4096);
  EXPECT_NE(lines[0].text().find("4096 bytes of output dropped by the worker"),
            std::string::npos);
  for (const auto& l : lines) {
    EXPECT_EQ(l.attempt(), 2);
    EXPECT_EQ(l.rank(), 1);
  }
  EXPECT_EQ(LinesOfBatch(Batch(2)).size(), 2u);
}

// A LogTable in a map, as the in-memory store keeps one.
class MapTable final : public LogTable {
 public:
  absl::StatusOr<LogState> ReadState(int64_t) override { return state; }
  absl::Status WriteState(int64_t, const LogState& s) override {
    state = s;
    return absl::OkStatus();
  }
  absl::Status Insert(int64_t, const std::vector<tally::v1::LogLine>& lines) override {
    for (const auto& l : lines) rows[l.sequence()] = l;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<StoredLine>> Lines(int64_t) override {
    std::vector<StoredLine> out;
    for (const auto& [seq, l] : rows) {
      if (l.attempt() > 0) out.push_back({seq, LogLineCost(l.text())});
    }
    return out;
  }
  absl::Status DeleteThrough(int64_t, int64_t seq) override {
    rows.erase(rows.begin(), rows.upper_bound(seq));
    return absl::OkStatus();
  }
  LogState state;
  std::map<int64_t, tally::v1::LogLine> rows;
};

TEST(AppendLogs, NumbersLinesAndKeepsTheNewestWithOneMarker) {
  MapTable t;
  absl::StatusOr<AppendResult> r = AppendLogs(t, 1, LinesOfBatch(Batch(5)), 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first_sequence, 1);
  EXPECT_EQ(r->last_sequence, 5);
  EXPECT_EQ(r->dropped_bytes, 0);
  EXPECT_EQ(t.state.kept_bytes, 500);
  // 5 more: 1000 kept, at the limit; 3 more: 1300, down to 900.
  ASSERT_TRUE(AppendLogs(t, 1, LinesOfBatch(Batch(5)), 1000).ok());
  r = AppendLogs(t, 1, LinesOfBatch(Batch(3)), 1000);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first_sequence, 11);
  EXPECT_EQ(r->dropped_bytes, 400);
  EXPECT_EQ(t.state.kept_bytes, 900);
  EXPECT_EQ(t.state.dropped_bytes, 400);
  // The marker stands where the newest dropped line was, first of all.
  ASSERT_FALSE(t.rows.empty());
  const tally::v1::LogLine& marker = t.rows.begin()->second;
  EXPECT_EQ(marker.sequence(), 4);
  EXPECT_EQ(marker.source(), "tally");
  EXPECT_EQ(marker.dropped_bytes(), 400);
  EXPECT_NE(marker.text().find("400 bytes of older output dropped"), std::string::npos);
  EXPECT_EQ(t.rows.size(), 10u);  // the marker and lines 5..13
  // A second drop replaces the marker with one holding the total.
  ASSERT_TRUE(AppendLogs(t, 1, LinesOfBatch(Batch(3)), 1000).ok());
  EXPECT_EQ(t.rows.begin()->second.dropped_bytes(), 700);  // 1200 kept: 300 more go
  int markers = 0;
  for (const auto& [seq, l] : t.rows) markers += l.source() == "tally";
  EXPECT_EQ(markers, 1);
}

TEST(CapLogText, DropsNewlinesRepairsUtf8AndCutsLongLines) {
  EXPECT_EQ(CapLogText("step 1\n"), "step 1");
  EXPECT_EQ(CapLogText("a\xff" "b"), "a?b");
  EXPECT_EQ(CapLogText("\x1b[2J"), "\x1b[2J");  // escaped when printed, not here
  const std::string cut = CapLogText(std::string(10000, 'x'));
  EXPECT_LE(cut.size(), kMaxLogLineBytes);
  EXPECT_NE(cut.find("[cut: 10000 bytes]"), std::string::npos);
  // Cut at a character boundary: still valid UTF-8.
  std::string wide;
  for (int i = 0; i < 3000; ++i) wide += "\xc3\xa9";
  EXPECT_TRUE(IsValidUtf8(CapLogText(wide)));
}

TEST(LogNotifier, WaitReturnsOnNotifyAndFalseOnceClosed) {
  LogNotifier n;
  const int64_t seen = n.version();
  n.Notify();
  EXPECT_TRUE(n.Wait(seen, absl::Seconds(10)));  // moved already: no wait
  EXPECT_NE(n.version(), seen);
  n.Close();
  EXPECT_FALSE(n.Wait(n.version(), absl::Seconds(10)));
}

}  // namespace
}  // namespace tally::logs
