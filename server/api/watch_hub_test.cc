#include "server/api/watch_hub.h"

#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/memory_job_store.h"

namespace tally::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An in-memory store that counts event reads.
class CountingStore final : public store::JobStore {
 public:
  absl::StatusOr<store::CreateResult> CreateJob(store::JobRecord job,
                                                tally::v1::JobEvent first) override {
    return inner_.CreateJob(std::move(job), std::move(first));
  }
  absl::Status Commit(const store::Mutation& m) override { return inner_.Commit(m); }
  absl::StatusOr<store::JobRecord> GetJob(int64_t id) override { return inner_.GetJob(id); }
  absl::StatusOr<std::vector<store::JobRecord>> ListJobs(const store::JobQuery& q) override {
    return inner_.ListJobs(q);
  }
  absl::StatusOr<std::vector<store::JobRecord>> ListActiveJobs() override {
    return inner_.ListActiveJobs();
  }
  absl::StatusOr<std::vector<tally::v1::JobEvent>> ListEvents(int64_t id, int64_t after,
                                                              int limit) override {
    ++num_event_reads;
    return inner_.ListEvents(id, after, limit);
  }
  absl::StatusOr<std::vector<store::AttemptRecord>> ListAttempts(int64_t id) override {
    return inner_.ListAttempts(id);
  }
  absl::StatusOr<std::vector<tally::v1::Checkpoint>> ListCheckpoints(int64_t id) override {
    return inner_.ListCheckpoints(id);
  }
  absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>> CountJobsByState()
      override {
    return inner_.CountJobsByState();
  }
  absl::Status PutWorker(const store::WorkerRecord& w) override { return inner_.PutWorker(w); }
  absl::StatusOr<std::vector<store::WorkerRecord>> ListWorkers() override {
    return inner_.ListWorkers();
  }
  absl::StatusOr<std::vector<store::SpendRecord>> ListSpend(int64_t since_hour) override {
    return inner_.ListSpend(since_hour);
  }
  absl::StatusOr<store::ExperimentCreateResult> CreateExperiment(
      store::ExperimentRecord e, tally::v1::ExperimentEvent first) override {
    return inner_.CreateExperiment(std::move(e), std::move(first));
  }
  absl::Status CommitExperiment(const store::ExperimentMutation& m) override {
    return inner_.CommitExperiment(m);
  }
  absl::StatusOr<store::ExperimentRecord> GetExperiment(int64_t id) override {
    return inner_.GetExperiment(id);
  }
  absl::StatusOr<std::vector<store::ExperimentRecord>> ListExperiments(
      int64_t before_id, int limit, const std::optional<std::string>& tenant) override {
    return inner_.ListExperiments(before_id, limit, tenant);
  }
  absl::StatusOr<std::vector<store::ExperimentRecord>> ListActiveExperiments() override {
    return inner_.ListActiveExperiments();
  }
  absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> ListExperimentEvents(
      int64_t id, int64_t after, int limit) override {
    return inner_.ListExperimentEvents(id, after, limit);
  }

  int num_event_reads = 0;

 private:
  store::InMemoryJobStore inner_;
};

// A transport that records what it was given; the test acknowledges sends.
class FakeWatch final : public JobWatch {
 public:
  using JobWatch::JobWatch;

  // Completes the outstanding send; false when there is none.
  bool Ack(bool ok = true) {
    if (!outstanding) return false;
    outstanding = false;
    OnSent(ok);
    return true;
  }
  void AckAll() {
    while (Ack()) {
    }
  }

  std::vector<int64_t> sequences;
  bool outstanding = false;
  std::optional<absl::Status> ended;

 private:
  void StartSend(const tally::v1::JobEvent* event) override {
    ASSERT_FALSE(outstanding) << "two sends at once";
    ASSERT_FALSE(ended.has_value()) << "a send after the end";
    sequences.push_back(event->sequence());
    outstanding = true;
  }
  void End(absl::Status status) override {
    ASSERT_FALSE(outstanding) << "ended with a send outstanding";
    ASSERT_FALSE(ended.has_value()) << "ended twice";
    ended = std::move(status);
  }
};

std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t i = from; i <= to; ++i) v.push_back(i);
  return v;
}

class WatchHubTest : public ::testing::Test {
 protected:
  WatchHubTest() : hub_(&store_) {
    tally::v1::JobEvent first;
    first.set_type("submitted");
    first.set_state(tally::v1::JOB_STATE_QUEUED);
    store::JobRecord rec;
    rec.mutable_job()->set_state(tally::v1::JOB_STATE_QUEUED);
    rec.mutable_job()->set_last_event_sequence(1);
    auto created = store_.CreateJob(rec, first);
    EXPECT_TRUE(created.ok()) << created.status();
    job_ = created->job;
  }

  // Appends `n` events (the last moving the job to `state`) and commits them,
  // without telling the hub.
  store::Mutation CommitEvents(int n, tally::v1::JobState state = tally::v1::JOB_STATE_RUNNING) {
    store::Mutation m;
    for (int i = 0; i < n; ++i) {
      tally::v1::JobEvent e;
      e.set_job(job_.job().name());
      e.set_sequence(job_.job().last_event_sequence() + 1);
      e.set_type("progress");
      e.set_state(i + 1 == n ? state : tally::v1::JOB_STATE_RUNNING);
      job_.mutable_job()->set_last_event_sequence(e.sequence());
      m.events.push_back(e);
    }
    job_.mutable_job()->set_state(state);
    m.job = job_;
    EXPECT_TRUE(store_.Commit(m).ok());
    return m;
  }
  // What the scheduler does: commit, then notify.
  void Produce(int n, tally::v1::JobState state = tally::v1::JOB_STATE_RUNNING) {
    store::Mutation m = CommitEvents(n, state);
    hub_.OnJobCommitted(job_, m);
  }

  std::shared_ptr<FakeWatch> Watch(int64_t after = 0) {
    auto w = std::make_shared<FakeWatch>(&hub_, job_.id(), after);
    w->Start();
    return w;
  }

  CountingStore store_;
  WatchHub hub_;
  store::JobRecord job_;
};

TEST_F(WatchHubTest, CatchesUpThenSendsCommittedEventsWithoutReadingTheStore) {
  Produce(2);
  auto w = Watch(/*after=*/1);
  w->AckAll();
  EXPECT_THAT(w->sequences, ElementsAre(2, 3));
  const int reads_after_catch_up = store_.num_event_reads;
  for (int i = 0; i < 50; ++i) {
    Produce(1);
    w->AckAll();
  }
  EXPECT_EQ(w->sequences, Range(2, 53));
  EXPECT_EQ(store_.num_event_reads, reads_after_catch_up) << "live events came from the store";
  EXPECT_FALSE(w->ended.has_value());
  EXPECT_EQ(hub_.num_watches(), 1);
}

TEST_F(WatchHubTest, OtherJobsCommitsDoNotWakeAWatch) {
  auto w = Watch();
  w->AckAll();
  store::JobRecord other = job_;
  other.set_id(job_.id() + 1);
  store::Mutation m;
  m.job = other;
  tally::v1::JobEvent e;
  e.set_sequence(2);
  m.events.push_back(e);
  hub_.OnJobCommitted(other, m);
  EXPECT_FALSE(w->outstanding);
  EXPECT_THAT(w->sequences, ElementsAre(1));
}

TEST_F(WatchHubTest, EventsCommittedBeforeTheirNotificationAreNotRepeated) {
  // A commit the store holds before the watch starts, notified after it.
  store::Mutation late = CommitEvents(3);
  auto w = Watch();
  hub_.OnJobCommitted(job_, late);
  w->AckAll();
  Produce(1);
  w->AckAll();
  EXPECT_EQ(w->sequences, Range(1, 5));
}

TEST_F(WatchHubTest, TerminalJobEndsOkAfterItsLastEvent) {
  auto w = Watch();
  Produce(3);
  Produce(1, tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_FALSE(w->ended.has_value()) << "ended before the events were sent";
  w->AckAll();
  EXPECT_EQ(w->sequences, Range(1, 5));
  ASSERT_TRUE(w->ended.has_value());
  EXPECT_TRUE(w->ended->ok()) << *w->ended;
  EXPECT_EQ(hub_.num_watches(), 0);

  // Watching the finished job from the middle returns the tail and ends.
  auto tail = Watch(/*after=*/3);
  tail->AckAll();
  EXPECT_THAT(tail->sequences, ElementsAre(4, 5));
  ASSERT_TRUE(tail->ended.has_value());
  EXPECT_TRUE(tail->ended->ok());
}

TEST_F(WatchHubTest, SlowWatcherFallsBehindAndCatchesUpFromTheStoreWithoutGaps) {
  auto w = Watch();
  // The first send never completes while 3,000 events are committed.
  for (int i = 0; i < 3000; ++i) Produce(1);
  const int reads_before = store_.num_event_reads;
  Produce(1, tally::v1::JOB_STATE_FAILED);
  w->AckAll();
  EXPECT_EQ(w->sequences, Range(1, 3002));
  EXPECT_GT(store_.num_event_reads, reads_before) << "did not fall back to the store";
  ASSERT_TRUE(w->ended.has_value());
  EXPECT_TRUE(w->ended->ok());
}

TEST_F(WatchHubTest, EventsDuringCatchUpAreSentOnceInOrder) {
  Produce(600);  // more than a catch-up page
  auto w = Watch();
  for (int i = 0; i < 400; ++i) {
    w->Ack();
    Produce(1);
  }
  w->AckAll();
  EXPECT_EQ(w->sequences, Range(1, 1001));
}

TEST_F(WatchHubTest, ShutdownEndsUnavailableNamingWhereToResume) {
  Produce(2);
  auto w = Watch();
  w->Ack();
  w->Ack();  // 1 and 2 delivered, 3 in flight
  hub_.Shutdown();
  EXPECT_FALSE(w->ended.has_value()) << "ended with a send outstanding";
  w->Ack();
  ASSERT_TRUE(w->ended.has_value());
  EXPECT_EQ(w->ended->code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(w->ended->message(), HasSubstr("after_sequence=3"));

  auto late = Watch();
  ASSERT_TRUE(late->ended.has_value());
  EXPECT_EQ(late->ended->code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late->ended->message(), HasSubstr("after_sequence=0"));
}

TEST_F(WatchHubTest, UnknownJobIsNotFound) {
  auto w = std::make_shared<FakeWatch>(&hub_, job_.id() + 100, 0);
  w->Start();
  ASSERT_TRUE(w->ended.has_value());
  EXPECT_EQ(w->ended->code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(hub_.num_watches(), 0);
}

TEST_F(WatchHubTest, CancelAndBrokenStreamsEndAndUnregister) {
  auto a = Watch();
  a->Cancel();  // a send is outstanding: the end waits for it
  EXPECT_FALSE(a->ended.has_value());
  a->Ack(false);
  ASSERT_TRUE(a->ended.has_value());
  EXPECT_EQ(a->ended->code(), absl::StatusCode::kCancelled);

  auto b = Watch();
  b->AckAll();
  b->Cancel();  // idle: ends at once
  ASSERT_TRUE(b->ended.has_value());
  EXPECT_EQ(b->ended->code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(hub_.num_watches(), 0);
  Produce(1);  // nobody to wake
}

}  // namespace
}  // namespace tally::api
