// Job logs in each store: sequences, filters, tail, paging,
// the drop of the oldest past the limit with its marker, and survival of a
// reopen (SQLite).
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "server/store/memory_job_store.h"
#include "server/store/postgres_job_store.h"
#include "server/store/sqlite_job_store.h"
#include "tests/support/store/postgres_test_environment.h"
#include "tests/support/store/records.h"

namespace tally::store {
namespace {

using ::tally::store::testing::NewJob;
using ::tally::store::testing::Submitted;

std::string TempPath() {
  static int n = 0;
  return (std::filesystem::temp_directory_path() /
          ("tally_job_logs_test_" + std::to_string(getpid()) + "_" + std::to_string(n++) +
           ".sqlite"))
      .string();
}

tally::v1::LogLine Line(int32_t attempt, int32_t rank, int64_t second, const std::string& text) {
  tally::v1::LogLine l;
  l.set_attempt(attempt);
  l.set_rank(rank);
  l.mutable_time()->set_seconds(second);
  l.set_level("info");
  l.set_source("trainer");
  l.set_text(text);
  return l;
}

class JobLogsStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = std::make_unique<InMemoryJobStore>();
    } else if (GetParam() == "postgres") {
      // The server job_store_test.cc registers (scripts/setup.sh installs it).
      auto dsn = testing::PostgresTestEnvironment::NewDatabase();
      ASSERT_TRUE(dsn.ok()) << dsn.status();
      auto s = PostgresJobStore::Open(*dsn);
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = std::move(*s);
    } else {
      path_ = TempPath();
      auto s = SqliteJobStore::Open(path_);
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = std::move(*s);
    }
    auto job = store_->CreateJob(NewJob(), Submitted());
    ASSERT_TRUE(job.ok()) << job.status();
    id_ = job->job.id();
  }
  void TearDown() override {
    store_.reset();
    if (!path_.empty()) std::filesystem::remove(path_);
  }
  std::vector<std::string> Texts(const LogQuery& q) {
    auto lines = store_->ListJobLogs(id_, q);
    EXPECT_TRUE(lines.ok()) << lines.status();
    std::vector<std::string> out;
    if (lines.ok()) {
      for (const auto& l : *lines) out.push_back(l.text());
    }
    return out;
  }
  std::string path_;
  std::unique_ptr<JobStore> store_;
  int64_t id_ = 0;
};

TEST_P(JobLogsStoreTest, NumbersFiltersTailsAndPages) {
  auto r = store_->AppendJobLogs(
      id_, {Line(1, 0, 100, "a"), Line(1, 1, 101, "b"), Line(2, 0, 200, "c")}, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->first_sequence, 1);
  EXPECT_EQ(r->last_sequence, 3);
  r = store_->AppendJobLogs(id_, {Line(2, 1, 201, "d")}, 1 << 20);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first_sequence, 4);

  EXPECT_EQ(Texts({}), (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(Texts({.attempt = 2}), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(Texts({.rank = 1}), (std::vector<std::string>{"b", "d"}));
  EXPECT_EQ(Texts({.since_micros = 200 * 1000000LL}), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(Texts({.after_sequence = 2}), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(Texts({.tail = 2}), (std::vector<std::string>{"c", "d"}));
  EXPECT_EQ(Texts({.limit = 2}), (std::vector<std::string>{"a", "b"}));
  auto lines = store_->ListJobLogs(id_, {.after_sequence = 3});
  ASSERT_TRUE(lines.ok());
  ASSERT_EQ(lines->size(), 1u);
  EXPECT_EQ((*lines)[0].sequence(), 4);
  EXPECT_EQ((*lines)[0].attempt(), 2);
  EXPECT_EQ((*lines)[0].rank(), 1);
}

TEST_P(JobLogsStoreTest, KeepsTheNewestWithAMarkerSayingWhatWasDropped) {
  // Each line costs 100 (68 bytes of text + 32); keep 1000.
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<tally::v1::LogLine> lines;
    for (int i = 0; i < 5; ++i) {
      lines.push_back(Line(1, 0, 1000 + batch * 5 + i,
                           std::string(67, 'a') + static_cast<char>('a' + batch * 5 + i)));
    }
    ASSERT_TRUE(store_->AppendJobLogs(id_, lines, 1000).ok());
  }
  auto all = store_->ListJobLogs(id_, {});
  ASSERT_TRUE(all.ok());
  ASSERT_FALSE(all->empty());
  const tally::v1::LogLine& marker = (*all)[0];
  EXPECT_EQ(marker.source(), "tally");
  EXPECT_EQ(marker.dropped_bytes(), 600);  // 1500 kept > 1000: down to 900
  EXPECT_NE(marker.text().find("600 bytes of older output dropped"), std::string::npos);
  EXPECT_EQ(all->size(), 10u);  // the marker and the newest 9
  EXPECT_EQ(all->back().sequence(), 15);
  // The marker is job-wide: shown whatever attempt is asked for.
  auto attempt_one = store_->ListJobLogs(id_, {.attempt = 1, .rank = 0});
  ASSERT_TRUE(attempt_one.ok());
  EXPECT_EQ((*attempt_one)[0].source(), "tally");
}

TEST_P(JobLogsStoreTest, MissingJobIsNotFound) {
  EXPECT_EQ(store_->AppendJobLogs(id_ + 100, {Line(1, 0, 1, "x")}, 1000).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListJobLogs(id_ + 100, {}).status().code(), absl::StatusCode::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(Stores, JobLogsStoreTest, ::testing::Values("memory", "sqlite", "postgres"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(SqliteJobLogsTest, SurviveReopen) {
  const std::string path = TempPath();
  int64_t id = 0;
  {
    auto s = SqliteJobStore::Open(path);
    ASSERT_TRUE(s.ok());
    auto job = (*s)->CreateJob(NewJob(), Submitted());
    ASSERT_TRUE(job.ok());
    id = job->job.id();
    ASSERT_TRUE((*s)->AppendJobLogs(id, {Line(1, 0, 5, "kept")}, 1 << 20).ok());
  }
  auto s = SqliteJobStore::Open(path);
  ASSERT_TRUE(s.ok());
  auto lines = (*s)->ListJobLogs(id, {});
  ASSERT_TRUE(lines.ok());
  ASSERT_EQ(lines->size(), 1u);
  EXPECT_EQ((*lines)[0].text(), "kept");
  auto r = (*s)->AppendJobLogs(id, {Line(1, 0, 6, "next")}, 1 << 20);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->first_sequence, 2);  // sequences go on after a reopen
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tally::store
