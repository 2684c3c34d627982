// The plans on their own: a job, a context and its checkpoints in, a plan
// out. No store, no clock, no scheduler.
#include "server/sched/plans.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/proto_time.h"
#include "gtest/gtest.h"
#include "server/sched/scheduler_test_util.h"

namespace tally::sched {
namespace {

tally::v1::Checkpoint Ck(int64_t step, double val_loss = 0) {
  tally::v1::Checkpoint c;
  c.set_job("jobs/7");
  c.set_step(step);
  c.set_val_loss(val_loss);
  c.set_path(CheckpointPath("jobs/7", step));
  return c;
}

// A job, two workers (w2 announces a rendezvous) and prices of $0.001 a
// second, at a fixed time.
struct PlanWorld {
  PlanWorld() : ledger_(Prices()), workers_(absl::Seconds(10)) {
    ctx_.now = absl::FromUnixSeconds(1'000'000);
    ctx_.stop_grace = absl::Seconds(30);
    ctx_.ledger = &ledger_;
    ctx_.workers = &workers_;
    for (const char* id : {"w1", "w2"}) {
      WorkerState& w = workers_.Add(id);
      w.rec.set_worker_id(id);
      w.rec.set_gpu_type("cpu");
      w.rec.set_slots(2);
      w.connected = true;
      w.last_seen = ctx_.now;
    }
    // Only w2 announces a rendezvous: it leads gangs.
    workers_.Find("w2")->rec.set_rendezvous_host("10.0.0.2");
    workers_.Find("w2")->rec.set_rendezvous_port(29500);
    job_.rec.set_id(7);
    tally::v1::Job& j = *job_.rec.mutable_job();
    j.set_name("jobs/7");
    *j.mutable_spec() = TinySpec();
    j.mutable_spec()->set_max_attempts(3);
    j.set_state(tally::v1::JOB_STATE_QUEUED);
    job_.queued_since = ctx_.now - absl::Seconds(12);
  }
  static ledger::PriceTable Prices() {
    ledger::PriceTable p;
    p.usd_per_gpu_hour["cpu"] = 3.6;  // $0.001 a second
    return p;
  }
  // The job running attempt `attempt` on w1 since `ran` ago.
  void Running(int32_t attempt, absl::Duration ran) {
    tally::v1::Job& j = *job_.rec.mutable_job();
    j.set_state(tally::v1::JOB_STATE_RUNNING);
    j.set_attempt(attempt);
    *j.mutable_cost()->mutable_accrued_until() = ToProto(ctx_.now - ran);
    j.mutable_cost()->set_attempt_gpus(1);
    store::AttemptRecord& a = job_.attempt.emplace();
    a.set_job_id(7);
    a.set_attempt(attempt);
    a.add_worker_ids("w1");
    a.set_state(store::ATTEMPT_STATE_RUNNING);
    workers_.Hold("w1", {7, attempt}, 1);
  }

  ledger::CostLedger ledger_;
  WorkerRegistry workers_;
  PlanContext ctx_;
  ActiveJob job_;
};

class PlansTest : public ::testing::Test, public PlanWorld {};

TEST_F(PlansTest, AStartResumesFromTheNewestIntactCheckpointAndAGangIsLedByARendezvousHost) {
  tally::v1::DamagedCheckpoint* d = job_.rec.mutable_job()->add_damaged_checkpoints();
  d->set_path(CheckpointPath("jobs/7", 20));
  const Checkpoints cks = {Ck(10), Ck(20)};
  Plan p = PlanStart(ctx_, job_, cks, {"w1", "w2"}, {"10.0.0.2:29500"});

  EXPECT_EQ(p.rec.job().state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(p.rec.job().attempt(), 1);
  ASSERT_TRUE(p.attempt.has_value());
  EXPECT_EQ(p.attempt->resume_step(), 10);  // step 20 is damaged
  // w2 can lead: it becomes rank 0, on its first port not in use.
  EXPECT_EQ(p.attempt->worker_ids(0), "w2");
  EXPECT_EQ(p.attempt->rendezvous(), "10.0.0.2:29501");
  ASSERT_EQ(p.sends.size(), 2u);
  EXPECT_EQ(p.sends[0].first, "w2");
  EXPECT_EQ(p.sends[0].second.assignment().rank(), 0);
  EXPECT_EQ(p.sends[0].second.assignment().resume_from().step(), 10);
  EXPECT_EQ(p.hold.size(), 2u);
  EXPECT_EQ(p.queue_wait_seconds, 12);
  EXPECT_EQ(p.transitions, std::vector<tally::v1::JobState>{tally::v1::JOB_STATE_RUNNING});
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_TRUE(absl::StrContains(p.events[0].detail(), "resuming from step 10"))
      << p.events[0].detail();
}

TEST_F(PlansTest, AnEndingAttemptRequeuesUntilItsAttemptsAreSpent) {
  struct Case {
    int32_t attempt;
    bool may_retry;
    bool not_counted;
    tally::v1::JobState want;
    std::string reason_has;
  };
  const std::vector<Case> cases = {
      {1, true, false, tally::v1::JOB_STATE_QUEUED, "requeued for attempt 2 of 3"},
      {3, true, false, tally::v1::JOB_STATE_FAILED, "no attempts left (max_attempts 3)"},
      {1, false, false, tally::v1::JOB_STATE_FAILED, "attempt 1 failed: boom"},
      {3, true, true, tally::v1::JOB_STATE_QUEUED, "(not counted)"},
  };
  for (const Case& c : cases) {
    PlanWorld fresh;
    fresh.Running(c.attempt, absl::Seconds(10));
    Plan p = PlanEndAttempt(fresh.ctx_, fresh.job_, {}, store::ATTEMPT_STATE_FAILED, "boom",
                            c.may_retry, {.not_counted = c.not_counted});
    EXPECT_EQ(p.rec.job().state(), c.want) << c.reason_has;
    EXPECT_TRUE(absl::StrContains(p.rec.job().state_reason(), c.reason_has))
        << p.rec.job().state_reason();
    EXPECT_EQ(p.attempts_ended, std::vector<std::string>{"failed"});
    EXPECT_FALSE(p.keep_attempt);
    // Ten seconds at $0.001 a second, none of it kept by a checkpoint.
    EXPECT_NEAR(p.cost_added_usd, 0.01, 1e-9);
    EXPECT_NEAR(p.lost_added_usd, 0.01, 1e-9);
    EXPECT_EQ(p.attempt->state(), store::ATTEMPT_STATE_FAILED);
  }
}

TEST_F(PlansTest, AStopDecidedEarlierEndsTheJobNamingItsBestCheckpoint) {
  Running(1, absl::Seconds(5));
  tally::v1::PendingStop& ps = *job_.rec.mutable_job()->mutable_pending_stop();
  ps.set_state(tally::v1::JOB_STATE_EARLY_STOPPED);
  ps.set_type("early_stopped");
  ps.set_reason("no improvement");
  ps.set_rule("patience");
  const Checkpoints cks = {Ck(10, 2.5), Ck(20, 2.1), Ck(30, 2.4)};
  // However the attempt ends, the decision stands.
  Plan p = PlanEndAttempt(ctx_, job_, cks, store::ATTEMPT_STATE_FAILED, "boom", true);
  EXPECT_EQ(p.rec.job().state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_EQ(p.rec.job().early_stopping().best_checkpoint(), CheckpointPath("jobs/7", 20));
  EXPECT_EQ(p.early_stop_rule, "patience");
  EXPECT_FALSE(p.rec.job().has_pending_stop());
  EXPECT_TRUE(p.finished);

  Plan none = PlanFinishStop(ctx_, job_, {}, "");
  EXPECT_TRUE(absl::StrContains(none.events.back().detail(), "no checkpoint yet"));
}

TEST_F(PlansTest, APreemptionRedoesOnlyWhatItsLatestCheckpointDidNotKeep) {
  struct Case {
    Checkpoints checkpoints;
    int64_t step;
    bool redone;
  };
  const std::vector<Case> cases = {
      {{Ck(10), Ck(40)}, 40, false},  // the notice checkpoint landed
      {{Ck(10)}, 40, true},
      {{}, 40, true},
  };
  for (const Case& c : cases) {
    PlanWorld t;
    t.Running(1, absl::Seconds(20));
    Plan p = PlanPreempted(t.ctx_, t.job_, c.checkpoints, "sigterm", "spot reclaim", c.step);
    EXPECT_EQ(p.rec.job().state(), tally::v1::JOB_STATE_QUEUED);
    EXPECT_EQ(p.preemption_cause, "sigterm");
    EXPECT_EQ(p.rec.job().preemption().by_notice(), 1);
    EXPECT_TRUE(p.requeued);
    if (c.redone) {
      EXPECT_NEAR(p.redone_added_usd, 0.02, 1e-9) << c.checkpoints.size();
    } else {
      EXPECT_EQ(p.redone_added_usd, 0);
    }
  }
}

TEST_F(PlansTest, PreemptionsPastMaxPreemptionsFailTheJobButAnExperimentsHoldsDoNot) {
  Running(2, absl::Seconds(1));
  job_.rec.mutable_job()->mutable_spec()->set_max_preemptions(1);
  job_.rec.mutable_job()->mutable_preemption()->set_count(1);
  Plan p = PlanPreempted(ctx_, job_, {}, "priority", "a higher-priority job", 0);
  EXPECT_EQ(p.rec.job().state(), tally::v1::JOB_STATE_FAILED);
  Plan held = PlanPreempted(ctx_, job_, {}, "experiment", "held at a rung", 0);
  EXPECT_EQ(held.rec.job().state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(held.rec.job().preemption().by_experiment(), 1);
}

TEST_F(PlansTest, ALostAttemptIsAPreemptionWhenItsWorkerWasGoingAway) {
  Running(1, absl::Seconds(1));
  Plan lost = LoseAttempt(ctx_, job_, {}, "", "worker w1 silent");
  EXPECT_EQ(lost.attempts_ended, std::vector<std::string>{"lost"});
  EXPECT_EQ(lost.rec.job().state(), tally::v1::JOB_STATE_QUEUED);
  Plan going = LoseAttempt(ctx_, job_, {}, "sigterm", "worker w1 silent");
  EXPECT_EQ(going.attempts_ended, std::vector<std::string>{"preempted"});
  EXPECT_EQ(going.preemption_cause, "sigterm");
  EXPECT_TRUE(absl::StrContains(going.events.back().reason(), "going away"));
}

TEST_F(PlansTest, StopOrdersReachConnectedWorkersAndFreeTheSlotsOfGoneOnes) {
  Running(1, absl::Seconds(1));
  job_.attempt->add_worker_ids("w2");
  workers_.Hold("w2", {7, 1}, 1);
  workers_.Find("w2")->connected = false;
  Plan p = NewPlan(ctx_, job_);
  StopOrders(ctx_, p, "cancelled", /*checkpoint=*/false);
  ASSERT_EQ(p.sends.size(), 1u);
  EXPECT_EQ(p.sends[0].first, "w1");
  EXPECT_EQ(p.sends[0].second.stop().reason(), "cancelled");
  ASSERT_EQ(p.release.size(), 1u);
  EXPECT_EQ(p.release[0].first, "w2");
}

TEST_F(PlansTest, ASuccessEndsTheJobAndStopsTheOtherRanksOnly) {
  Running(1, absl::Seconds(1));
  job_.attempt->add_worker_ids("w2");
  Plan p = PlanSucceeded(ctx_, job_, "w1", "");
  EXPECT_EQ(p.rec.job().state(), tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(p.events.back().reason(), "completed");
  EXPECT_TRUE(p.finished);
  EXPECT_EQ(p.attempts_ended, std::vector<std::string>{"succeeded"});
  ASSERT_EQ(p.sends.size(), 1u);
  EXPECT_EQ(p.sends[0].first, "w2");
}

TEST_F(PlansTest, ADamageClaimOnlyStrikesOutTheCheckpointTheAttemptResumedFrom) {
  const Checkpoints cks = {Ck(10), Ck(20)};
  tally::v1::AttemptExit exit;
  exit.set_attempt(2);
  exit.set_reason("sha256 mismatch");
  exit.set_damaged_checkpoint(CheckpointPath("jobs/7", 10));  // not the one it resumed from
  EXPECT_FALSE(DamagedCheckpointNotes(job_, cks, exit).damaged.has_value());
  exit.set_damaged_checkpoint(CheckpointPath("jobs/7", 20));
  EndAttemptNotes notes = DamagedCheckpointNotes(job_, cks, exit);
  ASSERT_TRUE(notes.damaged.has_value());
  EXPECT_EQ(notes.damaged->step(), 20);
  ASSERT_TRUE(notes.resume_instead.has_value());
  EXPECT_EQ(notes.resume_instead->step(), 10);
  EXPECT_TRUE(notes.not_counted);
}

}  // namespace
}  // namespace tally::sched
