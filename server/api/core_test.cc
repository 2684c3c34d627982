// Core::Submit with group commit: decide under the core's lock, commit
// without it (the store batches concurrent submits), act under it again.
// Every acknowledged job is in the store and in the scheduler; a refused or
// failed commit changes neither memory nor metrics; a request id submitted
// concurrently makes one job.
#include "server/api/core.h"

#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ledger/tenant_quota.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler_test_util.h"
#include "tests/support/store/fault_injection_job_store.h"
#include "server/store/memory_job_store.h"
#include "server/store/sqlite_job_store.h"

namespace tally::api {
namespace {

std::string TempDbPath() {
  static int n = 0;
  static const std::string dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tally_core_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  return (std::filesystem::path(dir) / ("db" + std::to_string(n++) + ".sqlite")).string();
}

int64_t JobId(const tally::v1::Job& job) {
  return std::stoll(job.name().substr(job.name().find('/') + 1));
}

int64_t StoredJobs(store::JobStore& store) {
  store::JobQuery q;
  q.limit = 100000;
  auto jobs = store.ListJobs(q);
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  return jobs.ok() ? static_cast<int64_t>(jobs->size()) : -1;
}

// Runs `n` submits from `n` threads at once; their results in order.
std::vector<absl::StatusOr<tally::v1::Job>> SubmitConcurrently(
    Core& core, int n, const std::function<std::string(int)>& request_id,
    const sched::Actor& by = {}) {
  std::vector<absl::StatusOr<tally::v1::Job>> results(n, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back(
        [&, i] { results[i] = core.Submit(sched::TinySpec(), request_id(i), by); });
  }
  for (auto& t : threads) t.join();
  return results;
}

class CoreSubmitTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto s = store::SqliteJobStore::Open(TempDbPath());
    ASSERT_TRUE(s.ok()) << s.status();
    sqlite_ = std::move(*s);
  }
  void StartCore(store::JobStore* store) {
    options_.group_commit = GetParam();
    options_.prices.usd_per_gpu_hour["cpu"] = 3.6;
    core_ = std::make_unique<Core>(store, &clock_, &registry_, options_);
    ASSERT_TRUE(core_->Init().ok());
  }
  double Metric(const std::string& key) {
    auto values = sched::MetricValues(registry_);
    auto it = values.find(key);
    return it == values.end() ? 0 : it->second;
  }

  FakeClock clock_;
  metrics::Registry registry_;
  sched::SchedulerOptions options_;
  std::unique_ptr<store::SqliteJobStore> sqlite_;
  std::unique_ptr<Core> core_;
};

INSTANTIATE_TEST_SUITE_P(GroupCommit, CoreSubmitTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Batched" : "Locked"; });

TEST_P(CoreSubmitTest, EveryAcknowledgedSubmitIsInTheStoreAndTheScheduler) {
  StartCore(sqlite_.get());
  constexpr int kClients = 32;
  auto results =
      SubmitConcurrently(*core_, kClients, [](int i) { return "req-" + std::to_string(i); });
  std::set<int64_t> ids;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state(), tally::v1::JOB_STATE_QUEUED);
    ids.insert(JobId(*r));
  }
  EXPECT_EQ(ids.size(), static_cast<size_t>(kClients));
  for (int64_t id : ids) {
    auto stored = sqlite_->GetJob(id);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->job().state(), tally::v1::JOB_STATE_QUEUED);
    EXPECT_TRUE(core_->Run([&](sched::Scheduler& s) { return s.ActiveJobView(id).has_value(); }))
        << id;
  }
  EXPECT_EQ(core_->Run([](sched::Scheduler& s) { return s.QueueDepth(); }), kClients);
  EXPECT_EQ(Metric("tally_job_transitions_total,state=queued"), kClients);
  EXPECT_EQ(StoredJobs(*sqlite_), kClients);
}

TEST_P(CoreSubmitTest, ARequestIdSubmittedConcurrentlyMakesOneJob) {
  StartCore(sqlite_.get());
  auto results = SubmitConcurrently(*core_, 16, [](int) { return "same"; });
  std::set<std::string> names;
  for (const auto& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    names.insert(r->name());
  }
  EXPECT_EQ(names.size(), 1u);
  EXPECT_EQ(StoredJobs(*sqlite_), 1);
  EXPECT_EQ(core_->Run([](sched::Scheduler& s) { return s.QueueDepth(); }), 1);
  EXPECT_EQ(Metric("tally_job_transitions_total,state=queued"), 1);
}

TEST_P(CoreSubmitTest, ATenantAtItsQuotaIsRefusedUnderConcurrency) {
  options_.quotas["research"].max_dollars_per_day = 10;
  options_.quotas["vision"].max_dollars_per_day = 10;
  store::Mutation spent;
  spent.spend.push_back({"research", ledger::TenantSpend::HourOf(clock_.Now()), 12.5});
  ASSERT_TRUE(sqlite_->Commit(spent).ok());
  StartCore(sqlite_.get());
  auto refused = SubmitConcurrently(
      *core_, 16, [](int i) { return "r-" + std::to_string(i); }, {"alice", "research"});
  for (const auto& r : refused) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  }
  auto admitted = SubmitConcurrently(
      *core_, 16, [](int i) { return "v-" + std::to_string(i); }, {"bob", "vision"});
  for (const auto& r : admitted) EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(StoredJobs(*sqlite_), 16);
  EXPECT_EQ(core_->Run([](sched::Scheduler& s) { return s.QueueDepth(); }), 16);
}

TEST_P(CoreSubmitTest, ARefusedWriteChangesNeitherMemoryNorMetrics) {
  store::FaultInjectionJobStore faulty(sqlite_.get());
  StartCore(&faulty);
  const auto before = sched::MetricValues(registry_);
  faulty.FailWrites(true);
  auto results = SubmitConcurrently(*core_, 8, [](int i) { return "f-" + std::to_string(i); });
  for (const auto& r : results) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  }
  EXPECT_EQ(core_->Run([](sched::Scheduler& s) { return s.QueueDepth(); }), 0);
  EXPECT_EQ(sched::MetricValues(registry_), before);
  EXPECT_EQ(StoredJobs(*sqlite_), 0);
  faulty.FailWrites(false);
  auto again = core_->Submit(sched::TinySpec(), "f-0", {});
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(core_->Run([](sched::Scheduler& s) { return s.QueueDepth(); }), 1);
}

TEST_P(CoreSubmitTest, AFailedBatchCommitChangesNeitherMemoryNorMetrics) {
  StartCore(sqlite_.get());
  const auto before = sched::MetricValues(registry_);
  sqlite_->SetCommitHookForTesting([] { return false; });
  auto results = SubmitConcurrently(*core_, 8, [](int i) { return "c-" + std::to_string(i); });
  sqlite_->SetCommitHookForTesting(nullptr);
  for (const auto& r : results) {
    EXPECT_FALSE(r.ok());
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("commit of a batch"));
  }
  EXPECT_EQ(core_->Run([](sched::Scheduler& s) { return s.QueueDepth(); }), 0);
  EXPECT_EQ(sched::MetricValues(registry_), before);
  EXPECT_EQ(StoredJobs(*sqlite_), 0);
}

// The core's lock is free while a submit's commit is in flight: submits
// behind a held COMMIT get through their decision and queue in the store,
// then commit together.
TEST(CoreGroupCommitTest, SubmitsQueueBehindACommitInFlightAndCommitTogether) {
  auto opened = store::SqliteJobStore::Open(TempDbPath());
  ASSERT_TRUE(opened.ok()) << opened.status();
  store::SqliteJobStore& store = **opened;
  FakeClock clock;
  metrics::Registry registry;
  sched::SchedulerOptions options;
  options.group_commit = true;
  Core core(&store, &clock, &registry, options);
  ASSERT_TRUE(core.Init().ok());

  absl::Notification held, release;
  std::atomic<bool> first{true};
  store.SetCommitHookForTesting([&] {
    if (first.exchange(false)) {
      held.Notify();
      release.WaitForNotification();
    }
    return true;
  });
  const store::SqliteJobStore::BatchStats start = store.batch_stats();
  absl::StatusOr<tally::v1::Job> lead;
  std::thread leader([&] { lead = core.Submit(sched::TinySpec(), "lead", {}); });
  held.WaitForNotification();
  // The first submit's commit is in flight; the core answers meanwhile.
  EXPECT_EQ(core.Run([](sched::Scheduler& s) { return s.QueueDepth(); }), 0);
  constexpr int kBehind = 8;
  std::vector<absl::StatusOr<tally::v1::Job>> behind(kBehind, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kBehind; ++i) {
    threads.emplace_back(
        [&, i] { behind[i] = core.Submit(sched::TinySpec(), "b-" + std::to_string(i), {}); });
  }
  while (store.NumQueuedWrites() < 1 + kBehind) std::this_thread::yield();
  release.Notify();
  leader.join();
  for (auto& t : threads) t.join();
  store.SetCommitHookForTesting(nullptr);
  ASSERT_TRUE(lead.ok()) << lead.status();
  for (const auto& r : behind) ASSERT_TRUE(r.ok()) << r.status();
  const store::SqliteJobStore::BatchStats end = store.batch_stats();
  EXPECT_EQ(end.writes - start.writes, 1 + kBehind);
  EXPECT_EQ(end.batches - start.batches, 2);
  EXPECT_EQ(core.Run([](sched::Scheduler& s) { return s.QueueDepth(); }), 1 + kBehind);
}

// Between a submit's commit and its hand-over to the scheduler, a change of
// the job is told to retry, not that the job has ended.
TEST(CoreGroupCommitTest, CancelOfAJobCommittedButNotYetQueuedIsRetryable) {
  store::InMemoryJobStore store;
  FakeClock clock;
  metrics::Registry registry;
  sched::RecordingChannel channel;
  sched::Scheduler sched(&store, &channel, &clock, &registry, {});
  auto prepared = sched.PrepareSubmit(sched::TinySpec(), "r", {});
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  auto created = store.CreateJob(prepared->rec, prepared->first);
  ASSERT_TRUE(created.ok()) << created.status();
  const int64_t id = created->job.id();
  auto early = sched.Cancel(id, "too soon");
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable) << early.status();
  EXPECT_THAT(std::string(early.status().message()), ::testing::HasSubstr("retry"));
  EXPECT_EQ(sched.StopJob(id, tally::v1::JOB_STATE_CANCELLED, "r", "x").status().code(),
            absl::StatusCode::kUnavailable);
  auto stored = store.GetJob(id);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->job().state(), tally::v1::JOB_STATE_QUEUED);

  const tally::v1::Job job = sched.ActOnSubmit(*prepared, *created);
  EXPECT_EQ(job.name(), created->job.job().name());
  auto cancelled = sched.Cancel(id, "now");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), tally::v1::JOB_STATE_CANCELLED);
  // And once it has ended, the answer is the usual one.
  EXPECT_EQ(sched.Cancel(id, "again").status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace tally::api
