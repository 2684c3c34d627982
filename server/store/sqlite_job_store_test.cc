// Group commit in SqliteJobStore: concurrent writes share one transaction,
// each write in a batch fails alone, and a failed COMMIT fails its whole
// batch with nothing stored. The commit hook holds a batch open so that the
// writes behind it queue up deterministically (no sleeps).
#include "server/store/sqlite_job_store.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/store/records.h"

namespace tally::store {
namespace {

using ::tally::store::testing::NewJob;
using ::tally::store::testing::Submitted;

std::string TempDbPath() {
  static int n = 0;
  static const std::string dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tally_sqlite_store_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  return (std::filesystem::path(dir) / ("db" + std::to_string(n++) + ".sqlite")).string();
}



std::unique_ptr<SqliteJobStore> OpenStore(const std::string& path) {
  auto s = SqliteJobStore::Open(path);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

int64_t CountJobs(SqliteJobStore& store) {
  JobQuery q;
  q.limit = 100000;
  auto jobs = store.ListJobs(q);
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? static_cast<int64_t>(jobs->size()) : -1;
}

// Holds the first transaction's COMMIT until released, so that the writes
// started meanwhile all queue behind it and go into the next batch. Later
// commits run through `then` (true: commit, false: fail the COMMIT).
class CommitGate {
 public:
  explicit CommitGate(SqliteJobStore* store) : store_(store) {
    store_->SetCommitHookForTesting([this] {
      if (!first_.exchange(false)) return then_.load();
      entered_.Notify();
      release_.WaitForNotification();
      return true;
    });
  }
  ~CommitGate() { store_->SetCommitHookForTesting(nullptr); }
  void WaitUntilHeld() { entered_.WaitForNotification(); }
  void Release() { release_.Notify(); }
  void SetLaterCommitsSucceed(bool ok) { then_ = ok; }
  // Waits until `n` writes are queued (the held batch included).
  void WaitForQueued(int n) {
    while (store_->NumQueuedWrites() < n) std::this_thread::yield();
  }

 private:
  SqliteJobStore* const store_;
  std::atomic<bool> first_{true};
  std::atomic<bool> then_{true};
  absl::Notification entered_;
  absl::Notification release_;
};

TEST(SqliteGroupCommitTest, ConcurrentCreatesAreAllCommittedWithDistinctIds) {
  const std::string path = TempDbPath();
  auto store = OpenStore(path);
  ASSERT_NE(store, nullptr);
  constexpr int kThreads = 16;
  constexpr int kPerThread = 40;
  std::vector<std::vector<int64_t>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto r = store->CreateJob(NewJob("r-" + std::to_string(t) + "-" + std::to_string(i)),
                                  Submitted());
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_TRUE(r->created);
        ids[t].push_back(r->job.id());
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<int64_t> distinct;
  for (const auto& v : ids) distinct.insert(v.begin(), v.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(kThreads * kPerThread));
  const SqliteJobStore::BatchStats stats = store->batch_stats();
  EXPECT_EQ(stats.writes, kThreads * kPerThread);
  EXPECT_LE(stats.batches, stats.writes);

  // Every acknowledged job is there after reopening, with its first event.
  store.reset();
  auto reopened = OpenStore(path);
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(CountJobs(*reopened), kThreads * kPerThread);
  for (int64_t id : distinct) {
    auto events = reopened->ListEvents(id, 0, 10);
    ASSERT_TRUE(events.ok()) << events.status();
    ASSERT_EQ(events->size(), 1u);
    EXPECT_EQ((*events)[0].sequence(), 1);
  }
}

TEST(SqliteGroupCommitTest, WritesQueuedBehindACommitShareOneTransaction) {
  auto store = OpenStore(TempDbPath());
  ASSERT_NE(store, nullptr);
  CommitGate gate(store.get());
  std::thread first([&] { ASSERT_TRUE(store->CreateJob(NewJob(), Submitted()).ok()); });
  gate.WaitUntilHeld();
  constexpr int kQueued = 10;
  std::vector<std::thread> threads;
  for (int i = 0; i < kQueued; ++i) {
    threads.emplace_back([&] {
      auto r = store->CreateJob(NewJob(), Submitted());
      EXPECT_TRUE(r.ok()) << r.status();
    });
  }
  gate.WaitForQueued(1 + kQueued);
  gate.Release();
  first.join();
  for (auto& t : threads) t.join();
  const SqliteJobStore::BatchStats stats = store->batch_stats();
  EXPECT_EQ(stats.writes, 1 + kQueued);
  EXPECT_EQ(stats.batches, 2);  // the held one, then all the others at once
  EXPECT_EQ(CountJobs(*store), 1 + kQueued);
}

TEST(SqliteGroupCommitTest, AReusedRequestIdInABatchFailsAlone) {
  auto store = OpenStore(TempDbPath());
  ASSERT_NE(store, nullptr);
  auto original = store->CreateJob(NewJob("taken", 2), Submitted());
  ASSERT_TRUE(original.ok()) << original.status();

  CommitGate gate(store.get());
  std::thread first([&] { ASSERT_TRUE(store->CreateJob(NewJob(), Submitted()).ok()); });
  gate.WaitUntilHeld();
  absl::StatusOr<CreateResult> conflict, repeat, fresh1, fresh2, same_key_twice;
  std::vector<std::thread> threads;
  threads.emplace_back([&] { fresh1 = store->CreateJob(NewJob("a"), Submitted()); });
  threads.emplace_back([&] { conflict = store->CreateJob(NewJob("taken", 3), Submitted()); });
  threads.emplace_back([&] { repeat = store->CreateJob(NewJob("taken", 2), Submitted()); });
  threads.emplace_back([&] { fresh2 = store->CreateJob(NewJob("b"), Submitted()); });
  // The same new request id twice in one batch: the second finds the first.
  threads.emplace_back([&] { same_key_twice = store->CreateJob(NewJob("b"), Submitted()); });
  gate.WaitForQueued(1 + 5);
  gate.Release();
  first.join();
  for (auto& t : threads) t.join();
  EXPECT_EQ(store->batch_stats().batches, 3);  // the original, the held one, the batch

  EXPECT_EQ(conflict.status().code(), absl::StatusCode::kAlreadyExists) << conflict.status();
  EXPECT_THAT(std::string(conflict.status().message()), ::testing::HasSubstr("taken"));
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_FALSE(repeat->created);
  EXPECT_EQ(repeat->job.id(), original->job.id());
  ASSERT_TRUE(fresh1.ok()) << fresh1.status();
  EXPECT_TRUE(fresh1->created);
  ASSERT_TRUE(fresh2.ok()) << fresh2.status();
  ASSERT_TRUE(same_key_twice.ok()) << same_key_twice.status();
  EXPECT_NE(fresh2->created, same_key_twice->created);  // exactly one created it
  EXPECT_EQ(fresh2->job.id(), same_key_twice->job.id());
  // The original, the held one, "a" and "b": the conflict stored nothing.
  EXPECT_EQ(CountJobs(*store), 4);
  auto got = store->GetJob(fresh1->job.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->job().request_id(), "a");
}

TEST(SqliteGroupCommitTest, AFailedCommitFailsTheWholeBatchAndStoresNothing) {
  const std::string path = TempDbPath();
  auto store = OpenStore(path);
  ASSERT_NE(store, nullptr);
  auto done = store->CreateJob(NewJob(), Submitted());
  ASSERT_TRUE(done.ok());
  Mutation m;
  m.job = done->job;
  m.job->mutable_job()->set_state_reason("updated in the failing batch");
  int64_t held_id = 0;
  {
    CommitGate gate(store.get());
    gate.SetLaterCommitsSucceed(false);
    std::thread first([&] {
      auto r = store->CreateJob(NewJob(), Submitted());
      ASSERT_TRUE(r.ok()) << r.status();
      held_id = r->job.id();
    });
    gate.WaitUntilHeld();
    constexpr int kQueued = 8;
    std::vector<absl::Status> results(kQueued + 1);
    std::vector<std::thread> threads;
    for (int i = 0; i < kQueued; ++i) {
      threads.emplace_back([&, i] {
        results[i] = store->CreateJob(NewJob("f-" + std::to_string(i)), Submitted()).status();
      });
    }
    threads.emplace_back([&] { results[kQueued] = store->Commit(m); });
    gate.WaitForQueued(1 + kQueued + 1);
    gate.Release();
    first.join();
    for (auto& t : threads) t.join();
    for (const absl::Status& s : results) {
      EXPECT_FALSE(s.ok());
      EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("commit of a batch of 9 writes"))
          << s;
    }
  }
  // Nothing of the failed batch is there, now or after reopening; the store
  // still takes writes.
  EXPECT_EQ(CountJobs(*store), 2);
  auto unchanged = store->GetJob(done->job.id());
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(unchanged->job().state_reason(), "");
  auto after = store->CreateJob(NewJob("f-0"), Submitted());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->created);
  store.reset();
  auto reopened = OpenStore(path);
  ASSERT_NE(reopened, nullptr);
  EXPECT_EQ(CountJobs(*reopened), 3);
  EXPECT_TRUE(reopened->GetJob(held_id).ok());
}

TEST(SqliteGroupCommitTest, AFailedLoneWriteLeavesTheStoreUsable) {
  auto store = OpenStore(TempDbPath());
  ASSERT_NE(store, nullptr);
  Mutation m;
  m.job = NewJob();
  m.job->set_id(12345);
  absl::Status s = store->Commit(m);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  auto r = store->CreateJob(NewJob(), Submitted());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(CountJobs(*store), 1);
}

// /readyz follows write_health(): a failed write marks the store failing,
// the next write that commits (a probe when nothing else writes) clears it.
TEST(SqliteWriteHealthTest, AFailedCommitIsFailingUntilAWriteSucceeds) {
  auto store = OpenStore(TempDbPath());
  ASSERT_NE(store, nullptr);
  ASSERT_NE(store->write_health(), nullptr);
  EXPECT_EQ(store->write_health()->Failing(), std::nullopt);
  ASSERT_TRUE(store->CreateJob(NewJob(), Submitted()).ok());
  store->SetCommitHookForTesting([] { return false; });  // every COMMIT fails
  EXPECT_FALSE(store->CreateJob(NewJob(), Submitted()).ok());
  std::optional<std::string> failing = store->write_health()->Failing();
  ASSERT_TRUE(failing.has_value());
  EXPECT_THAT(*failing, ::testing::HasSubstr("the store refuses writes: "));
  EXPECT_FALSE(store->ProbeWrite().ok());
  EXPECT_TRUE(store->write_health()->Failing().has_value()) << "the probe failed too";
  store->SetCommitHookForTesting(nullptr);
  ASSERT_TRUE(store->ProbeWrite().ok());
  EXPECT_EQ(store->write_health()->Failing(), std::nullopt);
  EXPECT_EQ(CountJobs(*store), 1) << "the probe wrote no job";
  auto version = store->SchemaVersion();
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(*version, SqliteJobStore::kSchemaVersion) << "the probe keeps the version";
}

TEST(WriteHealthTest, OnlyStoreFailuresCount) {
  const struct {
    absl::Status status;
    bool failing_after;
  } steps[] = {
      {absl::OkStatus(), false},
      {absl::AlreadyExistsError("request_id reused"), false},
      {absl::ResourceExhaustedError("database or disk is full"), true},
      {absl::NotFoundError("no such job"), true},  // changes nothing
      {absl::InvalidArgumentError("bad"), true},
      {absl::OkStatus(), false},
      {absl::UnavailableError("connection lost"), true},
      {absl::OkStatus(), false},
      {absl::InternalError("commit failed"), true},
      {absl::DataLossError("corrupt"), true},
  };
  WriteHealth health;
  int i = 0;
  for (const auto& step : steps) {
    health.Record(step.status);
    EXPECT_EQ(health.Failing().has_value(), step.failing_after) << "step " << i << ": "
                                                                 << step.status;
    ++i;
  }
  EXPECT_THAT(*health.Failing(), ::testing::HasSubstr("corrupt"));
}

}  // namespace
}  // namespace tally::store
