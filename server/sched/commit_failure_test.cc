// Decide, commit, act: every state change of the scheduler, run once with a
// store that refuses the write. A failed commit must leave the store, the
// scheduler's memory, the messages to workers and the metrics exactly as they
// were; the same call then succeeds once the store takes writes again.
#include <algorithm>
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
#include "tests/support/store/fault_injection_job_store.h"
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
    options_.prices.usd_per_gpu_hour["cpu"] = 3.6;  // $0.001 per GPU-second
    NewScheduler();
  }
  void NewScheduler() {
    registries_.push_back(std::make_unique<metrics::Registry>());
    sched_ = std::make_unique<Scheduler>(&store_, &channel_, &clock_, registries_.back().get(),
                                         options_);
    sched_->AddObserver(&watcher_);
  }
  // tallyd restarts (with options_ as they are now): a new scheduler over the
  // same store, recovered from it.
  void Restart() {
    NewScheduler();
    ASSERT_TRUE(sched_->Recover().ok());
  }
  metrics::Registry& registry() { return *registries_.back(); }
  // One series' value: Metric("tally_job_ends_total,reason_rule=target,state=succeeded").
  double Metric(const std::string& key) {
    for (const auto& f : registry().Collect()) {
      for (const auto& m : f.metric) {
        std::string k = f.name;
        for (const auto& [label, value] : m.labels) k += "," + label + "=" + value;
        if (k == key) return m.value;
      }
    }
    ADD_FAILURE() << "no series " << key;
    return -1;
  }

  tally::v1::JobSpec Spec(int gpus = 1) {
    tally::v1::JobSpec s = TinySpec(gpus);
    s.mutable_early_stopping()->set_patience(1);
    s.mutable_budget()->set_max_dollars(1.0);
    s.set_max_attempts(3);
    return s;
  }
  tally::v1::Hello HelloMessage(const std::string& w, const std::vector<int64_t>& running = {},
                                int slots = 1) {
    tally::v1::Hello h;
    h.set_worker_id(w);
    h.set_gpu_type("cpu");
    h.set_slots(slots);
    for (int64_t id : running) {
      auto* r = h.add_running();
      r->set_job("jobs/" + std::to_string(id));
      r->set_attempt(sched_->ActiveJobView(id)->attempt());
    }
    return h;
  }
  void Hello(const std::string& w, const std::vector<int64_t>& running = {}) {
    ASSERT_TRUE(sched_->OnHello(HelloMessage(w, running)).ok());
  }
  // A job running on w0.
  int64_t Running() { return Running(Spec()); }
  int64_t Running(const tally::v1::JobSpec& spec, const Actor& by = {}) {
    auto job = sched_->Submit(spec, "", by);
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
  absl::Status Eval(int64_t id, int64_t step, double loss) {
    return Send(id, [&](auto& m, const std::string& job, int attempt) {
      m.mutable_eval()->set_job(job);
      m.mutable_eval()->set_attempt(attempt);
      m.mutable_eval()->set_step(step);
      m.mutable_eval()->set_val_loss(loss);
    });
  }
  // A checkpoint in the job's own folder, unless `path` says otherwise.
  absl::Status Checkpoint(int64_t id, int64_t step, const std::string& path = "") {
    return Send(id, [&](auto& m, const std::string& job, int attempt) {
      m.mutable_checkpoint()->set_job(job);
      m.mutable_checkpoint()->set_attempt(attempt);
      m.mutable_checkpoint()->set_step(step);
      m.mutable_checkpoint()->set_path(
          !path.empty() ? path : CheckpointPath(job, step));
    });
  }
  absl::Status Exit(int64_t id, tally::v1::AttemptOutcome outcome) {
    return Send(id, [&](auto& m, const std::string& job, int attempt) {
      m.mutable_exit()->set_job(job);
      m.mutable_exit()->set_attempt(attempt);
      m.mutable_exit()->set_outcome(outcome);
    });
  }
  absl::Status Progress(int64_t id, int64_t step) {
    return Send(id, [&](auto& m, const std::string& job, int attempt) {
      m.mutable_progress()->set_job(job);
      m.mutable_progress()->set_attempt(attempt);
      m.mutable_progress()->set_step(step);
      m.mutable_progress()->set_tokens(step * 100);
      m.mutable_progress()->set_trained(true);
      m.mutable_progress()->set_useful_tokens_per_second(100);
    });
  }
  // Stop orders sent, and those that ask for a final checkpoint.
  int Stops(bool with_checkpoint = false) {
    int n = 0;
    for (const auto& s : channel_.sent) {
      n += s.find("stop {") != std::string::npos &&
           (!with_checkpoint || s.find("checkpoint: true") != std::string::npos);
    }
    return n;
  }
  std::vector<std::string> EventTypes(int64_t id) {
    std::vector<std::string> types;
    const std::vector<tally::v1::JobEvent> events = *base_.ListEvents(id, 0, 1000);
    for (const auto& e : events) types.push_back(e.type());
    return types;
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
    std::istringstream text(metrics::SerializeText(registry().Collect()));
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

  // What the store refuses during the failing run: every write, or only
  // commits (a Hello still records its worker, then its reconcile fails).
  enum class Refuse { kWrites, kCommits };

  // Runs `change` with writes failing (it must fail and change nothing),
  // then with writes working (it must succeed and change the job).
  void ExpectAtomic(int64_t id, const std::function<absl::Status()>& change,
                    Refuse refuse = Refuse::kWrites) {
    const Snapshot before = Take(id);
    const int refused = store_.failed_writes();
    if (refuse == Refuse::kWrites) {
      store_.FailWrites(true);
    } else {
      store_.FailCommits(true);
    }
    absl::Status failed = change();
    store_.FailWrites(false);
    store_.FailCommits(false);
    EXPECT_FALSE(failed.ok()) << "the change did not reach the store";
    EXPECT_GT(store_.failed_writes(), refused);
    const Snapshot after = Take(id);
    EXPECT_EQ(after.stored, before.stored);
    EXPECT_EQ(after.view, before.view);
    // A Hello's welcome is the one message sent before its reconcile
    // commits: tallyd's API holds back what OnHello sends and drops it when
    // the Hello is refused (server/api/core.cc). Nothing else may go out.
    std::vector<std::string> sent = after.sent;
    if (refuse == Refuse::kCommits) {
      const size_t old = std::min(before.sent.size(), sent.size());
      sent.erase(std::remove_if(sent.begin() + old, sent.end(),
                                [](const std::string& m) {
                                  return m.find(" welcome {") != std::string::npos;
                                }),
                 sent.end());
    }
    EXPECT_EQ(sent, before.sent) << "a message was sent for an uncommitted change";
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
  SchedulerOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;
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
      m.mutable_checkpoint()->set_path(CheckpointPath(job, 10));
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
    m.mutable_checkpoint()->set_path(CheckpointPath(job, 10));
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

// A decided stop finishes when rank 0's STOPPED exit arrives: the job ends
// as decided, naming its best checkpoint (the lowest val_loss), and the
// stop is counted once, after it has committed.
TEST_F(CommitFailureTest, PendingEarlyStopFinishedByTheExit) {
  const int64_t id = Running();
  ASSERT_TRUE(Eval(id, 0, 5.0).ok());
  ASSERT_TRUE(Eval(id, 10, 4.0).ok());
  ASSERT_TRUE(Checkpoint(id, 10).ok());      // val_loss 4.0: the best
  ASSERT_TRUE(Eval(id, 20, 4.5).ok());       // patience 1: stop decided
  ASSERT_TRUE(sched_->ActiveJobView(id)->has_pending_stop());
  ASSERT_TRUE(Checkpoint(id, 20).ok());      // the final checkpoint it ordered
  const std::string ends = "tally_job_ends_total,reason_rule=patience,state=early_stopped";
  const std::string early = "tally_early_stops_total,rule=patience";
  ASSERT_EQ(Metric(ends), 0);
  ASSERT_EQ(Metric(early), 0);
  ExpectAtomic(id, [&] { return Exit(id, tally::v1::ATTEMPT_OUTCOME_STOPPED); });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_FALSE(j.has_pending_stop());
  EXPECT_EQ(j.early_stopping().stop_rule(), "patience");
  EXPECT_THAT(j.early_stopping().best_checkpoint(), ::testing::EndsWith("/step-00000010.ckpt"));
  EXPECT_EQ(Metric(ends), 1);
  EXPECT_EQ(Metric(early), 1);
  EXPECT_EQ(Metric("tally_attempts_ended_total,outcome=stopped"), 1);
  EXPECT_EQ(sched_->Workers()[0].used_slots, 0) << "the exit frees its slot once committed";
}

TEST_F(CommitFailureTest, PendingTargetStopFinishedByTheExitSucceeds) {
  tally::v1::JobSpec spec = Spec();
  spec.mutable_early_stopping()->set_target_val_loss(4.2);
  const int64_t id = Running(spec);
  ASSERT_TRUE(Eval(id, 0, 5.0).ok());
  ASSERT_TRUE(Eval(id, 10, 4.0).ok());  // target reached: SUCCEEDED decided
  ASSERT_EQ(sched_->ActiveJobView(id)->pending_stop().state(), tally::v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(Checkpoint(id, 10).ok());
  const std::string ends = "tally_job_ends_total,reason_rule=target,state=succeeded";
  ASSERT_EQ(Metric(ends), 0);
  ExpectAtomic(id, [&] { return Exit(id, tally::v1::ATTEMPT_OUTCOME_STOPPED); });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(j.early_stopping().best_checkpoint(), ::testing::EndsWith("/step-00000010.ckpt"));
  EXPECT_EQ(Metric(ends), 1);
}

// The workers never confirm a decided stop: at stop_grace the tick ends the
// job without them and orders them to stop now (no checkpoint). A failed
// commit sends no order and counts no end; the next tick does both once.
TEST_F(CommitFailureTest, PendingStopFinishedAtTheGraceDeadline) {
  const int64_t id = Running();
  ASSERT_TRUE(Eval(id, 0, 5.0).ok());
  ASSERT_TRUE(Eval(id, 10, 5.0).ok());  // patience 1: stop decided
  ASSERT_TRUE(sched_->ActiveJobView(id)->has_pending_stop());
  ASSERT_TRUE(Checkpoint(id, 10).ok());
  clock_.Advance(options_.stop_grace);  // $0.12 of the $1 budget
  // The worker is alive (so it is the deadline that ends the job, not its loss).
  ASSERT_TRUE(Send(id, [](auto& m, const std::string&, int) { m.mutable_heartbeat(); }).ok());
  ASSERT_EQ(Stops(), 1);  // the stop(checkpoint) of the decision
  ExpectAtomic(id, [&] { return sched_->Tick(); });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_THAT(j.early_stopping().best_checkpoint(), ::testing::EndsWith("/step-00000010.ckpt"));
  auto events = *base_.ListEvents(id, 0, 1000);
  EXPECT_THAT(events.back().detail(), ::testing::HasSubstr("did not confirm the stop within"));
  EXPECT_EQ(Stops(), 2) << "one stop(now), sent after the commit";
  EXPECT_EQ(Stops(/*with_checkpoint=*/true), 1);
  EXPECT_EQ(Metric("tally_job_ends_total,reason_rule=patience,state=early_stopped"), 1);
  EXPECT_EQ(Metric("tally_early_stops_total,rule=patience"), 1);
  // The slot stays held until the worker reports its exit.
  EXPECT_EQ(sched_->Workers()[0].used_slots, 1);
}

// A progress report that takes the tenant past its daily dollar quota ends
// the job. The tenant's spend, the end counter and the stop order move only
// once the stop commits: a failed commit must not add the dollars it would
// have committed to the tenant's window.
TEST_F(CommitFailureTest, TenantQuotaStopAtAProgressReport) {
  options_.quotas["research"] = {/*max_gpus=*/0, /*max_dollars_per_day=*/0.005, 0};
  Restart();
  const int64_t id = Running(Spec(), Actor{"alice", "research"});
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Progress(id, 3).ok());  // $0.002 of $0.005, committed with its event
  ASSERT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(4));  // $0.006 with what is not committed yet
  const std::string ends = "tally_job_ends_total,reason_rule=tenant_quota,state=budget_exhausted";
  ASSERT_EQ(Metric(ends), 0);
  // The same report again: its measurements are already in, so only the
  // quota's decision is new.
  ExpectAtomic(id, [&] { return Progress(id, 3); });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
  EXPECT_THAT(j.state_reason(), ::testing::HasSubstr("tenant quota: research spent $0.006"));
  EXPECT_EQ(Metric(ends), 1);
  EXPECT_EQ(Stops(), 1);
  ASSERT_TRUE(sched_->Tick().ok());  // refreshes the tenant gauges
  EXPECT_NEAR(Metric("tally_tenant_spend_usd,tenant=research,window=day"), j.cost().cost_usd(),
              1e-9)
      << "the tenant's window holds exactly the committed dollars";
  EXPECT_NEAR(j.cost().cost_usd(), 0.006, 1e-9);
}

// A tenant's job held back by max_gpus says why, once: its state_reason
// and a "waiting" event. Were the reason set in memory before the commit,
// the failed tick would change the view, and the next tick would see the
// reason already in place and never write the event.
TEST_F(CommitFailureTest, TenantMaxGpusWaitingEvent) {
  options_.quotas["research"] = {/*max_gpus=*/1, 0, 0};
  Restart();
  Running(Spec(), Actor{"alice", "research"});
  auto job = sched_->Submit(Spec(), "", Actor{"alice", "research"});
  ASSERT_TRUE(job.ok());
  const int64_t id = std::stoll(job->name().substr(5));
  // Refreshes the gauges (the queue depth now counts this job) without a
  // write, so the failing tick below has nothing else to show.
  sched_->SetQuotas(options_.quotas);
  const std::string reason_before = base_.GetJob(id)->job().state_reason();
  ExpectAtomic(id, [&] { return sched_->Tick(); });
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_NE(j.state_reason(), reason_before);
  EXPECT_THAT(j.state_reason(),
              ::testing::HasSubstr("waiting: tenant research is at its max_gpus 1"));
  EXPECT_THAT(EventTypes(id), ::testing::ElementsAre("submitted", "waiting"));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_THAT(EventTypes(id), ::testing::ElementsAre("submitted", "waiting"))
      << "said once, not every tick";
}

// A worker's going-away notice records one "notice" event per job it runs.
// A failed commit records nothing (and is not acknowledged, so the notice
// comes again); a notice sent again after its commit records nothing more.
TEST_F(CommitFailureTest, NoticeEventsAreRecordedOnceACommitTakesThem) {
  const int64_t id = Running();
  auto notice = [&] {
    tally::v1::WorkerMessage m;
    m.mutable_notice()->set_cause("sigterm");
    m.mutable_notice()->set_deadline_seconds(30);
    return sched_->OnMessage("w0", m);
  };
  auto notices = [&] {
    const std::vector<std::string> types = EventTypes(id);
    return std::count(types.begin(), types.end(), "notice");
  };
  ExpectAtomic(id, notice);
  EXPECT_EQ(notices(), 1);
  ASSERT_TRUE(notice().ok());
  EXPECT_EQ(notices(), 1) << "a notice sent again is recorded once";
  // Its word holds either way: nothing new is placed on it.
  ASSERT_TRUE(sched_->Submit(Spec(), "").ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(sched_->QueueDepth(), 1);
}

// New prices (SIGHUP) apply from the moment the spend so far is committed at
// the old ones. When that commit fails, the old prices stay: the time that
// ran under them is never priced at the new ones.
TEST_F(CommitFailureTest, NewPricesWaitUntilTheSpendAtTheOldOnesIsCommitted) {
  const int64_t id = Running();
  const double start = sched_->ActiveJobView(id)->cost().cost_usd();
  auto doubled = options_.prices;
  doubled.usd_per_gpu_hour["cpu"] = 7.2;  // $0.002 per GPU-second
  clock_.Advance(absl::Seconds(10));
  store_.FailWrites(true);
  const absl::Status refused = sched_->SetPrices(doubled);
  store_.FailWrites(false);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("jobs/" + std::to_string(id) + ": its spend at the old prices"));
  clock_.Advance(absl::Seconds(10));
  EXPECT_NEAR(sched_->ActiveJobView(id)->cost().cost_usd() - start, 0.020, 1e-9)
      << "20 s at the old $3.6/h";
  ASSERT_TRUE(sched_->SetPrices(doubled).ok());
  clock_.Advance(absl::Seconds(10));
  EXPECT_NEAR(sched_->ActiveJobView(id)->cost().cost_usd() - start, 0.040, 1e-9)
      << "then 10 s at $7.2/h";
}

// A checkpoint outside the job's folder is never recorded: the attempt
// fails (and the job is requeued). The refusal is counted in
// tally_worker_reports_refused_total{kind="checkpoint_path"} only once that
// failure has committed; a report whose commit fails has had no effect yet.
TEST_F(CommitFailureTest, CheckpointOutsideTheJobsFolderFailsTheAttempt) {
  const int64_t id = Running();
  const std::string refused = "tally_worker_reports_refused_total,kind=checkpoint_path";
  ASSERT_EQ(Metric(refused), 0);
  clock_.Advance(absl::Seconds(3));
  ExpectAtomic(id, [&] { return Checkpoint(id, 10, "/ckpt/job-999/10"); });
  EXPECT_EQ(Metric(refused), 1);
  const tally::v1::Job j = base_.GetJob(id)->job();
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(base_.ListCheckpoints(id)->empty());
  auto attempts = *base_.ListAttempts(id);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].state(), store::ATTEMPT_STATE_FAILED);
  EXPECT_THAT(attempts[0].reason(), ::testing::HasSubstr("checkpoint record refused"));
  EXPECT_EQ(Metric("tally_attempts_ended_total,outcome=failed"), 1);
}

// After a restart, a worker that never comes back loses its attempt at the
// heartbeat timeout: the job is requeued, the worker forgotten and counted
// lost. A failed commit keeps the worker (holding the attempt, to retry) and
// counts nothing.
TEST_F(CommitFailureTest, RecoveredAttemptWhoseWorkerNeverCameBack) {
  const int64_t id = Running();
  Restart();
  ASSERT_TRUE(sched_->Tick().ok());  // the recovered job's series appear
  clock_.Advance(absl::Seconds(11));
  const std::string lost = "tally_workers_lost_total,gpu_type=cpu";
  ASSERT_EQ(Metric(lost), 0);
  ExpectAtomic(id, [&] { return sched_->Tick(); });
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(base_.ListAttempts(id)->back().state(), store::ATTEMPT_STATE_LOST);
  EXPECT_EQ(Metric(lost), 1);
  EXPECT_EQ(Metric("tally_attempts_ended_total,outcome=lost"), 1);
  EXPECT_TRUE(sched_->Workers().empty());
}

// A job stored RUNNING without a running attempt (its attempt's end was
// committed, then tallyd stopped) is requeued by Recover. When that commit
// fails, Recover fails and nothing is stored or told; a later start
// requeues it once.
TEST_F(CommitFailureTest, RecoverRequeuesARunningJobWithoutARunningAttempt) {
  const int64_t id = Running();
  store::AttemptRecord a = base_.ListAttempts(id)->back();
  a.set_state(store::ATTEMPT_STATE_LOST);
  store::Mutation ended;
  ended.attempts.push_back(a);
  ASSERT_TRUE(base_.Commit(ended).ok());
  const std::string stored = base_.GetJob(id)->job().ShortDebugString();
  const size_t events = EventTypes(id).size();
  const size_t commits = watcher_.commits.size();
  const size_t sent = channel_.sent.size();

  store_.FailWrites(true);
  NewScheduler();
  EXPECT_FALSE(sched_->Recover().ok());
  store_.FailWrites(false);
  EXPECT_EQ(base_.GetJob(id)->job().ShortDebugString(), stored);
  EXPECT_EQ(EventTypes(id).size(), events);
  EXPECT_EQ(watcher_.commits.size(), commits) << "an observer saw an uncommitted requeue";
  EXPECT_EQ(channel_.sent.size(), sent);
  EXPECT_EQ(sched_->QueueDepth(), 0) << "requeued in memory without its commit";
  EXPECT_EQ(Metric("tally_job_transitions_total,state=queued"), 0);

  Restart();
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(EventTypes(id).back(), "requeued");
  EXPECT_EQ(EventTypes(id).size(), events + 1);
  EXPECT_EQ(sched_->QueueDepth(), 1);
  EXPECT_EQ(Metric("tally_job_transitions_total,state=queued"), 1);
}

// A worker reconnects (after tallyd restarted) still running an attempt
// with a decided stop: the adoption commits an "adopted" event and holds
// its slot, and only then is the stop(checkpoint) asked for again. The
// store still records the worker but refuses the adoption's commit.
TEST_F(CommitFailureTest, AdoptionAfterARestartAsksForThePendingStopAfterItCommits) {
  const int64_t id = Running();
  ASSERT_TRUE(Eval(id, 0, 5.0).ok());
  ASSERT_TRUE(Eval(id, 10, 5.0).ok());  // patience 1: stop decided
  ASSERT_TRUE(sched_->ActiveJobView(id)->has_pending_stop());
  Restart();
  channel_.sent.clear();
  const tally::v1::Hello hello = HelloMessage("w0", {id});
  ExpectAtomic(id, [&] { return sched_->OnHello(hello).status(); }, Refuse::kCommits);
  EXPECT_EQ(EventTypes(id).back(), "adopted");
  EXPECT_EQ(Stops(/*with_checkpoint=*/true), 1) << "asked again once, after the commit";
  ASSERT_EQ(sched_->Workers().size(), 1u);
  EXPECT_TRUE(sched_->Workers()[0].connected);
  EXPECT_EQ(sched_->Workers()[0].used_slots, 1);
}

// A worker reconnects without the attempt tallyd placed on it (it
// restarted): the attempt is lost and the job requeued. A failed commit
// keeps the slot held and the worker disconnected; its next Hello does it.
TEST_F(CommitFailureTest, ForgottenAttemptOnReconnect) {
  auto job = sched_->Submit(Spec(), "");
  ASSERT_TRUE(job.ok());
  const int64_t id = std::stoll(job->name().substr(5));
  auto gen = sched_->OnHello(HelloMessage("w0"));
  ASSERT_TRUE(gen.ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(sched_->ActiveJobView(id)->state(), tally::v1::JOB_STATE_RUNNING);
  sched_->OnDisconnect("w0", *gen);
  const std::string lost = "tally_attempts_ended_total,outcome=lost";
  ASSERT_EQ(Metric(lost), 0);
  ExpectAtomic(id, [&] { return sched_->OnHello(HelloMessage("w0")).status(); },
               Refuse::kCommits);
  EXPECT_EQ(base_.GetJob(id)->job().state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(base_.ListAttempts(id)->back().state(), store::ATTEMPT_STATE_LOST);
  EXPECT_THAT(base_.ListAttempts(id)->back().reason(),
              ::testing::HasSubstr("reconnected without it"));
  EXPECT_EQ(Metric(lost), 1);
  ASSERT_EQ(sched_->Workers().size(), 1u);
  EXPECT_TRUE(sched_->Workers()[0].connected);
  EXPECT_EQ(sched_->Workers()[0].used_slots, 0);
}

// Two attempts adopted after a restart, each with a decided stop: the
// second adoption's commit fails, so the Hello is refused (the worker is not
// attached, and what was sent to it during the Hello is dropped with it).
// Nothing is lost for good: the stops are committed state, and the worker's
// next Hello adopts both and asks for both stops again.
TEST_F(CommitFailureTest, AFailedAdoptionLosesNoOrderOfTheAdoptionsThatCommitted) {
  auto first = sched_->Submit(Spec(), "");
  auto second = sched_->Submit(Spec(), "");
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_TRUE(sched_->OnHello(HelloMessage("w0", {}, /*slots=*/2)).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  std::vector<int64_t> ids;
  for (const auto& j : {*first, *second}) {
    const int64_t id = std::stoll(j.name().substr(5));
    ASSERT_EQ(sched_->ActiveJobView(id)->state(), tally::v1::JOB_STATE_RUNNING);
    ASSERT_TRUE(Eval(id, 0, 5.0).ok());
    ASSERT_TRUE(Eval(id, 10, 5.0).ok());  // patience 1: a stop is decided
    ids.push_back(id);
  }
  Restart();
  channel_.sent.clear();
  const tally::v1::Hello hello = HelloMessage("w0", ids, /*slots=*/2);
  store_.FailCommitsAfter(1);
  EXPECT_FALSE(sched_->OnHello(hello).ok());
  store_.FailCommits(false);
  EXPECT_FALSE(sched_->Workers()[0].connected) << "a refused Hello attaches nothing";
  EXPECT_EQ(EventTypes(ids[0]).back(), "adopted");
  EXPECT_NE(EventTypes(ids[1]).back(), "adopted");

  channel_.sent.clear();
  ASSERT_TRUE(sched_->OnHello(hello).ok());
  EXPECT_EQ(Stops(/*with_checkpoint=*/true), 2) << "both decided stops asked for again";
  for (int64_t id : ids) EXPECT_EQ(EventTypes(id).back(), "adopted");
  EXPECT_TRUE(sched_->Workers()[0].connected);
  EXPECT_EQ(sched_->Workers()[0].used_slots, 2);
}

}  // namespace
}  // namespace tally::sched

namespace tally::sched {
namespace {

// The disk fills for 20 s while a job runs: the worker's reports cannot be
// committed (tallyd ends its stream) and its hellos cannot be recorded. Once
// writes work again it is back within its heartbeat timeout: the attempt
// was never lost, and the job ends SUCCEEDED on its first attempt.
TEST_F(CommitFailureTest, AStoreThatRefusesWritesCostsNoAttempt) {
  const int64_t id = Running();
  ASSERT_TRUE(Progress(id, 10).ok());
  store_.FailWrites(true);
  EXPECT_FALSE(Progress(id, 150).ok() && Checkpoint(id, 150).ok());
  sched_->OnDisconnect("w0", 1);  // tallyd ended the stream
  for (int s = 0; s < 20; ++s) {
    clock_.Advance(absl::Seconds(1));
    EXPECT_FALSE(sched_->OnHello(HelloMessage("w0", {id})).ok()) << "the hello is not recorded";
    sched_->Tick().IgnoreError();
  }
  store_.FailWrites(false);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(sched_->ActiveJobView(id)->state(), tally::v1::JOB_STATE_RUNNING)
      << "not lost for the silence tallyd caused";
  Hello("w0", {id});
  ASSERT_TRUE(Checkpoint(id, 150).ok());
  ASSERT_TRUE(Exit(id, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  const tally::v1::Job job = *base_.GetJob(id)->mutable_job();
  EXPECT_EQ(job.state(), tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job.attempt(), 1);
  EXPECT_EQ(job.step(), 150);

  // The clock pauses, it does not restart: a worker already silent 30 s
  // when the store first refused a write (the loss's own commit) is lost
  // as soon as writes work again.
  const int64_t other = Running();
  sched_->OnDisconnect("w0", 2);
  clock_.Advance(absl::Seconds(30));
  store_.FailWrites(true);
  sched_->Tick().IgnoreError();
  store_.FailWrites(false);
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  const tally::v1::Job lost = *sched_->ActiveJobView(other);
  EXPECT_EQ(lost.state(), tally::v1::JOB_STATE_QUEUED) << "lost and requeued";
  // (Its silence leaves out the outages and the 5 s after each that a
  // turned-away worker may take to come back.)
  EXPECT_THAT(lost.state_reason(), testing::HasSubstr("attempt 1 lost: worker w0 silent for"));
}

}  // namespace
}  // namespace tally::sched
