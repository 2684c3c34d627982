// Preemption in the scheduler, on a fake clock and the in-memory store: a
// worker's notice, priority preemption, spot capacity, and what a hostile
// worker may say about them.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/memory_job_store.h"

namespace tally::sched {
namespace {

using ::testing::HasSubstr;
using tally::v1::ControllerMessage;
using tally::v1::JobState;

class PreemptionTest : public ::testing::Test {
 protected:
  PreemptionTest() {
    options_.prices.usd_per_gpu_hour["cpu"] = 3.6;  // $0.001 per GPU-second
    options_.prices.spot_usd_per_gpu_hour["cpu"] = 1.8;
    options_.min_runtime_before_preemption = absl::Minutes(10);
    // Fake time jumps by minutes: workers stay live across them.
    options_.heartbeat_timeout = absl::Hours(24);
    NewScheduler();
  }
  void NewScheduler() {
    registry_ = std::make_unique<metrics::Registry>();
    sched_ = std::make_unique<Scheduler>(&store_, &channel_, &clock_, registry_.get(), options_);
    ASSERT_TRUE(sched_->Recover().ok());
  }
  void Hello(const std::string& w, const std::string& capacity = "", int slots = 1) {
    tally::v1::Hello h;
    h.set_worker_id(w);
    h.set_gpu_type("cpu");
    h.set_slots(slots);
    h.set_capacity(capacity);
    ASSERT_TRUE(sched_->OnHello(h).ok());
  }
  int64_t Submit(tally::v1::JobSpec spec) {
    auto job = sched_->Submit(spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? std::stoll(job->name().substr(5)) : 0;
  }
  tally::v1::JobSpec Spec(int priority = 0, int gpus = 1) {
    tally::v1::JobSpec s = TinySpec(gpus);
    s.set_priority(priority);
    return s;
  }
  tally::v1::Job Job(int64_t id) { return store_.GetJob(id)->job(); }
  std::string Name(int64_t id) { return "jobs/" + std::to_string(id); }
  absl::Status Send(const std::string& w, const tally::v1::WorkerMessage& m) {
    return sched_->OnMessage(w, m);
  }
  void Progress(const std::string& w, int64_t id, int64_t step) {
    tally::v1::WorkerMessage m;
    m.mutable_progress()->set_job(Name(id));
    m.mutable_progress()->set_attempt(Job(id).attempt());
    m.mutable_progress()->set_step(step);
    m.mutable_progress()->set_trained(true);
    ASSERT_TRUE(Send(w, m).ok());
  }
  void Checkpoint(const std::string& w, int64_t id, int64_t step) {
    tally::v1::WorkerMessage m;
    m.mutable_checkpoint()->set_job(Name(id));
    m.mutable_checkpoint()->set_attempt(Job(id).attempt());
    m.mutable_checkpoint()->set_step(step);
    m.mutable_checkpoint()->set_tokens(step * 10);
    m.mutable_checkpoint()->set_path(CheckpointPath("jobs/" + std::to_string(id), step));
    ASSERT_TRUE(Send(w, m).ok());
  }
  absl::Status Exit(const std::string& w, int64_t id, tally::v1::AttemptOutcome outcome,
                    int64_t step, const std::string& cause = "", int rank = 0) {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_retryable(true);
    m.mutable_exit()->set_job(Name(id));
    m.mutable_exit()->set_attempt(Job(id).attempt());
    m.mutable_exit()->set_outcome(outcome);
    m.mutable_exit()->set_step(step);
    m.mutable_exit()->set_reason("exit");
    m.mutable_exit()->set_preemption_cause(cause);
    m.mutable_exit()->set_rank(rank);
    return Send(w, m);
  }
  absl::Status Notice(const std::string& w, const std::string& cause = "sigterm") {
    tally::v1::WorkerMessage m;
    m.mutable_notice()->set_cause(cause);
    m.mutable_notice()->set_deadline_seconds(25);
    return Send(w, m);
  }
  std::vector<std::string> EventTypes(int64_t id) {
    std::vector<std::string> out;
    auto events = store_.ListEvents(id, 0, 1000);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return out;
    for (const auto& e : *events) out.push_back(e.type());
    return out;
  }
  double Metric(const std::string& key) { return MetricValues(*registry_)[key]; }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  RecordingChannel channel_;
  SchedulerOptions options_;
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(PreemptionTest, NoticeCheckpointRequeuesWithoutCountingAnAttemptOrRedoing) {
  tally::v1::JobSpec spec = Spec();
  spec.set_max_attempts(1);  // a preemption must not use it up
  const int64_t id = Submit(spec);
  Hello("w0");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(10));
  Progress("w0", id, 40);
  Checkpoint("w0", id, 40);
  clock_.Advance(absl::Seconds(10));
  Progress("w0", id, 77);
  ASSERT_TRUE(Notice("w0").ok());
  EXPECT_THAT(EventTypes(id), testing::Contains("notice"));
  // The notice checkpoint of the step it stopped at lands before the exit.
  Checkpoint("w0", id, 77);
  const double lost_before = Job(id).cost().lost_usd();
  ASSERT_TRUE(Exit("w0", id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 77, "sigterm").ok());
  tally::v1::Job j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(j.state_reason(), HasSubstr("preempted (sigterm)"));
  EXPECT_EQ(j.preemption().count(), 1);
  EXPECT_EQ(j.preemption().by_notice(), 1);
  EXPECT_EQ(j.cost().redone_usd(), 0) << "the notice checkpoint landed: nothing is redone";
  EXPECT_EQ(j.cost().lost_usd(), lost_before);
  EXPECT_NEAR(j.cost().cost_usd(), 0.02, 1e-9) << "the 20 s it ran are paid for";
  auto attempts = store_.ListAttempts(id);
  ASSERT_TRUE(attempts.ok());
  EXPECT_EQ(attempts->back().state(), store::ATTEMPT_STATE_PREEMPTED);
  EXPECT_EQ(attempts->back().preemption_cause(), "sigterm");
  EXPECT_EQ(Metric("tally_preemptions_total,cause=sigterm,gpu_type=cpu"), 1);
  EXPECT_EQ(Metric("tally_attempts_ended_total,outcome=preempted"), 1);
  EXPECT_EQ(Metric("tally_cost_redone_dollars_total,gpu_type=cpu"), 0);

  // The draining worker gets nothing new; a fresh worker resumes the job
  // from the notice checkpoint, and its attempts left are untouched.
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  Hello("w1");
  channel_.assignments.clear();
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(channel_.assignments.size(), 1u);
  EXPECT_EQ(channel_.assignments[0].first, "w1");
  EXPECT_EQ(channel_.assignments[0].second.resume_from().step(), 77);
  EXPECT_EQ(Job(id).attempt(), 2);
  // A failure now is its first counted attempt: with max_attempts 1, it fails.
  ASSERT_TRUE(Exit("w1", id, tally::v1::ATTEMPT_OUTCOME_FAILED, 80).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_FAILED);
  EXPECT_THAT(Job(id).state_reason(), HasSubstr("attempt 1 of 1"));
}

TEST_F(PreemptionTest, WithoutTheNoticeCheckpointTheSpendSinceTheLastOneIsRedoneNotLost) {
  const int64_t id = Submit(Spec());
  Hello("w0");
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Seconds(10));
  Progress("w0", id, 40);
  Checkpoint("w0", id, 40);
  clock_.Advance(absl::Seconds(30));
  Progress("w0", id, 90);
  // The deadline passed before the checkpoint: the worker says so; its exit
  // knows no step, the latest report does.
  ASSERT_TRUE(Exit("w0", id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 0, "notice_file").ok());
  tally::v1::Job j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_NEAR(j.cost().redone_usd(), 0.03, 1e-9);
  EXPECT_EQ(j.cost().lost_usd(), 0);
  EXPECT_NEAR(Metric("tally_cost_redone_dollars_total,gpu_type=cpu"), 0.03, 1e-9);
  EXPECT_EQ(Metric("tally_preemptions_total,cause=notice_file,gpu_type=cpu"), 1);
  auto events = store_.ListEvents(id, 0, 1000);
  ASSERT_TRUE(events.ok());
  EXPECT_THAT(events->back().detail(), HasSubstr("redone: steps 41-90"));
}

TEST_F(PreemptionTest, PastMaxPreemptionsTheJobFails) {
  tally::v1::JobSpec spec = Spec();
  spec.set_max_preemptions(2);
  const int64_t id = Submit(spec);
  for (int i = 0; i < 3; ++i) {
    const std::string w = "w" + std::to_string(i);
    Hello(w);
    ASSERT_TRUE(sched_->Tick().ok());
    ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING) << i;
    ASSERT_TRUE(Notice(w).ok());
    ASSERT_TRUE(Exit(w, id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 0, "sigterm").ok());
  }
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_FAILED);
  EXPECT_THAT(Job(id).state_reason(), HasSubstr("preempted 3 times (max_preemptions 2)"));
}

TEST_F(PreemptionTest, AGangRequeuesOnRankZerosExit) {
  const int64_t id = Submit(Spec(0, 2));
  Hello("w0");
  Hello("w1");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  const auto workers = Job(id).worker_ids();
  // Rank 1's worker got the notice; rank 1 exits first, rank 0 (which got
  // no notice: no cause) checkpoints, then exits.
  ASSERT_TRUE(Notice(workers[1]).ok());
  ASSERT_TRUE(Exit(workers[1], id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 5, "sigterm", 1).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING) << "rank 0 reports the checkpoint";
  Checkpoint(workers[0], id, 5);
  ASSERT_TRUE(Exit(workers[0], id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 5, "", 0).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).preemption().by_notice(), 1);
  EXPECT_EQ(Metric("tally_preemptions_total,cause=sigterm,gpu_type=cpu"), 1)
      << "the cause comes from the draining worker of the gang";
}

TEST_F(PreemptionTest, APreemptedGangResumesAtTheWorldSizeItCanGet) {
  tally::v1::JobSpec spec = Spec(0, 2);
  spec.mutable_data()->set_seq_len(64);
  spec.mutable_training()->set_micro_batch_rows(2);
  spec.mutable_training()->set_global_batch_tokens(4 * 64 * 2);  // 4 micro-batches a step
  const int64_t id = Submit(spec);
  Hello("w0");
  Hello("w1");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).cost().attempt_gpus(), 2);
  const auto workers = Job(id).worker_ids();
  ASSERT_TRUE(Notice(workers[1]).ok());
  ASSERT_TRUE(Exit(workers[1], id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 5, "sigterm", 1).ok());
  Checkpoint(workers[0], id, 5);
  ASSERT_TRUE(Exit(workers[0], id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 5, "", 0).ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  // One worker is left (the other is going away): the job resumes on it
  // alone rather than wait for a second slot.
  channel_.assignments.clear();
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(channel_.assignments.size(), 1u);
  EXPECT_EQ(channel_.assignments[0].first, workers[0]);
  EXPECT_EQ(channel_.assignments[0].second.world_size(), 1);
  EXPECT_EQ(channel_.assignments[0].second.resume_from().step(), 5);
  EXPECT_EQ(Job(id).cost().attempt_gpus(), 1);
  const double before = Job(id).cost().gpu_seconds();
  clock_.Advance(absl::Seconds(10));
  Checkpoint(workers[0], id, 6);
  EXPECT_NEAR(Job(id).cost().gpu_seconds() - before, 10, 1e-9) << "one GPU, not two";
  // A job never preempted waits for all its ranks.
  const int64_t whole = Submit(spec);
  Hello("w2");
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(whole).state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(PreemptionTest, AWorkerLostAfterItsNoticeIsAPreemptionNotAFailure) {
  options_.heartbeat_timeout = absl::Seconds(10);
  NewScheduler();
  tally::v1::JobSpec spec = Spec();
  spec.set_max_attempts(1);
  const int64_t id = Submit(spec);
  Hello("w0");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Notice("w0", "notice_file").ok());
  // The spot VM is reclaimed before the exit is delivered.
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).preemption().by_notice(), 1);
  EXPECT_THAT(Job(id).state_reason(), HasSubstr("going away"));
  // It comes back as a new process under the same id, with nothing running,
  // after its next attempt's notice: preempted again, still no failure.
  Hello("w1");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Notice("w1", "sigterm").ok());
  Hello("w1");
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).preemption().by_notice(), 2);
  EXPECT_EQ(Metric("tally_preemptions_total,cause=sigterm,gpu_type=cpu"), 1);
}

TEST_F(PreemptionTest, OnlyTheWorkerGivenRankZeroEndsAGangsAttempt) {
  const int64_t id = Submit(Spec(0, 2));
  Hello("w0");
  Hello("w1");
  ASSERT_TRUE(sched_->Tick().ok());
  const auto workers = Job(id).worker_ids();
  // Rank 1's worker claims rank 0 (e.g. answering a preempt order for a
  // rank it no longer runs): not taken as the gang's end.
  ASSERT_TRUE(Exit(workers[1], id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 0, "priority", 0).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Exit(workers[0], id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 0, "sigterm", 0).ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(PreemptionTest, TheFreedSlotsStayTheWaitingJobsUntilEveryVictimRankHasLeft) {
  Hello("w0");
  Hello("w1");
  tally::v1::JobSpec gang = Spec(0, 2);
  gang.mutable_training()->set_micro_batch_rows(2);
  gang.mutable_training()->set_global_batch_tokens(4 * 64 * 2);  // may resume on 1 rank
  const int64_t victim = Submit(gang);
  ASSERT_TRUE(sched_->Tick().ok());
  const auto workers = Job(victim).worker_ids();
  clock_.Advance(absl::Minutes(11));
  const int64_t high = Submit(Spec(10, 2));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(victim).preemption().pending_for(), Name(high));
  // Rank 0 checkpoints and exits first: the victim requeues, but rank 1
  // still holds its slot. The victim (free to resume on one rank) must not
  // take the slot rank 0 freed: it is the waiting job's.
  Checkpoint(workers[0], victim, 7);
  ASSERT_TRUE(Exit(workers[0], victim, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 7, "priority", 0).ok());
  ASSERT_EQ(Job(victim).state(), tally::v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(victim).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(high).state(), tally::v1::JOB_STATE_QUEUED);
  // Rank 1 leaves: the waiting job takes both slots.
  ASSERT_TRUE(Exit(workers[1], victim, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 7, "priority", 1).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(high).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(victim).state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(PreemptionTest, AHigherPriorityJobPreemptsTheLowerOneOnAFullFleet) {
  Hello("w0");
  const int64_t low = Submit(Spec(0));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(low).state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Minutes(5));
  const int64_t high = Submit(Spec(10));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_TRUE(channel_.stops.empty()) << "an attempt younger than the minimum runtime is kept";
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_RUNNING);

  clock_.Advance(absl::Minutes(6));
  Progress("w0", low, 100);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(channel_.stops.size(), 1u);
  EXPECT_TRUE(channel_.stops[0].preempt());
  EXPECT_TRUE(channel_.stops[0].checkpoint());
  EXPECT_EQ(Job(low).preemption().pending_for(), Name(high));
  EXPECT_THAT(EventTypes(low), testing::Contains("preempting"));
  // While it stops, a newcomer of lower priority than the waiting job does
  // not take the slot, and no second preemption is ordered.
  Hello("w9");  // another worker joins: the newcomer may run there, not on w0
  const int64_t other = Submit(Spec(5));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(high).state(), tally::v1::JOB_STATE_RUNNING) << "w9 is free: high starts there";
  EXPECT_EQ(Job(other).state(), tally::v1::JOB_STATE_QUEUED);

  // The victim checkpoints and exits; it requeues, remembering who
  // preempted it, and the waiting job of priority 5 takes the freed slot.
  Checkpoint("w0", low, 100);
  ASSERT_TRUE(Exit("w0", low, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 100, "priority").ok());
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(low).preemption().by_priority(), 1);
  EXPECT_THAT(Job(low).preemption().preempted_by(), testing::ElementsAre(Name(high)));
  EXPECT_TRUE(Job(low).preemption().pending_for().empty());
  EXPECT_EQ(Metric("tally_preemptions_total,cause=priority,gpu_type=cpu"), 1);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(other).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(PreemptionTest, PreemptionStaysInsideATenantByDefault) {
  Hello("w0");
  auto low = sched_->Submit(Spec(0), "", Actor{"bob", "dev"});
  ASSERT_TRUE(low.ok()) << low.status();
  const int64_t low_id = std::stoll(low->name().substr(5));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(low_id).state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Minutes(11));
  auto high = sched_->Submit(Spec(100), "", Actor{"alice", "research"});
  ASSERT_TRUE(high.ok()) << high.status();
  Progress("w0", low_id, 10);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_TRUE(channel_.stops.empty()) << "another tenant's attempt is not a candidate";
  EXPECT_EQ(Job(std::stoll(high->name().substr(5))).state(), tally::v1::JOB_STATE_QUEUED);
  // A job of its own tenant may preempt it.
  auto own = sched_->Submit(Spec(50), "", Actor{"carol", "dev"});
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(channel_.stops.size(), 1u);
  EXPECT_EQ(Job(low_id).preemption().pending_for(), own->name());
}

TEST_F(PreemptionTest, CrossTenantPreemptionWhenAllowedDoesNotNameThePreemptor) {
  options_.cross_tenant_preemption = true;
  NewScheduler();
  Hello("w0");
  auto low = sched_->Submit(Spec(0), "", Actor{"bob", "dev"});
  ASSERT_TRUE(low.ok()) << low.status();
  const int64_t low_id = std::stoll(low->name().substr(5));
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Minutes(11));
  auto high = sched_->Submit(Spec(100), "", Actor{"alice", "research"});
  ASSERT_TRUE(high.ok()) << high.status();
  Progress("w0", low_id, 10);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(channel_.stops.size(), 1u);
  EXPECT_TRUE(channel_.stops[0].preempt());
  EXPECT_THAT(channel_.stops[0].reason(), testing::Not(HasSubstr(high->name())));
  auto events = store_.ListEvents(low_id, 0, 1000);
  ASSERT_TRUE(events.ok());
  bool preempting = false;
  for (const auto& e : *events) {
    if (e.type() != "preempting") continue;
    preempting = true;
    EXPECT_EQ(e.reason(), "preempted for a higher-priority job (priority 100 > 0)");
    EXPECT_THAT(e.detail(), testing::Not(HasSubstr(high->name())));
  }
  EXPECT_TRUE(preempting);
}

TEST_F(PreemptionTest, AHoldOnAJobBeingPreemptedForPriorityLeavesThatPreemption) {
  Hello("w0");
  const int64_t low = Submit(Spec(0));
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Minutes(11));
  const int64_t high = Submit(Spec(10));
  Progress("w0", low, 100);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(low).preemption().pending_for(), Name(high));
  const size_t stops = channel_.stops.size();
  // An experiment holds it meanwhile: the priority preemption stands (no
  // second stop order, the same claimant), and the hold keeps it queued.
  ASSERT_TRUE(sched_->HoldJob(low, "experiments/3", "held at rung 1").ok());
  EXPECT_EQ(Job(low).preemption().pending_for(), Name(high));
  EXPECT_EQ(channel_.stops.size(), stops);
  EXPECT_EQ(Job(low).hold(), "held at rung 1");
  Checkpoint("w0", low, 100);
  ASSERT_TRUE(Exit("w0", low, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 100, "priority").ok());
  EXPECT_EQ(Job(low).preemption().by_priority(), 1);
  EXPECT_EQ(Job(low).preemption().by_experiment(), 0);
  EXPECT_THAT(Job(low).preemption().preempted_by(), testing::ElementsAre(Name(high)));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(sched_->Cancel(high, "done").ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_QUEUED) << "held: the free slot stays free";
}

TEST_F(PreemptionTest, ThePreemptorStartsOnTheFreedSlot) {
  Hello("w0");
  const int64_t low = Submit(Spec(-5));
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Minutes(11));
  const int64_t high = Submit(Spec(3));
  const int64_t lower = Submit(Spec(-10));  // waits behind both
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(low).preemption().pending_for(), Name(high));
  // A worker that obeys the order without a preemption outcome (STOPPED)
  // is preempted all the same.
  ASSERT_TRUE(Exit("w0", low, tally::v1::ATTEMPT_OUTCOME_STOPPED, 0).ok());
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(low).preemption().by_priority(), 1);
  channel_.assignments.clear();
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(high).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(lower).state(), tally::v1::JOB_STATE_QUEUED);
  ASSERT_EQ(channel_.assignments.size(), 1u);
  EXPECT_EQ(channel_.assignments[0].first, "w0");
  // The preempted job never preempts its preemptor back (and its priority
  // is lower anyway): nothing is stopped however long high runs.
  channel_.stops.clear();
  clock_.Advance(absl::Hours(1));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_TRUE(channel_.stops.empty());
}

TEST_F(PreemptionTest, EqualPriorityNeverPreempts) {
  Hello("w0");
  const int64_t a = Submit(Spec(1));
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Hours(2));
  const int64_t b = Submit(Spec(1));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_TRUE(channel_.stops.empty());
  EXPECT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(b).state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(PreemptionTest, PriorityPreemptionCanBeTurnedOff) {
  options_.priority_preemption = false;
  NewScheduler();
  Hello("w0");
  const int64_t low = Submit(Spec(0));
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Hours(1));
  Submit(Spec(10));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_TRUE(channel_.stops.empty());
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_RUNNING);
}

TEST_F(PreemptionTest, AVictimThatNeverConfirmsIsPreemptedAtTheGraceAndKeepsItsSlotUntilItExits) {
  Hello("w0");
  const int64_t low = Submit(Spec(0));
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Minutes(11));
  Progress("w0", low, 50);
  const int64_t high = Submit(Spec(9));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_FALSE(Job(low).preemption().pending_for().empty());
  // The worker keeps heartbeating but never exits.
  for (int i = 0; i < 13; ++i) {
    clock_.Advance(absl::Seconds(10));
    tally::v1::WorkerMessage beat;
    beat.mutable_heartbeat();
    ASSERT_TRUE(Send("w0", beat).ok());
    ASSERT_TRUE(sched_->Tick().ok());
  }
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Job(low).state_reason(), HasSubstr("did not confirm"));
  EXPECT_GT(Job(low).cost().redone_usd(), 0) << "no checkpoint of step 50 was recorded";
  EXPECT_EQ(Job(high).state(), tally::v1::JOB_STATE_QUEUED) << "w0 is still busy with it";
  ASSERT_TRUE(Exit("w0", low, tally::v1::ATTEMPT_OUTCOME_STOPPED, 50).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(high).state(), tally::v1::JOB_STATE_RUNNING);
}

TEST_F(PreemptionTest, APendingPreemptionSurvivesARestartAndIsAskedAgain) {
  Hello("w0");
  const int64_t low = Submit(Spec(0));
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Minutes(11));
  Submit(Spec(9));
  ASSERT_TRUE(sched_->Tick().ok());
  NewScheduler();
  channel_.stops.clear();
  tally::v1::Hello h;
  h.set_worker_id("w0");
  h.set_gpu_type("cpu");
  h.set_slots(1);
  auto* r = h.add_running();
  r->set_job(Name(low));
  r->set_attempt(1);
  ASSERT_TRUE(sched_->OnHello(h).ok());
  ASSERT_EQ(channel_.stops.size(), 1u);
  EXPECT_TRUE(channel_.stops[0].preempt());
  ASSERT_TRUE(Exit("w0", low, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 0, "priority").ok());
  EXPECT_EQ(Job(low).state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(PreemptionTest, SpotCapacityIsMatchedAndPricedAtTheSpotPrice) {
  Hello("spot0", "spot");
  tally::v1::JobSpec on_demand = Spec();
  on_demand.mutable_resources()->set_capacity("on_demand");
  const int64_t od = Submit(on_demand);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(od).state(), tally::v1::JOB_STATE_QUEUED) << "an on-demand job avoids spot";
  const int64_t any = Submit(Spec());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(any).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(any).cost().spot_gpus(), 1);
  clock_.Advance(absl::Seconds(100));
  Progress("spot0", any, 10);
  // Progress is measured, not committed: a checkpoint commits the cost.
  Checkpoint("spot0", any, 10);
  EXPECT_NEAR(Job(any).cost().cost_usd(), 0.05, 1e-9) << "100 s at $1.80/h";
  EXPECT_NEAR(Job(any).cost().spot_gpu_seconds(), 100, 1e-9);
  EXPECT_NEAR(Job(any).cost().usd_per_gpu_hour(), 1.8, 1e-9);
  Hello("od0", "on_demand");
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(od).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(od).cost().spot_gpus(), 0);
  auto workers = sched_->Workers();
  for (const auto& w : workers) {
    EXPECT_EQ(w.record.capacity(), w.record.worker_id() == "spot0" ? "spot" : "on_demand");
  }
}

TEST_F(PreemptionTest, HostileReportsAreRefusedNamingTheField) {
  tally::v1::Hello h;
  h.set_worker_id("w0");
  h.set_gpu_type("cpu");
  h.set_slots(1);
  h.set_capacity("cheap");
  absl::StatusOr<int64_t> refused = sched_->OnHello(h);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("hello.capacity"));
  Hello("w0");
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->Tick().ok());
  absl::Status s = Notice("w0", "because");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("notice.cause"));
  tally::v1::WorkerMessage m;
  m.mutable_notice()->set_cause("sigterm");
  m.mutable_notice()->set_deadline_seconds(-1);
  EXPECT_THAT(Send("w0", m).message(), HasSubstr("notice.deadline_seconds"));
  s = Exit("w0", id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 0, "a{b=\"c\"}");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("exit.preemption_cause"));
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING) << "nothing moved";
  // A PREEMPTED exit from a worker that does not run the attempt moves nothing.
  Hello("w1");
  ASSERT_TRUE(Exit("w1", id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, 0, "sigterm").ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).preemption().count(), 0);
}

}  // namespace
}  // namespace tally::sched
