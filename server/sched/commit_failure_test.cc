// Decide, commit, act: every state change of the scheduler, run once with a
// store that refuses the write. A failed commit must leave the store, the
// scheduler's memory, the messages to workers and the metrics exactly as they
// were; the same call then succeeds once the store takes writes again.
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_replace.h"
#include "server/metrics/text_serializer.h"
#include "server/sched/scheduler.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/fault_injection_job_store.h"
#include "server/store/memory_job_store.h"

namespace tally::sched {
namespace {

using tally::v1::JobState;

class Watcher : public CommitObserver {
 public:
  void OnJobCommitted(const store::JobRecord& job, const store::Mutation& m) override {
    commits.push_back(job.job().name() + " +" + std::to_string(m.events.size()));
  }
  std::vector<std::string> commits;
};

class CommitFailureTest : public ::testing::Test {
 protected:
  CommitFailureTest() : store_(&base_) {
    options_.prices.usd_per_gpu_hour["cpu"] = 3.6;
    sched_ = std::make_unique<Scheduler>(&store_, &channel_, &clock_, &registry_, options_);
    sched_->AddObserver(&watcher_);
  }

  tally::v1::JobSpec Spec(int gpus = 1) {
    tally::v1::JobSpec s = TinySpec(gpus);
    s.mutable_early_stopping()->set_patience(1);
    s.mutable_budget()->set_max_dollars(1.0);
    s.set_max_attempts(3);
    return s;
  }
  void Hello(const std::string& w, const std::vector<int64_t>& running = {}) {
    tally::v1::Hello h;
    h.set_worker_id(w);
    h.set_gpu_type("cpu");
    h.set_slots(1);
    for (int64_t id : running) {
      auto* r = h.add_running();
      r->set_job("jobs/" + std::to_string(id));
      r->set_attempt(sched_->ActiveJobView(id)->attempt());
    }
    ASSERT_TRUE(sched_->OnHello(h).ok());
  }
  // A job running on w0.
  int64_t Running() {
    auto job = sched_->Submit(Spec(), "");
    EXPECT_TRUE(job.ok()) << job.status();
    Hello("w0");
    EXPECT_TRUE(sched_->Tick().ok());
    const int64_t id = std::stoll(job->name().substr(5));
    EXPECT_EQ(sched_->ActiveJobView(id)->state(), tally::v1::JOB_STATE_RUNNING);
    return id;
  }
  absl::Status Send(int64_t id, std::function<void(tally::v1::WorkerMessage&, const std::string&, int)> fill) {
    tally::v1::WorkerMessage m;
    fill(m, "jobs/" + std::to_string(id), sched_->ActiveJobView(id)->attempt());
    return sched_->OnMessage("w0", m);
  }

  // Everything a failed commit must leave alone.
  struct Snapshot {
    std::string stored;
    std::string view;
    std::vector<std::string> sent;
    std::vector<std::string> commits;
    std::string metrics;
    int64_t queue_depth;
    std::string workers;
    bool operator==(const Snapshot& o) const {
      return stored == o.stored && view == o.view && sent == o.sent && commits == o.commits &&
             metrics == o.metrics && queue_depth == o.queue_depth && workers == o.workers;
    }
  };
  Snapshot Take(int64_t id) {
    Snapshot s;
    auto rec = base_.GetJob(id);
    s.stored = rec.ok() ? rec->job().ShortDebugString() : "";
    auto events = base_.ListEvents(id, 0, 1000);
    auto attempts = base_.ListAttempts(id);
    auto cks = base_.ListCheckpoints(id);
    s.stored += " events=" + std::to_string(events->size()) +
                " attempts=" + std::to_string(attempts->size()) +
                " checkpoints=" + std::to_string(cks->size());
    for (const auto& a : *attempts) s.stored += " " + a.ShortDebugString();
    auto view = sched_->ActiveJobView(id);
    s.view = view ? view->ShortDebugString() : "ended";
    s.sent = channel_.sent;
    s.commits = watcher_.commits;
    // Every series but the two that show a running job's cost accrued to
    // now: those follow the clock, not commits.
    std::istringstream text(metrics::SerializeText(registry_.Collect()));
    for (std::string line; std::getline(text, line);) {
      if (line.rfind("tally_job_cost_dollars{", 0) == 0 ||
          line.rfind("tally_job_budget_used_ratio{", 0) == 0) {
        continue;
      }
      s.metrics += line + "\n";
    }
    s.queue_depth = sched_->QueueDepth();
    for (const auto& w : sched_->Workers()) {
      s.workers += w.record.worker_id() + ":" + std::to_string(w.used_slots) +
                   (w.connected ? "+" : "-") + " ";
    }
    return s;
  }

  // Runs `change` with writes failing (it must fail and change nothing),
  // then with writes working (it must succeed and change the job).
  void ExpectAtomic(int64_t id, const std::function<absl::Status()>& change) {
    const Snapshot before = Take(id);
    store_.FailWrites(true);
    const int refused = store_.failed_writes();
    absl::Status failed = change();
    store_.FailWrites(false);
    EXPECT_FALSE(failed.ok()) << "the change did not reach the store";
    EXPECT_GT(store_.failed_writes(), refused);
    const Snapshot after = Take(id);
    EXPECT_EQ(after.stored, before.stored);
    EXPECT_EQ(after.view, before.view);
    EXPECT_EQ(after.sent, before.sent) << "a message was sent for an uncommitted change";
    EXPECT_EQ(after.commits, before.commits) << "an observer saw an uncommitted change";
    EXPECT_EQ(after.metrics, before.metrics) << "metrics moved for an uncommitted change";
    EXPECT_EQ(after.queue_depth, before.queue_depth);
    EXPECT_EQ(after.workers, before.workers);
    ASSERT_TRUE(change().ok()) << "the same change must go through once the store works";
    EXPECT_FALSE(Take(id) == before);
  }

  FakeClock clock_;
  store::InMemoryJobStore base_;
  store::FaultInjectionJobStore store_;
  RecordingChannel channel_;
  Watcher watcher_;
  metrics::Registry registry_;
  SchedulerOptions options_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(CommitFailureTest, Submit) {
  store_.FailWrites(true);
  auto job = sched_->Submit(Spec(), "r1");
  store_.FailWrites(false);
  EXPECT_FALSE(job.ok());
  EXPECT_EQ(sched_->QueueDepth(), 0);
  EXPECT_TRUE(watcher_.commits.empty());
  EXPECT_TRUE(sched_->Submit(Spec(), "r1").ok());
  EXPECT_EQ(sched_->QueueDepth(), 1);
}

TEST_F(CommitFailureTest, StartAttempt) {
  auto job = sched_->Submit(Spec(), "");
  const int64_t id = std::stoll(job->name().substr(5));
  Hello("w0");
  ExpectAtomic(id, [&] { return sched_->Tick(); });
  EXPECT_EQ(sched_->ActiveJobView(id)->state(), tally::v1::JOB_STATE_RUNNING);
}

TEST_F(CommitFailureTest, ProgressEvent) {
  const int64_t id = Running();
  auto progress = [&] {
    return Send(id, [](auto& m, const std::string& job, int attempt) {
      m.mutable_progress()->set_job(job);
      m.mutable_progress()->set_attempt(attempt);
      m.mutable_progress()->set_step(3);
      m.mutable_progress()->set_trained(true);
      m.mutable_progress()->set_useful_tokens_per_second(100);
    });
  };
  // The same report again 5 s later: its measurements are already shown, so
  // only the progress event (and the dollars it commits) are new.
  ASSERT_TRUE(progress().ok());
  clock_.Advance(absl::Seconds(5));
  ExpectAtomic(id, progress);
}

TEST_F(CommitFailureTest, EvalThatDecidesAnEarlyStop) {
  const int64_t id = Running();
  auto eval = [&](int64_t step, double loss) {
    return Send(id, [&](auto& m, const std::string& job, int attempt) {
      m.mutable_eval()->set_job(job);
      m.mutable_eval()->set_attempt(attempt);
      m.mutable_eval()->set_step(step);
      m.mutable_eval()->set_val_loss(loss);
    });
  };
  ASSERT_TRUE(eval(0, 5.0).ok());
  ASSERT_TRUE(eval(10, 4.0).ok());
  channel_.sent.clear();
  // Patience 1: no improvement stops it. Nothing may be sent or counted
  // unless the decision commits.
  ExpectAtomic(id, [&] { return eval(20, 4.5); });
  EXPECT_TRUE(sched_->ActiveJobView(id)->has_pending_stop());
  ASSERT_EQ(channel_.sent.size(), 1u);
  EXPECT_THAT(channel_.sent[0], ::testing::HasSubstr("checkpoint: true"));
}

TEST_F(CommitFailureTest, CheckpointRecord) {
  const int64_t id = Running();
  clock_.Advance(absl::Seconds(3));
  ExpectAtomic(id, [&] {
    return Send(id, [](auto& m, const std::string& job, int attempt) {
      m.mutable_checkpoint()->set_job(job);
      m.mutable_checkpoint()->set_attempt(attempt);
      m.mutable_checkpoint()->set_step(10);
      m.mutable_checkpoint()->set_path("/ckpt/" + absl::StrReplaceAll(job, {{"s/", "-"}}) + "/10");
    });
  });
}

TEST_F(CommitFailureTest, CheckpointPricingDoesNotSwallowAStoreError) {
  const int64_t id = Running();
  store_.FailReads(true);
  absl::Status s = Send(id, [](auto& m, const std::string& job, int attempt) {
    m.mutable_checkpoint()->set_job(job);
    m.mutable_checkpoint()->set_attempt(attempt);
    m.mutable_checkpoint()->set_step(10);
    m.mutable_checkpoint()->set_path("/ckpt/" + absl::StrReplaceAll(job, {{"s/", "-"}}) + "/10");
  });
  store_.FailReads(false);
  EXPECT_FALSE(s.ok()) << "priced as if it were the first checkpoint";
  EXPECT_TRUE(base_.ListCheckpoints(id)->empty());
}

TEST_F(CommitFailureTest, SuccessfulExit) {
  const int64_t id = Running();
  ExpectAtomic(id, [&] {
    return Send(id, [](auto& m, const std::string& job, int attempt) {
      m.mutable_exit()->set_job(job);
      m.mutable_exit()->set_attempt(attempt);
      m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_SUCCEEDED);
    });
  });
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CommitFailureTest, FailedExitRequeues) {
  const int64_t id = Running();
  clock_.Advance(absl::Seconds(7));
  ExpectAtomic(id, [&] {
    return Send(id, [](auto& m, const std::string& job, int attempt) {
      m.mutable_exit()->set_job(job);
      m.mutable_exit()->set_attempt(attempt);
      m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
      m.mutable_exit()->set_retryable(true);
    });
  });
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(CommitFailureTest, StoppedExitWithoutAnOrderRequeuesNotEnds) {
  const int64_t id = Running();
  ExpectAtomic(id, [&] {
    return Send(id, [](auto& m, const std::string& job, int attempt) {
      m.mutable_exit()->set_job(job);
      m.mutable_exit()->set_attempt(attempt);
      m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
    });
  });
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(CommitFailureTest, CancelRunning) {
  const int64_t id = Running();
  ExpectAtomic(id, [&] { return sched_->Cancel(id, "test").status(); });
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_CANCELLED);
  // A failed cancel sent no stop order: exactly one went out, after it committed.
  int stops = 0;
  for (const auto& s : channel_.sent) stops += s.find("stop {") != std::string::npos;
  EXPECT_EQ(stops, 1);
}

TEST_F(CommitFailureTest, SetTargetThatTheCurveAlreadyReached) {
  const int64_t id = Running();
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(Send(id, [](auto& m, const std::string& job, int attempt) {
                m.mutable_eval()->set_job(job);
                m.mutable_eval()->set_attempt(attempt);
                m.mutable_eval()->set_step(100);
                m.mutable_eval()->set_val_loss(2.0);
              }).ok());
  ExpectAtomic(id, [&] { return sched_->SetTarget(id, 2.5, "experiment").status(); });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_DOUBLE_EQ(j.target_val_loss(), 2.5);
  EXPECT_TRUE(j.has_target_reached());
  EXPECT_EQ(j.pending_stop().state(), tally::v1::JOB_STATE_SUCCEEDED);
  int stops = 0;
  for (const auto& s : channel_.sent) stops += s.find("stop {") != std::string::npos;
  EXPECT_EQ(stops, 1) << "one stop order, sent after the commit";
  // The same target again changes nothing.
  const std::string before = base_.GetJob(id)->job().ShortDebugString();
  ASSERT_TRUE(sched_->SetTarget(id, 2.5, "experiment").ok());
  EXPECT_EQ(base_.GetJob(id)->job().ShortDebugString(), before);
  EXPECT_TRUE(absl::IsInvalidArgument(sched_->SetTarget(id, -1, "x").status()));
}

TEST_F(CommitFailureTest, StopJobKeepsTheEvaluatedState) {
  const int64_t id = Running();
  ASSERT_TRUE(Send(id, [](auto& m, const std::string& job, int attempt) {
                m.mutable_eval()->set_job(job);
                m.mutable_eval()->set_attempt(attempt);
                m.mutable_eval()->set_step(50);
                m.mutable_eval()->set_val_loss(3.0);
              }).ok());
  ExpectAtomic(id, [&] {
    return sched_->StopJob(id, tally::v1::JOB_STATE_EARLY_STOPPED, "experiment_halving",
                           "worse half")
        .status();
  });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.pending_stop().rule(), "experiment_halving");
  EXPECT_EQ(j.pending_stop().step(), 50);
  ASSERT_TRUE(Send(id, [](auto& m, const std::string& job, int attempt) {
                m.mutable_exit()->set_job(job);
                m.mutable_exit()->set_attempt(attempt);
                m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
              }).ok());
  const tally::v1::Job ended = base_.GetJob(id)->job();
  EXPECT_EQ(ended.state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_EQ(ended.early_stopping().stop_rule(), "experiment_halving");
  EXPECT_TRUE(absl::IsFailedPrecondition(
      sched_->StopJob(id, tally::v1::JOB_STATE_EARLY_STOPPED, "x", "y").status()));
}

TEST_F(CommitFailureTest, StopJobQueuedEndsAtOnce) {
  auto job = sched_->Submit(Spec(), "");
  ASSERT_TRUE(job.ok());
  const int64_t id = std::stoll(job->name().substr(5));
  ExpectAtomic(id, [&] {
    return sched_->StopJob(id, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, "experiment_budget",
                           "experiment budget spent")
        .status();
  });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
  EXPECT_EQ(j.early_stopping().stop_rule(), "experiment_budget");
  EXPECT_EQ(sched_->QueueDepth(), 0);
}

TEST_F(CommitFailureTest, BudgetStop) {
  const int64_t id = Running();
  clock_.Advance(absl::Seconds(2000));  // $2 of a $1 budget
  ASSERT_TRUE(Send(id, [](auto& m, const std::string&, int) { m.mutable_heartbeat(); }).ok());
  ExpectAtomic(id, [&] { return sched_->Tick(); });
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
}

TEST_F(CommitFailureTest, HeartbeatLossKeepsTheAttemptUntilItsLossCommits) {
  const int64_t id = Running();
  clock_.Advance(absl::Seconds(11));
  // The loss must not be forgotten when its commit fails: the next tick
  // retries it (formerly the worker's slots were cleared first and the
  // attempt stayed RUNNING on a dead worker for good).
  ExpectAtomic(id, [&] { return sched_->Tick(); });
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(CommitFailureTest, OneFailedLossDoesNotOrphanTheOthers) {
  auto a = sched_->Submit(Spec(), "");
  auto b = sched_->Submit(Spec(), "");
  tally::v1::Hello h;
  h.set_worker_id("w0");
  h.set_gpu_type("cpu");
  h.set_slots(2);
  ASSERT_TRUE(sched_->OnHello(h).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Seconds(11));
  store_.FailWrites(true);
  EXPECT_FALSE(sched_->Tick().ok());
  store_.FailWrites(false);
  ASSERT_TRUE(sched_->Tick().ok());
  for (const auto& j : {*a, *b}) {
    const int64_t id = std::stoll(j.name().substr(5));
    EXPECT_NE(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_RUNNING) << j.name();
  }
}

TEST_F(CommitFailureTest, AdoptionOnReconnect) {
  const int64_t id = Running();
  tally::v1::Hello h;
  h.set_worker_id("w0");
  h.set_gpu_type("cpu");
  h.set_slots(1);
  auto* r = h.add_running();
  r->set_job("jobs/" + std::to_string(id));
  r->set_attempt(1);
  // The worker record's write fails first: nothing else may happen.
  const Snapshot before = Take(id);
  store_.FailWrites(true);
  EXPECT_FALSE(sched_->OnHello(h).ok());
  store_.FailWrites(false);
  EXPECT_TRUE(Take(id) == before);
  EXPECT_TRUE(sched_->OnHello(h).ok());
}

}  // namespace
}  // namespace tally::sched
