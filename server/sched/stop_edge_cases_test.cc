// Stops and slots at their edges: a decided stop meeting a budget, a
// finished attempt, a restart, a gang sharing a worker; a Hello or an exit
// whose commit fails. Each of these once went wrong.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_replace.h"
#include "server/sched/scheduler.h"
#include "server/sched/scheduler_test_util.h"
#include "tests/support/store/fault_injection_job_store.h"
#include "server/store/memory_job_store.h"

namespace tally::sched {
namespace {

using tally::v1::JobState;

class StopEdgeCasesTest : public ::testing::Test {
 protected:
  StopEdgeCasesTest() : store_(&base_) {
    options_.prices.usd_per_gpu_hour["cpu"] = 3.6;  // $0.001 per GPU-second
    Restart();
  }
  void Restart() {
    registries_.push_back(std::make_unique<metrics::Registry>());
    sched_ = std::make_unique<Scheduler>(&store_, &channel_, &clock_, registries_.back().get(),
                                         options_);
    ASSERT_TRUE(sched_->Recover().ok());
  }
  tally::v1::JobSpec Spec(int gpus = 1) {
    tally::v1::JobSpec s = TinySpec(gpus);
    s.set_max_attempts(3);
    return s;
  }
  absl::StatusOr<int64_t> Hello(const std::string& w, int slots,
                                const std::vector<std::pair<int64_t, int>>& running = {}) {
    tally::v1::Hello h;
    h.set_worker_id(w);
    h.set_gpu_type("cpu");
    h.set_slots(slots);
    for (auto [id, attempt] : running) {
      auto* r = h.add_running();
      r->set_job("jobs/" + std::to_string(id));
      r->set_attempt(attempt);
    }
    return sched_->OnHello(h);
  }
  int64_t Submit(tally::v1::JobSpec s) {
    auto job = sched_->Submit(s, "");
    EXPECT_TRUE(job.ok()) << job.status();
    return std::stoll(job->name().substr(5));
  }
  tally::v1::Job Job(int64_t id) { return base_.GetJob(id)->job(); }
  std::string N(int64_t id) { return "jobs/" + std::to_string(id); }
  absl::Status Eval(const std::string& w, int64_t id, int64_t step, double loss) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job(N(id));
    m.mutable_eval()->set_attempt(Job(id).attempt());
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_val_loss(loss);
    return sched_->OnMessage(w, m);
  }
  absl::Status Checkpoint(const std::string& w, int64_t id, int64_t step) {
    tally::v1::WorkerMessage m;
    m.mutable_checkpoint()->set_job(N(id));
    m.mutable_checkpoint()->set_attempt(Job(id).attempt());
    m.mutable_checkpoint()->set_step(step);
    m.mutable_checkpoint()->set_tokens(step * 10);
    m.mutable_checkpoint()->set_path(CheckpointPath(N(id), step));
    return sched_->OnMessage(w, m);
  }
  absl::Status Exit(const std::string& w, int64_t id, int attempt, tally::v1::AttemptOutcome o,
                    int rank = 0) {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job(N(id));
    m.mutable_exit()->set_attempt(attempt);
    m.mutable_exit()->set_outcome(o);
    m.mutable_exit()->set_rank(rank);
    return sched_->OnMessage(w, m);
  }
  // A FAILED exit another attempt may fix.
  absl::Status FailRetryable(const std::string& w, int64_t id, int attempt) {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job(N(id));
    m.mutable_exit()->set_attempt(attempt);
    m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
    m.mutable_exit()->set_retryable(true);
    return sched_->OnMessage(w, m);
  }
  absl::Status Beat(const std::string& w) {
    tally::v1::WorkerMessage m;
    m.mutable_heartbeat();
    return sched_->OnMessage(w, m);
  }
  int Used(const std::string& w) {
    for (const auto& v : sched_->Workers()) {
      if (v.record.worker_id() == w) return v.used_slots;
    }
    return -1;
  }
  bool Connected(const std::string& w) {
    for (const auto& v : sched_->Workers()) {
      if (v.record.worker_id() == w) return v.connected;
    }
    return false;
  }

  FakeClock clock_;
  store::InMemoryJobStore base_;
  store::FaultInjectionJobStore store_;
  RecordingChannel channel_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;
  std::unique_ptr<Scheduler> sched_;
};

// A budget that runs out while a decided stop waits for its checkpoint does
// not replace the decision (stop_grace bounds the spend): the job ends as
// decided, with the final checkpoint it ordered.
TEST_F(StopEdgeCasesTest, BudgetDuringPendingStopOverridesTheDecision) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_target_val_loss(3.5);
  spec.mutable_budget()->set_max_dollars(0.05);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Eval("w0", id, 0, 5.0).ok());
  clock_.Advance(absl::Seconds(40));
  ASSERT_TRUE(Eval("w0", id, 10, 3.0).ok());  // target reached: pending SUCCEEDED
  ASSERT_EQ(Job(id).pending_stop().state(), tally::v1::JOB_STATE_SUCCEEDED);
  clock_.Advance(absl::Seconds(15));  // $0.055 > $0.05, well within stop_grace
  ASSERT_TRUE(Beat("w0").ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING) << "the decided stop stands";
  ASSERT_TRUE(Checkpoint("w0", id, 10).ok());  // the ordered final checkpoint
  ASSERT_TRUE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  const auto j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_SUCCEEDED)
      << "decided SUCCEEDED (target reached), ended " << tally::v1::JobState_Name(j.state());
  EXPECT_EQ(base_.ListCheckpoints(id)->size(), 1u) << "the ordered final checkpoint was dropped";
}

// A SUCCEEDED exit during a pending stop (the worker reached max_steps
// before the stop order landed) keeps the decision: a diverged job ends
// EARLY_STOPPED, not SUCCEEDED.
TEST_F(StopEdgeCasesTest, SucceededExitDuringPendingDivergenceStop) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Eval("w0", id, 990, std::nan("")).ok());
  ASSERT_EQ(Job(id).pending_stop().rule(), "divergence");
  ASSERT_TRUE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_EARLY_STOPPED)
      << "ended " << tally::v1::JobState_Name(Job(id).state()) << ", stop_rule='"
      << Job(id).early_stopping().stop_rule() << "'";
}

// Two ranks of a gang on one worker: rank 1's exit frees its own slot only,
// while rank 0 is still writing the final checkpoint.
TEST_F(StopEdgeCasesTest, OneRankExitFreesEveryRankOnThatWorker) {
  auto spec = Spec(2);
  spec.mutable_early_stopping()->set_patience(1);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(Hello("w0", 2).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Used("w0"), 2);
  ASSERT_TRUE(Eval("w0", id, 0, 5.0).ok());
  ASSERT_TRUE(Eval("w0", id, 10, 5.0).ok());  // pending stop
  ASSERT_TRUE(Job(id).has_pending_stop());
  ASSERT_TRUE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED, /*rank=*/1).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Used("w0"), 1) << "rank 0 still runs on w0";
}

// A Hello whose reconcile fails to commit is refused, and the API attaches
// no stream: the worker must not look connected, or work placed on it would
// go nowhere.
TEST_F(StopEdgeCasesTest, FailedHelloLeavesTheWorkerConnected) {
  const int64_t a = Submit(Spec());
  auto gen = Hello("w0", 2);
  ASSERT_TRUE(gen.ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);
  sched_->OnDisconnect("w0", *gen);
  store_.FailCommits(true);
  EXPECT_FALSE(Hello("w0", 2).ok());  // w0 restarted: A is forgotten, its loss fails to commit
  store_.FailCommits(false);
  EXPECT_FALSE(Connected("w0")) << "the API refused this Hello: no stream is attached";
  const int64_t b = Submit(Spec());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(b).state(), tally::v1::JOB_STATE_QUEUED)
      << "placed on a worker with no stream: " << Job(b).ShortDebugString();
}

// After a tallyd restart the final checkpoint of a pending stop keeps the
// val_loss its evaluation measured (from the job's curve), so the stop names
// it as the best.
TEST_F(StopEdgeCasesTest, ARestartBetweenStopEvalAndFinalCheckpointStillNamesTheBest) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_patience(1);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Eval("w0", id, 0, 5.0).ok());
  ASSERT_TRUE(Checkpoint("w0", id, 0).ok());   // val_loss 5.0
  ASSERT_TRUE(Eval("w0", id, 10, 4.99).ok());  // < 3% better: patience 1 stops
  ASSERT_TRUE(Job(id).has_pending_stop());
  Restart();
  ASSERT_TRUE(Hello("w0", 1, {{id, 1}}).ok());
  ASSERT_TRUE(Checkpoint("w0", id, 10).ok());  // the state the stop measured (4.99)
  ASSERT_TRUE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  EXPECT_THAT(Job(id).early_stopping().best_checkpoint(), testing::EndsWith("/step-00000010.ckpt"));
}

// A SUCCEEDED exit whose commit fails is kept and retried: the API closes
// the stream and the worker reconnects without the attempt, which must end
// as the exit said, not as lost.
TEST_F(StopEdgeCasesTest, AFailedExitCommitTurnsASuccessIntoALoss) {
  const int64_t id = Submit(Spec());
  auto gen = Hello("w0", 1);
  ASSERT_TRUE(sched_->Tick().ok());
  store_.FailCommits(true);
  EXPECT_FALSE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  store_.FailCommits(false);
  sched_->OnDisconnect("w0", *gen);  // the API ends the stream on the error
  ASSERT_TRUE(Hello("w0", 1).ok());  // the exit was delivered: not reported as running
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_SUCCEEDED)
      << "ended up " << tally::v1::JobState_Name(Job(id).state()) << ": " << Job(id).state_reason();
}

// Cancel during a pending stop: the job ends; the stop(checkpoint) the
// worker is obeying is followed by a stop(now).
TEST_F(StopEdgeCasesTest, CancelDuringPendingStop) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_patience(1);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Eval("w0", id, 0, 5.0).ok());
  ASSERT_TRUE(Eval("w0", id, 10, 5.0).ok());
  ASSERT_TRUE(sched_->Cancel(id, "x").ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_CANCELLED);
  EXPECT_FALSE(Job(id).has_pending_stop());
  EXPECT_EQ(Used("w0"), 1);
  ASSERT_TRUE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  EXPECT_EQ(Used("w0"), 0);
}

// Gang on two workers, pending stop, rank 0 exits first, then rank 1.
TEST_F(StopEdgeCasesTest, GangPendingStopRankZeroFirst) {
  auto spec = Spec(2);
  spec.mutable_early_stopping()->set_patience(1);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(Hello("w1", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Eval("w0", id, 0, 5.0).ok());
  ASSERT_TRUE(Eval("w0", id, 10, 5.0).ok());
  ASSERT_TRUE(Checkpoint("w0", id, 10).ok());
  ASSERT_TRUE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED, 0).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_EQ(Used("w0"), 0);
  EXPECT_EQ(Used("w1"), 1);
  ASSERT_TRUE(Exit("w1", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED, 1).ok());
  EXPECT_EQ(Used("w1"), 0);
}


// A worker reporting on another worker's attempt (made-up losses, a
// checkpoint path of its choosing, an exit) moves nothing; the holder's own
// reports still do.
TEST_F(StopEdgeCasesTest, ReportsOnAnotherWorkersAttemptMoveNothing) {
  ASSERT_TRUE(Hello("w1", 1).ok());
  ASSERT_TRUE(Hello("w2", 1).ok());
  tally::v1::JobSpec s = Spec();
  s.mutable_early_stopping()->set_target_val_loss(0.5);
  const int64_t id = Submit(s);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  const std::string holder = Job(id).worker_ids(0);
  const std::string other = holder == "w1" ? "w2" : "w1";
  const std::string before = Job(id).ShortDebugString();
  EXPECT_TRUE(Eval(other, id, 999, 0.1).ok());  // below the target: it would stop the job
  EXPECT_TRUE(Checkpoint(other, id, 999).ok());
  EXPECT_TRUE(Exit(other, id, Job(id).attempt(), tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  EXPECT_TRUE(Exit(other, id, Job(id).attempt(), tally::v1::ATTEMPT_OUTCOME_FAILED).ok());
  EXPECT_EQ(Job(id).ShortDebugString(), before) << "a forged report moved the job";
  EXPECT_TRUE(base_.ListCheckpoints(id)->empty());
  EXPECT_EQ(sched_->ActiveJobView(id)->state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Used(holder), 1);
  // The holder's reports still count.
  ASSERT_TRUE(Eval(holder, id, 10, 3.0).ok());
  EXPECT_EQ(Job(id).step(), 10);
  ASSERT_TRUE(Exit(holder, id, Job(id).attempt(), tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_SUCCEEDED);
}

// A worker paused past the heartbeat timeout (SIGSTOP) loses its attempt,
// but its stream is still open and the attempt may still run there: its
// slot stays held until that attempt's exit arrives, so the requeued job is
// not placed on a slot the worker would refuse.
TEST_F(StopEdgeCasesTest, PausedWorkerKeepsItsSlotUntilTheStaleAttemptExits) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).attempt(), 1);
  clock_.Advance(absl::Seconds(11));  // past the 10 s heartbeat timeout
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Used("w0"), 1) << "the paused worker's slot was freed while it may still run there";
  // SIGCONT: it is heard from again, still busy with attempt 1.
  ASSERT_TRUE(Beat("w0").ok());
  const size_t sent = channel_.sent.size();
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED) << "placed on a busy slot";
  for (size_t i = sent; i < channel_.sent.size(); ++i) {
    EXPECT_THAT(channel_.sent[i], ::testing::Not(::testing::HasSubstr("assignment")));
  }
  // Its stale attempt reports, gets a stop order, and exits: the slot frees.
  tally::v1::WorkerMessage progress;
  progress.mutable_progress()->set_job(N(id));
  progress.mutable_progress()->set_attempt(1);
  progress.mutable_progress()->set_step(5);
  ASSERT_TRUE(sched_->OnMessage("w0", progress).ok());
  EXPECT_THAT(channel_.sent.back(), ::testing::HasSubstr("stop"));
  ASSERT_TRUE(Exit("w0", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  EXPECT_EQ(Used("w0"), 0);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
  // Reconnecting with the stale attempt still running holds its slot once,
  // not twice (one exit frees it).
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Hello("w0", 1, {{id, 2}}).ok());
  EXPECT_EQ(Used("w0"), 1);
  ASSERT_TRUE(Exit("w0", id, 2, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  EXPECT_EQ(Used("w0"), 0);
}

// A worker that refuses an assignment before starting it (its slot still
// busy, or it is shutting down) says so; the attempt does not count.
TEST_F(StopEdgeCasesTest, AnAssignmentRefusedBeforeStartingDoesNotCount) {
  tally::v1::JobSpec s = Spec();
  s.set_max_attempts(1);
  const int64_t id = Submit(s);
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  tally::v1::WorkerMessage m;
  m.mutable_exit()->set_job(N(id));
  m.mutable_exit()->set_attempt(1);
  m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
  m.mutable_exit()->set_retryable(true);
  m.mutable_exit()->set_not_started(true);
  m.mutable_exit()->set_reason("worker has no free slot");
  ASSERT_TRUE(sched_->OnMessage("w0", m).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED) << Job(id).state_reason();
  EXPECT_EQ(Job(id).attempts_not_counted(), 1);
  EXPECT_THAT(Job(id).state_reason(), ::testing::HasSubstr("not counted"));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).attempt(), 2);
  // A real failure of the one counted attempt ends it.
  ASSERT_TRUE(Exit("w0", id, 2, tally::v1::ATTEMPT_OUTCOME_FAILED).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_FAILED);
}

// A resume that fails on a damaged checkpoint falls back to the newest
// intact recorded one, says so, and does not count; with none left the next
// attempt starts over and counts. A worker cannot strike out a checkpoint
// it did not resume from.
TEST_F(StopEdgeCasesTest, ADamagedCheckpointFallsBackToTheNewestIntactOne) {
  const int64_t id = Submit(Spec());  // max_attempts 3
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Checkpoint("w0", id, 10).ok());
  ASSERT_TRUE(Checkpoint("w0", id, 20).ok());
  const std::string path10 = base_.ListCheckpoints(id)->at(0).path();
  const std::string path20 = base_.ListCheckpoints(id)->at(1).path();
  ASSERT_TRUE(FailRetryable("w0", id, 1).ok());  // counted: 1
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).attempt(), 2);
  EXPECT_THAT(channel_.sent.back(), ::testing::HasSubstr(path20));
  auto damaged = [&](int attempt, const std::string& path) {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job(N(id));
    m.mutable_exit()->set_attempt(attempt);
    m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
    m.mutable_exit()->set_retryable(true);
    m.mutable_exit()->set_reason("checkpoint: SHA-256 differs from the recorded one");
    m.mutable_exit()->set_damaged_checkpoint(path);
    return sched_->OnMessage("w0", m);
  };
  ASSERT_TRUE(damaged(2, path20).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).attempts_not_counted(), 1);
  ASSERT_EQ(Job(id).damaged_checkpoints_size(), 1);
  EXPECT_EQ(Job(id).damaged_checkpoints(0).step(), 20);
  auto events = base_.ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok());
  bool said = false;
  for (const auto& e : *events) {
    if (e.type() == "checkpoint_damaged") {
      said = true;
      EXPECT_THAT(e.reason(), ::testing::HasSubstr("step 20"));
      EXPECT_THAT(e.detail(), ::testing::HasSubstr("resumes from step 10"));
    }
  }
  EXPECT_TRUE(said) << "no checkpoint_damaged event";
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).attempt(), 3);
  EXPECT_THAT(channel_.sent.back(), ::testing::HasSubstr(path10));
  EXPECT_THAT(channel_.sent.back(), ::testing::Not(::testing::HasSubstr(path20)));
  // A claim about a checkpoint it was not told to resume from is a plain
  // failure: counted, nothing struck out.
  ASSERT_TRUE(damaged(3, path20).ok());
  EXPECT_EQ(Job(id).damaged_checkpoints_size(), 1);
  EXPECT_EQ(Job(id).attempts_not_counted(), 1);
  EXPECT_EQ(MetricValues(*registries_.back())
                ["tally_worker_reports_refused_total,kind=damaged_checkpoint"], 1);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).attempt(), 4);  // attempt 3 of 3 counted
  EXPECT_THAT(channel_.sent.back(), ::testing::HasSubstr(path10));
  // The last intact one is damaged too: nothing left, so it counts, and with
  // no attempts left the job fails.
  ASSERT_TRUE(damaged(4, path10).ok());
  EXPECT_EQ(Job(id).damaged_checkpoints_size(), 2);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_FAILED);
}

// With no intact checkpoint left the next attempt starts from step 0.
TEST_F(StopEdgeCasesTest, WithNoIntactCheckpointTheNextAttemptStartsOver) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Checkpoint("w0", id, 10).ok());
  const std::string path10 = base_.ListCheckpoints(id)->at(0).path();
  ASSERT_TRUE(FailRetryable("w0", id, 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  tally::v1::WorkerMessage m;
  m.mutable_exit()->set_job(N(id));
  m.mutable_exit()->set_attempt(2);
  m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
  m.mutable_exit()->set_reason("checkpoint: truncated");
  m.mutable_exit()->set_damaged_checkpoint(path10);
  ASSERT_TRUE(sched_->OnMessage("w0", m).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).attempts_not_counted(), 0);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).attempt(), 3);
  EXPECT_THAT(channel_.sent.back(), ::testing::HasSubstr("assignment"));
  EXPECT_THAT(channel_.sent.back(), ::testing::Not(::testing::HasSubstr("resume_from")));
}

// A higher-priority gang is not starved by a stream of small jobs: the
// slots that free up are kept for it, and it starts once its last one does.
TEST_F(StopEdgeCasesTest, AWaitingGangIsNotStarvedBySmallJobs) {
  ASSERT_TRUE(Hello("w0", 1).ok());
  ASSERT_TRUE(Hello("w1", 1).ok());
  std::vector<int64_t> small;
  for (int i = 0; i < 2; ++i) small.push_back(Submit(Spec()));
  ASSERT_TRUE(sched_->Tick().ok());  // both workers busy
  tally::v1::JobSpec g = Spec(2);
  g.set_priority(5);
  const int64_t gang = Submit(g);
  for (int i = 0; i < 5; ++i) small.push_back(Submit(Spec()));  // submitted after it
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(gang).state(), tally::v1::JOB_STATE_QUEUED);
  // The first small job ends: its slot is kept for the gang.
  ASSERT_TRUE(Exit(Job(small[0]).worker_ids(0), small[0], 1,
                   tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  for (size_t i = 2; i < small.size(); ++i) {
    EXPECT_EQ(Job(small[i]).state(), tally::v1::JOB_STATE_QUEUED)
        << "a later small job took the slot the gang waits for";
  }
  // The second ends: the gang starts on both.
  ASSERT_TRUE(Exit(Job(small[1]).worker_ids(0), small[1], 1,
                   tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(gang).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(gang).worker_ids_size(), 2);
}

}  // namespace
}  // namespace tally::sched
