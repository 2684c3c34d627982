#include "server/sched/scheduler.h"

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "server/store/memory_job_store.h"
#include "server/sched/scheduler_test_util.h"

namespace tally::sched {
namespace {

using ::testing::HasSubstr;
using tally::v1::ControllerMessage;
using tally::v1::JobState;

tally::v1::JobSpec Spec(int priority = 0, const std::string& gpu = "cpu",
                        int count = 1, int max_attempts = 3) {
  tally::v1::JobSpec spec;
  spec.mutable_model()->set_num_layers(1);
  spec.mutable_model()->set_d_model(16);
  spec.mutable_model()->set_num_heads(2);
  spec.mutable_data()->set_train_path("/data/x");
  spec.mutable_data()->set_seq_len(64);
  spec.mutable_training()->set_max_steps(10);
  spec.set_priority(priority);
  spec.mutable_resources()->set_gpu_type(gpu);
  spec.mutable_resources()->set_gpu_count(count);
  spec.set_max_attempts(max_attempts);
  return spec;
}

tally::v1::Hello Hello(const std::string& id, int slots = 1,
                       const std::string& gpu = "cpu") {
  tally::v1::Hello h;
  h.set_worker_id(id);
  h.set_device("cpu");
  h.set_gpu_type(gpu);
  h.set_slots(slots);
  return h;
}

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerTest() { sched_ = NewScheduler(); }
  std::unique_ptr<Scheduler> NewScheduler() {
    registries_.push_back(std::make_unique<metrics::Registry>());
    return std::make_unique<Scheduler>(&store_, &channel_, &clock_,
                                       registries_.back().get(), options_);
  }
  int64_t Submit(tally::v1::JobSpec spec, const std::string& request_id = "") {
    auto job = sched_->Submit(std::move(spec), request_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? std::stoll(job->name().substr(5)) : 0;
  }
  JobState State(int64_t id) { return store_.GetJob(id)->job().state(); }
  tally::v1::Job Job(int64_t id) { return store_.GetJob(id)->job(); }
  void Beat(const std::string& worker) {
    tally::v1::WorkerMessage m;
    m.mutable_heartbeat();
    ASSERT_TRUE(sched_->OnMessage(worker, m).ok());
  }
  absl::Status Exit(const std::string& worker, int64_t id, int attempt,
                    tally::v1::AttemptOutcome outcome, bool retryable = true) {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job("jobs/" + std::to_string(id));
    m.mutable_exit()->set_attempt(attempt);
    m.mutable_exit()->set_outcome(outcome);
    m.mutable_exit()->set_reason("test");
    m.mutable_exit()->set_retryable(retryable);
    return sched_->OnMessage(worker, m);
  }
  // A new scheduler over the same store (a restarted tallyd), and `worker`
  // back with `job`'s `attempt` running.
  void RestartAndReadopt(const std::string& worker, const std::string& job, int attempt) {
    sched_ = NewScheduler();
    ASSERT_TRUE(sched_->Recover().ok());
    auto hello = Hello(worker);
    hello.add_running()->set_job(job);
    hello.mutable_running(0)->set_attempt(attempt);
    ASSERT_TRUE(sched_->OnHello(hello).ok());
  }
  std::vector<std::string> EventTypes(int64_t id) {
    std::vector<std::string> out;
    auto events = store_.ListEvents(id, 0, 1000);
    for (const auto& e : *events) out.push_back(e.type());
    return out;
  }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  RecordingChannel channel_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(SchedulerTest, SubmitValidatesAndQueues) {
  auto bad = Spec();
  bad.mutable_model()->set_num_layers(0);
  auto rejected = sched_->Submit(bad, "");
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(rejected.status().message()),
              HasSubstr("spec.model.num_layers"));
  EXPECT_TRUE(store_.ListJobs({})->empty()) << "nothing stored for a bad spec";

  const int64_t id = Submit(Spec());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).spec().max_attempts(), 3);
  EXPECT_EQ(sched_->QueueDepth(), 1);
}

TEST_F(SchedulerTest, RepeatedRequestIdMakesOneJob) {
  const int64_t a = Submit(Spec(), "req");
  const int64_t b = Submit(Spec(), "req");
  EXPECT_EQ(a, b);
  EXPECT_EQ(sched_->QueueDepth(), 1);
  EXPECT_EQ(store_.ListJobs({})->size(), 1u);
}

TEST_F(SchedulerTest, StartsOnAMatchingWorkerAndSucceeds) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED) << "no worker yet";

  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  EXPECT_EQ(channel_.Take("w1", ControllerMessage::kWelcome).size(), 1u);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  auto assigned = channel_.Take("w1", ControllerMessage::kAssignment);
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].assignment().attempt(), 1);
  EXPECT_EQ(assigned[0].assignment().world_size(), 1);
  EXPECT_EQ(assigned[0].assignment().spec().training().max_steps(), 10);
  EXPECT_EQ(sched_->Workers()[0].used_slots, 1);

  ASSERT_TRUE(Exit("w1", id, 1, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(Job(id).has_end_time());
  EXPECT_EQ(sched_->Workers()[0].used_slots, 0);
  EXPECT_THAT(EventTypes(id),
              ::testing::ElementsAre("submitted", "started", "succeeded"));
}

TEST_F(SchedulerTest, PriorityThenAge) {
  const int64_t old_low = Submit(Spec(0));
  clock_.Advance(absl::Seconds(1));
  const int64_t high = Submit(Spec(10));
  clock_.Advance(absl::Seconds(1));
  const int64_t new_low = Submit(Spec(0));
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(high), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(State(old_low), tally::v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(Exit("w1", high, 1, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(old_low), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(State(new_low), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(SchedulerTest, GpuTypeMustMatch) {
  const int64_t id = Submit(Spec(0, "h200"));
  ASSERT_TRUE(sched_->OnHello(Hello("w1", 8, "cpu")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(sched_->OnHello(Hello("g1", 1, "h200")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).worker_ids(0), "g1");
}

TEST_F(SchedulerTest, GangIsAllOrNothing) {
  const int64_t id = Submit(Spec(0, "h200", 2));
  ASSERT_TRUE(sched_->OnHello(Hello("g1", 1, "h200")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(channel_.Take("g1", ControllerMessage::kAssignment).empty());
  ASSERT_TRUE(sched_->OnHello(Hello("g2", 1, "h200")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  auto a1 = channel_.Take("g1", ControllerMessage::kAssignment);
  auto a2 = channel_.Take("g2", ControllerMessage::kAssignment);
  ASSERT_EQ(a1.size(), 1u);
  ASSERT_EQ(a2.size(), 1u);
  EXPECT_EQ(a1[0].assignment().rank() + a2[0].assignment().rank(), 1);
  EXPECT_EQ(a1[0].assignment().world_size(), 2);
}

TEST_F(SchedulerTest, CheckpointRecordsTheValLossOfItsStep) {
  tally::v1::JobSpec spec = Spec();
  spec.mutable_training()->set_max_steps(100);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  const std::string name = "jobs/" + std::to_string(id);
  auto eval = [&](int64_t step, double loss) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job(name);
    m.mutable_eval()->set_attempt(1);
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_val_loss(loss);
    ASSERT_TRUE(sched_->OnMessage("w1", m).ok());
  };
  auto checkpoint = [&](int64_t step) {
    tally::v1::WorkerMessage m;
    m.mutable_checkpoint()->set_job(name);
    m.mutable_checkpoint()->set_attempt(1);
    m.mutable_checkpoint()->set_step(step);
    m.mutable_checkpoint()->set_path(CheckpointPath(name, step));
    const absl::Status s = sched_->OnMessage("w1", m);
    ASSERT_TRUE(s.ok()) << s;
  };
  eval(10, 3.5);
  checkpoint(10);
  checkpoint(15);  // no eval at step 15: no val_loss claimed
  auto cks = *store_.ListCheckpoints(id);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_DOUBLE_EQ(cks[0].val_loss(), 3.5);
  EXPECT_EQ(cks[1].val_loss(), 0);
}

TEST_F(SchedulerTest, HeartbeatLossRequeuesThenFailsAfterMaxAttempts) {
  const int64_t id = Submit(Spec(0, "cpu", 1, /*max_attempts=*/2));
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);

  // A checkpoint, so the next attempt resumes from it.
  tally::v1::WorkerMessage ck;
  ck.mutable_checkpoint()->set_job("jobs/" + std::to_string(id));
  ck.mutable_checkpoint()->set_attempt(1);
  ck.mutable_checkpoint()->set_step(5);
  ck.mutable_checkpoint()->set_path(CheckpointPath("jobs/" + std::to_string(id), 5));
  ASSERT_TRUE(sched_->OnMessage("w1", ck).ok());

  // Heartbeats within the timeout keep it.
  clock_.Advance(absl::Seconds(8));
  Beat("w1");
  clock_.Advance(absl::Seconds(8));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);

  // Silence past the timeout loses it.
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(sched_->OnHello(Hello("w2")).ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Job(id).state_reason(), HasSubstr("attempt 1 lost: worker w1 silent"));
  auto attempts = *store_.ListAttempts(id);
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0].state(), store::ATTEMPT_STATE_LOST);

  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  auto assigned = channel_.Take("w2", ControllerMessage::kAssignment);
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].assignment().attempt(), 2);
  EXPECT_EQ(assigned[0].assignment().resume_from().step(), 5);
  EXPECT_EQ(assigned[0].assignment().resume_from().path(),
            CheckpointPath("jobs/" + std::to_string(id), 5));

  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_FAILED);
  EXPECT_THAT(Job(id).state_reason(), HasSubstr("no attempts left (max_attempts 2)"));
}

TEST_F(SchedulerTest, LosingOneRankStopsTheOthers) {
  const int64_t id = Submit(Spec(0, "cpu", 2));
  ASSERT_TRUE(sched_->OnHello(Hello("a")).ok());
  ASSERT_TRUE(sched_->OnHello(Hello("b")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(6));
  Beat("b");
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(channel_.Take("b", ControllerMessage::kStop).size(), 1u);
  // b's slot stays held until b says its rank stopped: nothing new lands on
  // a worker still leaving the gang.
  EXPECT_EQ(sched_->Workers()[1].used_slots, 1);
  ASSERT_TRUE(Exit("b", id, 1, tally::v1::ATTEMPT_OUTCOME_FAILED, true).ok());
  EXPECT_EQ(sched_->Workers()[1].used_slots, 0);
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);  // the late exit changes nothing
}

TEST_F(SchedulerTest, OnlyRankZeroSucceedsAGang) {
  const int64_t id = Submit(Spec(0, "cpu", 2));
  ASSERT_TRUE(sched_->OnHello(Hello("a")).ok());
  ASSERT_TRUE(sched_->OnHello(Hello("b")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  std::string leader;
  for (const char* w : {"a", "b"}) {
    auto as = channel_.Take(w, ControllerMessage::kAssignment);
    ASSERT_EQ(as.size(), 1u);
    if (as[0].assignment().rank() == 0) leader = w;
  }
  const std::string other = leader == "a" ? "b" : "a";
  // Rank 1 finishes first: the job waits for rank 0 (and its last reports).
  tally::v1::WorkerMessage m;
  auto* exit = m.mutable_exit();
  exit->set_job(absl::StrCat("jobs/", id));
  exit->set_attempt(1);
  exit->set_outcome(tally::v1::ATTEMPT_OUTCOME_SUCCEEDED);
  exit->set_rank(1);
  ASSERT_TRUE(sched_->OnMessage(other, m).ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  exit->set_rank(0);
  ASSERT_TRUE(sched_->OnMessage(leader, m).ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_SUCCEEDED);
}

TEST_F(SchedulerTest, GangRanksMeetAtTheLeadersRendezvous) {
  auto leader = Hello("lead", 2);
  leader.set_rendezvous_host("10.0.0.5");
  leader.set_rendezvous_port(29500);
  ASSERT_TRUE(sched_->OnHello(leader).ok());
  auto other = Hello("other", 2);
  other.set_rendezvous_host("10.0.0.6");
  other.set_rendezvous_port(29500);
  ASSERT_TRUE(sched_->OnHello(other).ok());
  // Two 2-rank jobs: each fits one worker whole.
  const int64_t first = Submit(Spec(0, "cpu", 2));
  const int64_t second = Submit(Spec(0, "cpu", 2));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(first), tally::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(State(second), tally::v1::JOB_STATE_RUNNING);
  std::set<std::string> addresses;
  for (const char* w : {"lead", "other"}) {
    auto as = channel_.Take(w, ControllerMessage::kAssignment);
    ASSERT_EQ(as.size(), 2u);
    EXPECT_EQ(as[0].assignment().rendezvous(), as[1].assignment().rendezvous());
    EXPECT_EQ(as[0].assignment().rendezvous_prefix(),
              absl::StrCat(as[0].assignment().job(), "/attempt-1"));
    addresses.insert(as[0].assignment().rendezvous());
  }
  EXPECT_EQ(addresses, (std::set<std::string>{"10.0.0.5:29500", "10.0.0.6:29500"}));

  // A worker that cannot lead (port 0) never gets rank 0.
  auto follower = Hello("follower");
  ASSERT_TRUE(sched_->OnHello(follower).ok());
  auto leads = Hello("leads");
  leads.set_rendezvous_host("10.0.0.7");
  leads.set_rendezvous_port(29500);
  ASSERT_TRUE(sched_->OnHello(leads).ok());
  Submit(Spec(0, "cpu", 2));
  ASSERT_TRUE(sched_->Tick().ok());
  auto f = channel_.Take("follower", ControllerMessage::kAssignment);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].assignment().rank(), 1);
  EXPECT_EQ(f[0].assignment().rendezvous(), "10.0.0.7:29500");

  auto bad = Hello("bad");
  bad.set_rendezvous_port(70000);
  EXPECT_THAT(std::string(sched_->OnHello(bad).status().message()),
              HasSubstr("hello.rendezvous_port"));
}

TEST_F(SchedulerTest, AttemptsLedByOneWorkerAtOnceGetTheirOwnPorts) {
  auto leader = Hello("lead", 4);
  leader.set_rendezvous_host("10.0.0.5");
  leader.set_rendezvous_port(29500);
  ASSERT_TRUE(sched_->OnHello(leader).ok());
  Submit(Spec(0, "cpu", 2));
  Submit(Spec(0, "cpu", 2));
  ASSERT_TRUE(sched_->Tick().ok());
  std::set<std::string> addresses;
  for (const auto& a : channel_.Take("lead", ControllerMessage::kAssignment)) {
    addresses.insert(a.assignment().rendezvous());
  }
  EXPECT_EQ(addresses, (std::set<std::string>{"10.0.0.5:29500", "10.0.0.5:29501"}));
}

TEST_F(SchedulerTest, CancelQueuedRunningAndEnded) {
  const int64_t queued = Submit(Spec());
  const int64_t running = Submit(Spec(5));
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(running), tally::v1::JOB_STATE_RUNNING);

  ASSERT_TRUE(sched_->Cancel(queued, "").ok());
  EXPECT_EQ(State(queued), tally::v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(sched_->Cancel(running, "wrong lr").ok());
  EXPECT_EQ(State(running), tally::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(Job(running).state_reason(), "cancelled: wrong lr");
  auto stops = channel_.Take("w1", ControllerMessage::kStop);
  ASSERT_EQ(stops.size(), 1u);
  // The slot is held until the worker reports that it stopped.
  EXPECT_EQ(sched_->Workers()[0].used_slots, 1);
  ASSERT_TRUE(Exit("w1", running, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  EXPECT_EQ(sched_->Workers()[0].used_slots, 0);
  EXPECT_EQ(State(running), tally::v1::JOB_STATE_CANCELLED);

  auto again = sched_->Cancel(running, "");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("CANCELLED"));
  EXPECT_EQ(sched_->Cancel(999, "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, FailuresRetryOnlyWhenRetryable) {
  const int64_t a = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Exit("w1", a, 1, tally::v1::ATTEMPT_OUTCOME_FAILED, true).ok());
  EXPECT_EQ(State(a), tally::v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Exit("w1", a, 2, tally::v1::ATTEMPT_OUTCOME_FAILED, false).ok());
  EXPECT_EQ(State(a), tally::v1::JOB_STATE_FAILED);
  EXPECT_EQ(Job(a).state_reason(), "attempt 2 failed: test");
}

TEST_F(SchedulerTest, ReconnectReportingTheAttemptIsAdopted) {
  const int64_t id = Submit(Spec());
  auto gen1 = sched_->OnHello(Hello("w1"));
  ASSERT_TRUE(sched_->Tick().ok());
  sched_->OnDisconnect("w1", *gen1);
  clock_.Advance(absl::Seconds(3));
  auto hello = Hello("w1");
  auto* r = hello.add_running();
  r->set_job("jobs/" + std::to_string(id));
  r->set_attempt(1);
  auto gen2 = sched_->OnHello(hello);
  ASSERT_TRUE(gen2.ok());
  sched_->OnDisconnect("w1", *gen1);  // a stale stream ending changes nothing
  clock_.Advance(absl::Seconds(8));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).attempt(), 1);
  EXPECT_TRUE(sched_->Workers()[0].connected);
  EXPECT_EQ(EventTypes(id).back(), "adopted");
}

TEST_F(SchedulerTest, ReconnectWithoutTheAttemptLosesIt) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());  // restarted, runs nothing
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Job(id).state_reason(), HasSubstr("the worker restarted"));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).attempt(), 2);
}

TEST_F(SchedulerTest, StaleReportsGetAStopOrder) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  tally::v1::WorkerMessage p;
  p.mutable_progress()->set_job("jobs/" + std::to_string(id));
  p.mutable_progress()->set_attempt(7);
  ASSERT_TRUE(sched_->OnMessage("w1", p).ok());
  auto stops = channel_.Take("w1", ControllerMessage::kStop);
  ASSERT_EQ(stops.size(), 1u);
  EXPECT_EQ(stops[0].stop().attempt(), 7);
  // And a hello reporting an attempt tallyd never gave it.
  auto hello = Hello("w2");
  hello.add_running()->set_job("jobs/424242");
  ASSERT_TRUE(sched_->OnHello(hello).ok());
  EXPECT_EQ(channel_.Take("w2", ControllerMessage::kStop).size(), 1u);
}

TEST_F(SchedulerTest, ACancelledAttemptHoldsItsSlotUntilItsExit) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(sched_->Cancel(id, "wrong lr").ok());
  // The worker's last progress crosses the stop order: it is still busy.
  tally::v1::WorkerMessage p;
  p.mutable_progress()->set_job("jobs/" + std::to_string(id));
  p.mutable_progress()->set_attempt(1);
  ASSERT_TRUE(sched_->OnMessage("w1", p).ok());
  const int64_t next = Submit(Spec());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(next), tally::v1::JOB_STATE_QUEUED) << "placed on a worker still busy";
  ASSERT_TRUE(Exit("w1", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(next), tally::v1::JOB_STATE_RUNNING);
}

TEST_F(SchedulerTest, ImpossibleCountsInAReportAreRefusedNamingTheField) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  const std::string job = "jobs/" + std::to_string(id);
  tally::v1::WorkerMessage c;
  c.mutable_checkpoint()->set_job(job);
  c.mutable_checkpoint()->set_attempt(1);
  c.mutable_checkpoint()->set_step(5);
  c.mutable_checkpoint()->set_tokens(std::numeric_limits<int64_t>::min());
  absl::Status s = sched_->OnMessage("w1", c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("checkpoint.tokens: must not be negative"));
  tally::v1::WorkerMessage p;
  p.mutable_progress()->set_job(job);
  p.mutable_progress()->set_attempt(1);
  p.mutable_progress()->set_step(-1);
  EXPECT_THAT(sched_->OnMessage("w1", p).message(), HasSubstr("progress.step"));
  p.mutable_progress()->set_step(1);
  p.mutable_progress()->set_fp8_values(-3);
  EXPECT_THAT(sched_->OnMessage("w1", p).message(),
              HasSubstr("progress.fp8_values: must not be negative"));
  p.mutable_progress()->set_fp8_values(3);
  p.mutable_progress()->set_fp8_overflows(-1);
  EXPECT_THAT(sched_->OnMessage("w1", p).message(),
              HasSubstr("progress.fp8_overflows: must not be negative"));
  EXPECT_TRUE(store_.ListCheckpoints(id)->empty());
  EXPECT_EQ(Job(id).step(), 0);
}

// tallyd gave up on an attempt while its worker could not reach it; the
// worker comes back still running it. Its slot is busy until the stale
// attempt's exit arrives: placing the requeued job there would fail it for
// want of a free slot.
TEST_F(SchedulerTest, AStaleAttemptReportedOnReconnectHoldsItsSlotUntilItsExit) {
  const int64_t id = Submit(Spec());
  auto gen = sched_->OnHello(Hello("w1"));
  ASSERT_TRUE(gen.ok());
  ASSERT_TRUE(sched_->Tick().ok());
  sched_->OnDisconnect("w1", *gen);
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);  // attempt 1 lost
  auto hello = Hello("w1");
  auto* r = hello.add_running();
  r->set_job("jobs/" + std::to_string(id));
  r->set_attempt(1);
  ASSERT_TRUE(sched_->OnHello(hello).ok());
  EXPECT_EQ(channel_.Take("w1", ControllerMessage::kStop).size(), 1u);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED) << "w1 is still busy with attempt 1";
  ASSERT_TRUE(Exit("w1", id, 1, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
}

TEST_F(SchedulerTest, MessagesBeforeHelloAreRefused) {
  tally::v1::WorkerMessage m;
  m.mutable_heartbeat();
  EXPECT_EQ(sched_->OnMessage("nobody", m).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(sched_->OnHello(Hello("")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sched_->OnHello(Hello("w", 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SchedulerTest, ProgressEventsAreRateLimited) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  const size_t before = EventTypes(id).size();
  for (int step = 1; step <= 10; ++step) {
    tally::v1::WorkerMessage p;
    p.mutable_progress()->set_job("jobs/" + std::to_string(id));
    p.mutable_progress()->set_attempt(1);
    p.mutable_progress()->set_step(step);
    ASSERT_TRUE(sched_->OnMessage("w1", p).ok());
    clock_.Advance(absl::Milliseconds(300));
  }
  const size_t progress_events = EventTypes(id).size() - before;
  EXPECT_GE(progress_events, 3u);
  EXPECT_LE(progress_events, 4u);
}

// Step times for recipe costs: each attempt's first reports (start-up) are
// left out, a step reported twice counts once, garbage never enters, and the
// sample reaches the store with the job's next commit.
TEST_F(SchedulerTest, SteadyStepTimesAreSampledPerAttempt) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  auto report = [&](int attempt, int64_t step, double seconds) {
    tally::v1::WorkerMessage p;
    p.mutable_progress()->set_job("jobs/" + std::to_string(id));
    p.mutable_progress()->set_attempt(attempt);
    p.mutable_progress()->set_step(step);
    p.mutable_progress()->set_trained(true);
    p.mutable_progress()->set_step_seconds(seconds);
    clock_.Advance(absl::Seconds(2));  // each report becomes an event: committed
    return sched_->OnMessage("w1", p);
  };
  for (int step = 1; step <= 10; ++step) {
    ASSERT_TRUE(report(1, step, step <= 3 ? 9.0 : 0.5).ok());
  }
  ASSERT_TRUE(report(1, 10, 0.5).ok());   // the same step again
  EXPECT_EQ(report(1, 11, -1.0).code(), absl::StatusCode::kInvalidArgument);  // not a time
  const tally::v1::StepTimes t = Job(id).step_times();
  EXPECT_EQ(t.reports(), 7) << "steps 4..10; the first three were start-up";
  ASSERT_EQ(t.seconds_size(), 7);
  for (double s : t.seconds()) EXPECT_EQ(s, 0.5);
  EXPECT_EQ(t.stride(), 1);
}

// The evaluation a stop makes of its stopped state (after the decision) is
// not judged, but it counts as the run's best when it is.
TEST_F(SchedulerTest, TheStopStepsEvaluationCanBeTheBest) {
  tally::v1::JobSpec spec = Spec();
  spec.mutable_training()->set_max_steps(100);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  auto eval = [&](int64_t step, double loss) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job("jobs/" + std::to_string(id));
    m.mutable_eval()->set_attempt(1);
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_tokens(step * 100);
    m.mutable_eval()->set_val_loss(loss);
    return sched_->OnMessage("w1", m);
  };
  ASSERT_TRUE(eval(10, 3.0).ok());
  ASSERT_TRUE(sched_->StopJob(id, tally::v1::JOB_STATE_EARLY_STOPPED, "experiment_halving",
                              "the worse half").ok());
  const absl::Status at_stop = eval(12, 2.9);
  ASSERT_TRUE(at_stop.ok()) << at_stop;
  const tally::v1::EarlyStoppingStatus es = Job(id).early_stopping();
  EXPECT_TRUE(es.has_best());
  EXPECT_EQ(es.best_val_loss(), 2.9);
  EXPECT_EQ(es.best_step(), 12);
  EXPECT_EQ(Job(id).curve_size(), 2);
}

// An experiment's hold: a running job is preempted (checkpoint, requeue; not
// a failure, cause "experiment"), stays out of placement while held, and is
// placed again once released.
TEST_F(SchedulerTest, AHeldJobIsPreemptedAndNotPlacedUntilReleased) {
  auto spec = Spec();
  spec.set_max_preemptions(1);  // holds are the experiment's, not counted
  const int64_t id = Submit(spec);
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  auto held = sched_->HoldJob(id, "experiments/3", "held at rung 1");
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->hold(), "held at rung 1");
  EXPECT_EQ(Job(id).preemption().pending_for(), "experiments/3");
  ASSERT_TRUE(Exit("w1", id, 1, tally::v1::ATTEMPT_OUTCOME_PREEMPTED).ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).preemption().count(), 1);
  EXPECT_EQ(Job(id).preemption().by_priority(), 0);
  EXPECT_EQ(Job(id).preemption().by_experiment(), 1);
  EXPECT_EQ(sched_->QueueDepth(), 0) << "held, not waiting for capacity";
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(1));
    Beat("w1");
    ASSERT_TRUE(sched_->Tick().ok());
  }
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED) << "held: the free slot stays free";
  EXPECT_EQ(sched_->GpusWanted().at("cpu"), 0) << "nothing to scale for a held job";
  ASSERT_TRUE(sched_->ReleaseJob(id, "rung judged").ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).attempt(), 2);
  const auto metrics = MetricValues(*registries_.back());
  EXPECT_EQ(metrics.at("tally_preemptions_total,cause=experiment,gpu_type=cpu"), 1);
  // Held at a second rung: still not counted against max_preemptions 1.
  ASSERT_TRUE(sched_->HoldJob(id, "experiments/3", "held at rung 2").ok());
  ASSERT_TRUE(Exit("w1", id, 2, tally::v1::ATTEMPT_OUTCOME_PREEMPTED).ok());
  EXPECT_EQ(State(id), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Job(id).preemption().count(), 2);
  ASSERT_TRUE(sched_->ReleaseJob(id, "rung judged").ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(id), tally::v1::JOB_STATE_RUNNING);
  // Ended, it is held by nothing.
  ASSERT_TRUE(sched_->HoldJob(id, "experiments/3", "held at rung 3").ok());
  ASSERT_TRUE(sched_->Cancel(id, "enough").ok());
  EXPECT_EQ(Job(id).hold(), "");
  // A queued job is held without a preemption; an ended one cannot be.
  const int64_t other = Submit(Spec());
  ASSERT_TRUE(sched_->HoldJob(other, "experiments/3", "held").ok());
  EXPECT_EQ(Job(other).preemption().count(), 0);
  ASSERT_TRUE(sched_->Cancel(other, "done").ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(sched_->HoldJob(other, "experiments/3", "x").status()));
}

TEST_F(SchedulerTest, RecoverAdoptsReturningWorkersAndRequeuesTheRest) {
  const int64_t a = Submit(Spec());
  const int64_t b = Submit(Spec());
  const int64_t queued = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->OnHello(Hello("w2")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(a), tally::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(State(b), tally::v1::JOB_STATE_RUNNING);

  // tallyd restarts: a new scheduler over the same store.
  sched_ = NewScheduler();
  ASSERT_TRUE(sched_->Recover().ok());
  EXPECT_EQ(sched_->QueueDepth(), 1);
  auto hello = Hello(Job(a).worker_ids(0));
  hello.add_running()->set_job("jobs/" + std::to_string(a));
  hello.mutable_running(0)->set_attempt(1);
  ASSERT_TRUE(sched_->OnHello(hello).ok());
  clock_.Advance(absl::Seconds(11));
  Beat(Job(a).worker_ids(0));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(State(a), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(a).attempt(), 1);
  // b's worker never came back: requeued, then started on the free worker...
  // which is busy with a; so b waits.
  EXPECT_EQ(State(b), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(State(queued), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(SchedulerTest, GaugesReportQueueAndSlots) {
  Submit(Spec());
  Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1", 1)).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  std::map<std::string, double> values;
  for (const auto& f : registries_.back()->Collect()) {
    for (const auto& m : f.metric) {
      std::string key = f.name;
      for (const auto& [k, v] : m.labels) key += "," + k + "=" + v;
      values[key] = m.value;
    }
  }
  EXPECT_EQ(values["tally_queue_depth"], 1);
  EXPECT_EQ(values["tally_jobs,state=queued"], 1);
  EXPECT_EQ(values["tally_jobs,state=running"], 1);
  EXPECT_EQ(values["tally_worker_slots,gpu_type=cpu,state=used"], 1);
  EXPECT_EQ(values["tally_worker_slots,gpu_type=cpu,state=free"], 0);
  EXPECT_EQ(values["tally_workers,gpu_type=cpu,state=connected"], 1);
}


TEST_F(SchedulerTest, FleetCountersExistAtZeroForKnownLabels) {
  options_.prices.usd_per_gpu_hour["h200"] = 3.5;
  sched_ = NewScheduler();
  auto v = MetricValues(*registries_.back());
  for (const char* key : {"tally_job_ends_total,reason_rule=patience,state=early_stopped",
                          "tally_job_ends_total,reason_rule=budget,state=budget_exhausted",
                          "tally_job_ends_total,reason_rule=failure,state=failed",
                          "tally_job_transitions_total,state=early_stopped",
                          "tally_attempts_ended_total,outcome=lost",
                          "tally_workers_lost_total,gpu_type=h200",
                          "tally_tokens_total,gpu_type=h200,kind=useful",
                          "tally_fp8_overflows_total,gpu_type=h200",
                          "tally_fp8_values_total,gpu_type=h200",
                          "tally_cost_lost_dollars_total,gpu_type=h200"}) {
    ASSERT_EQ(v.count(key), 1u) << key;
    EXPECT_EQ(v[key], 0) << key;
  }
  // A GPU type first seen in a worker's Hello (listed, not priced).
  options_.prices.worker_gpu_types = {"a100"};
  sched_ = NewScheduler();
  ASSERT_TRUE(sched_->OnHello(Hello("w1", 1, "a100")).ok());
  v = MetricValues(*registries_.back());
  EXPECT_EQ(v.count("tally_workers_lost_total,gpu_type=a100"), 1u);
  EXPECT_EQ(v.count("tally_tokens_total,gpu_type=a100,kind=padding"), 1u);
}

TEST_F(SchedulerTest, AWorkerMayAnnounceOnlyAGpuTypeTheConfigNames) {
  options_.prices.usd_per_gpu_hour["h200"] = 3.5;
  options_.prices.worker_gpu_types = {"cpu"};
  sched_ = NewScheduler();
  EXPECT_TRUE(sched_->OnHello(Hello("w1", 1, "h200")).ok());
  EXPECT_TRUE(sched_->OnHello(Hello("w2", 1, "cpu")).ok());
  const auto refused = sched_->OnHello(Hello("w3", 1, "h200-typo"));
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("hello.gpu_type: \"h200-typo\" is not a GPU type tallyd knows "
                              "(cpu, h200)"),
                    HasSubstr("worker_gpu_types")));
  EXPECT_EQ(MetricValues(*registries_.back())["tally_worker_reports_refused_total,kind=hello"], 1);
  auto v = MetricValues(*registries_.back());
  EXPECT_EQ(v.count("tally_workers_lost_total,gpu_type=h200-typo"), 0u) << "no series for it";
}

TEST_F(SchedulerTest, WithNoTypeConfiguredTheFleetHoldsAFewTypesAtMost) {
  for (int i = 0; i < Scheduler::kMaxUnlistedGpuTypes; ++i) {
    const std::string w = "w" + std::to_string(i);
    auto generation = sched_->OnHello(Hello(w, 1, "t" + std::to_string(i)));
    ASSERT_TRUE(generation.ok());
    if (i > 0) sched_->OnDisconnect(w, *generation);
  }
  // A known type is always welcome; a new one past the bound is not, even
  // once the workers that brought the others are gone (their series stay).
  EXPECT_TRUE(sched_->OnHello(Hello("again", 1, "t0")).ok());
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(sched_->Tick().ok());
  const auto refused = sched_->OnHello(Hello("more", 1, "t99"));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("would be GPU type number 17 and tallyd's --config names none"));
}

TEST_F(SchedulerTest, ASilentWorkerIsCountedLostOncePerSilence) {
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->OnHello(Hello("w2")).ok());
  auto lost = [&] { return MetricValues(*registries_.back())["tally_workers_lost_total,gpu_type=cpu"]; };
  clock_.Advance(absl::Seconds(6));
  Beat("w2");
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(lost(), 0);
  clock_.Advance(absl::Seconds(5));  // w1 silent 11 s: past the 10 s timeout
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(lost(), 1);
  Beat("w2");
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(lost(), 1) << "still the same silence";
  // It speaks again, then falls silent again: a second loss.
  Beat("w1");
  Beat("w2");
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(lost(), 3) << "w1 again, and w2";
}

TEST_F(SchedulerTest, JobEndsAreCountedByStateAndRule) {
  const int64_t a = Submit(Spec());
  const int64_t b = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(State(a), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(sched_->Cancel(b, "").ok());
  ASSERT_TRUE(Exit("w1", a, 1, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  auto v = MetricValues(*registries_.back());
  EXPECT_EQ(v["tally_job_ends_total,reason_rule=cancel,state=cancelled"], 1);
  EXPECT_EQ(v["tally_job_ends_total,reason_rule=max_steps,state=succeeded"], 1);
  EXPECT_EQ(v["tally_job_transitions_total,state=succeeded"], 1);
  EXPECT_EQ(v["tally_queue_wait_seconds"], 1);
}

TEST_F(SchedulerTest, QueueWaitBucketsDoubleFromATenthOfASecondToHours) {
  for (const auto& f : registries_.back()->Collect()) {
    if (f.name != "tally_queue_wait_seconds") continue;
    ASSERT_EQ(f.metric.size(), 1u);
    const auto& b = f.metric[0].buckets;
    ASSERT_EQ(b.size(), 19u);  // 18 bounds and +Inf
    EXPECT_DOUBLE_EQ(b[0].first, 0.1);
    for (size_t i = 1; i + 1 < b.size(); ++i) EXPECT_DOUBLE_EQ(b[i].first, 2 * b[i - 1].first);
    EXPECT_GT(b[b.size() - 2].first, 3 * 3600);
    return;
  }
  FAIL() << "no tally_queue_wait_seconds";
}

TEST_F(SchedulerTest, AnEndedJobsSeriesStayForTheRetention) {
  options_.job_metrics.retention = absl::Minutes(15);
  sched_ = NewScheduler();
  auto spec = Spec();
  spec.mutable_budget()->set_max_dollars(100);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  tally::v1::WorkerMessage p;
  p.mutable_progress()->set_job("jobs/" + std::to_string(id));
  p.mutable_progress()->set_attempt(1);
  p.mutable_progress()->set_step(7);
  p.mutable_progress()->set_tokens(700);
  p.mutable_progress()->set_trained(true);
  ASSERT_TRUE(sched_->OnMessage("w1", p).ok());
  ASSERT_TRUE(Exit("w1", id, 1, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  const std::string job = "jobs/" + std::to_string(id);
  clock_.Advance(absl::Minutes(14));
  ASSERT_TRUE(sched_->Tick().ok());
  auto v = MetricValues(*registries_.back());
  EXPECT_EQ(v["tally_job_step,tally_job=" + job], 7);
  EXPECT_EQ(v["tally_job_tokens_total,kind=useful,tally_job=" + job], 700);
  EXPECT_EQ(v["tally_tokens_total,gpu_type=cpu,kind=useful"], 700);
  EXPECT_EQ(v["tally_job_attempts_ended_total,outcome=succeeded,tally_job=" + job], 1);
  EXPECT_EQ(v.count("tally_job_info,display_name=,gpu_type=cpu,state=succeeded,tally_job=" + job),
            1u);
  clock_.Advance(absl::Minutes(1));
  ASSERT_TRUE(sched_->Tick().ok());
  v = MetricValues(*registries_.back());
  for (const auto& [key, value] : v) EXPECT_EQ(key.find(job), std::string::npos) << key;
  EXPECT_EQ(v["tally_tokens_total,gpu_type=cpu,kind=useful"], 700) << "fleet counters stay";
}

TEST_F(SchedulerTest, RoutingCollapseWithTopTwoOfFourExpertsWarns) {
  // E=4, k=2: one expert can take at most a quarter of the assignments, so
  // a rule on the raw share (> 0.5) never fires. Normalised by k/E, an
  // expert starved to 2% of the tokens is collapse.
  auto spec = Spec();
  spec.mutable_model()->mutable_moe()->set_num_experts(4);
  spec.mutable_model()->mutable_moe()->set_top_k(2);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  const std::string job = "jobs/" + std::to_string(id);
  for (int i = 0; i < 3; ++i) {
    tally::v1::WorkerMessage p;
    p.mutable_progress()->set_job(job);
    p.mutable_progress()->set_attempt(1);
    p.mutable_progress()->set_step(1 + i);
    p.mutable_progress()->set_trained(true);
    auto* l = p.mutable_progress()->add_moe();
    l->set_layer(0);
    for (int64_t n : {330, 330, 330, 10}) l->add_tokens_per_expert(n);
    ASSERT_TRUE(sched_->OnMessage("w1", p).ok());
    tally::v1::WorkerMessage e;
    e.mutable_eval()->set_job(job);
    e.mutable_eval()->set_attempt(1);
    e.mutable_eval()->set_step(1 + i);
    e.mutable_eval()->set_val_loss(3.0);
    ASSERT_TRUE(sched_->OnMessage("w1", e).ok());
  }
  const auto types = EventTypes(id);
  EXPECT_EQ(std::count(types.begin(), types.end(), "warning"), 1);
  auto events = *store_.ListEvents(id, 0, 1000);
  for (const auto& e : events) {
    if (e.type() == "warning") {
      EXPECT_THAT(e.reason(), ::testing::HasSubstr("layer 0 has 1 of 4 experts idle"));
    }
  }
  auto v = MetricValues(*registries_.back());
  EXPECT_EQ(v["tally_job_moe_collapsed_evals,tally_job=" + job], 3);
  EXPECT_EQ(v["tally_job_moe_collapsed,layer=0,tally_job=" + job], 1);
  EXPECT_EQ(v["tally_job_moe_idle_experts,layer=0,tally_job=" + job], 1);
}

TEST_F(SchedulerTest, GroupedFp8TurnedOffIsOneWarningPerAttemptKeptAcrossARestart) {
  auto spec = Spec();
  spec.mutable_model()->mutable_moe()->set_num_experts(4);
  spec.mutable_model()->mutable_moe()->set_top_k(2);
  spec.mutable_precision()->set_compute(tally::v1::PRECISION_FP8);
  const int64_t id = Submit(spec);
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  const std::string job = "jobs/" + std::to_string(id);
  auto progress = [&](int64_t step, const std::string& off) {
    tally::v1::WorkerMessage p;
    p.mutable_progress()->set_job(job);
    p.mutable_progress()->set_attempt(1);
    p.mutable_progress()->set_step(step);
    p.mutable_progress()->set_trained(true);
    p.mutable_progress()->set_fp8_product_fraction(1);
    p.mutable_progress()->set_fp8_grouped_off(off);
    return sched_->OnMessage("w1", p);
  };
  auto warnings = [&] {
    std::vector<std::string> out;
    const auto events = *store_.ListEvents(id, 0, 1000);
    for (const auto& e : events) {
      if (e.type() == "warning") out.push_back(e.reason());
    }
    return out;
  };
  ASSERT_TRUE(progress(1, "").ok());
  EXPECT_TRUE(warnings().empty()) << "nothing while grouped products are on";
  ASSERT_TRUE(progress(2, "at::_scaled_grouped_mm refused: \x1b[31mno kernel\n").ok());
  ASSERT_TRUE(progress(3, "at::_scaled_grouped_mm refused: \x1b[31mno kernel\n").ok());
  std::vector<std::string> w = warnings();
  ASSERT_EQ(w.size(), 1u) << "once per attempt, not once per report";
  EXPECT_THAT(w[0], ::testing::HasSubstr("FP8 grouped expert products turned off for attempt 1"));
  EXPECT_THAT(w[0], ::testing::HasSubstr("at::_scaled_grouped_mm refused"));
  EXPECT_EQ(w[0].find('\x1b'), std::string::npos) << "a worker's text is escaped";
  EXPECT_EQ(w[0].find('\n'), std::string::npos);
  EXPECT_EQ(Job(id).fp8_grouped_off_attempt(), 1);
  // Committed with the event: a restarted tallyd does not record it again.
  RestartAndReadopt("w1", job, 1);
  ASSERT_TRUE(progress(4, "at::_scaled_grouped_mm refused: no kernel").ok());
  EXPECT_EQ(warnings().size(), 1u);
  // A worker cannot flood the store: an oversized reason is refused.
  EXPECT_TRUE(absl::IsInvalidArgument(progress(5, std::string(5000, 'x'))));
  EXPECT_EQ(warnings().size(), 1u);
}

// A worker sends a report again when its stream broke before tallyd's Ack
// arrived (tallyd may have died after committing it): the evaluation and the
// checkpoint are taken once, by this tallyd or a restarted one.
TEST_F(SchedulerTest, AReportSentAgainAfterALostAckIsTakenOnceEvenAcrossARestart) {
  const int64_t id = Submit(Spec());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  std::vector<ControllerMessage> welcome = channel_.Take("w1", ControllerMessage::kWelcome);
  ASSERT_EQ(welcome.size(), 1u);
  EXPECT_TRUE(welcome[0].welcome().acks());
  ASSERT_TRUE(sched_->Tick().ok());
  const std::string job = "jobs/" + std::to_string(id);
  auto eval = [&](int64_t step, int32_t attempt = 1) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job(job);
    m.mutable_eval()->set_attempt(attempt);
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_val_loss(4.0 - 0.1 * static_cast<double>(step));
    return sched_->OnMessage("w1", m);
  };
  auto checkpoint = [&](int64_t step) {
    tally::v1::WorkerMessage m;
    m.mutable_checkpoint()->set_job(job);
    m.mutable_checkpoint()->set_attempt(1);
    m.mutable_checkpoint()->set_step(step);
    m.mutable_checkpoint()->set_path(
        absl::StrFormat("/ckpt/job-%d/step-%08d.ckpt", id, step));
    m.mutable_checkpoint()->set_sha256(std::string(64, 'a'));
    return sched_->OnMessage("w1", m);
  };
  auto count = [&](const std::string& type) {
    const std::vector<std::string> types = EventTypes(id);
    return std::count(types.begin(), types.end(), type);
  };
  ASSERT_TRUE(eval(0).ok());
  ASSERT_TRUE(checkpoint(1).ok());
  ASSERT_TRUE(eval(0).ok());
  ASSERT_TRUE(checkpoint(1).ok());
  EXPECT_EQ(count("eval"), 1);
  EXPECT_EQ(count("checkpoint"), 1);
  EXPECT_EQ(store_.ListCheckpoints(id)->size(), 1u);
  EXPECT_EQ(Job(id).early_stopping().evals(), 1);
  ASSERT_EQ(Job(id).curve_size(), 1);
  EXPECT_EQ(Job(id).curve(0).attempt(), 1);

  // A restarted tallyd knows them from the store.
  RestartAndReadopt("w1", job, 1);
  ASSERT_TRUE(eval(0).ok());
  ASSERT_TRUE(checkpoint(1).ok());
  EXPECT_EQ(count("eval"), 1);
  EXPECT_EQ(store_.ListCheckpoints(id)->size(), 1u);
  // What is new is taken.
  ASSERT_TRUE(eval(2).ok());
  ASSERT_TRUE(checkpoint(2).ok());
  EXPECT_EQ(count("eval"), 2);
  EXPECT_EQ(store_.ListCheckpoints(id)->size(), 2u);
  EXPECT_EQ(Job(id).early_stopping().evals(), 2);
}

TEST(RepeatedReportTest, OnlyTheSameAttemptAtOrBeforeItsLatestPointOrCheckpoint) {
  tally::v1::Job j;
  tally::v1::EvalResult ev;
  ev.set_attempt(2);
  ev.set_step(50);
  EXPECT_FALSE(RepeatedEval(j, ev)) << "an empty curve";
  tally::v1::EvalPoint& last = *j.add_curve();
  last.set_attempt(2);
  last.set_step(50);
  EXPECT_TRUE(RepeatedEval(j, ev));
  ev.set_step(25);
  EXPECT_TRUE(RepeatedEval(j, ev));
  ev.set_step(75);
  EXPECT_FALSE(RepeatedEval(j, ev)) << "a later step";
  ev.set_step(25);
  ev.set_attempt(3);
  EXPECT_FALSE(RepeatedEval(j, ev)) << "a resumed attempt evaluates earlier steps again";
  last.set_attempt(0);
  ev.set_attempt(0);
  EXPECT_FALSE(RepeatedEval(j, ev)) << "a point recorded without its attempt";

  tally::v1::Checkpoint latest;
  latest.set_attempt(2);
  latest.set_step(50);
  latest.set_path("/c/job-1/step-00000050.ckpt");
  tally::v1::CheckpointRecord c;
  c.set_attempt(2);
  c.set_step(50);
  c.set_path(latest.path());
  EXPECT_FALSE(RepeatedCheckpoint(std::nullopt, c));
  EXPECT_TRUE(RepeatedCheckpoint(latest, c));
  c.set_attempt(3);
  EXPECT_FALSE(RepeatedCheckpoint(latest, c));
  c.set_attempt(2);
  c.set_path("/c/job-1/step-00000051.ckpt");
  EXPECT_FALSE(RepeatedCheckpoint(latest, c));
}

}  // namespace
}  // namespace tally::sched

namespace tally::sched {
namespace {

TEST(CheckCheckpointPathTest, OnlyTheJobsOwnFileOfTheStepWithoutDotComponents) {
  EXPECT_TRUE(CheckCheckpointPath("jobs/7", "/ckpt/job-7/step-00000010.ckpt", 10).ok());
  EXPECT_TRUE(CheckCheckpointPath("jobs/7", "/ckpt/job-7/step-1.ckpt", 1, "/ckpt").ok());
  for (const char* bad :
       {"/etc/passwd", "/etc/job-7/passwd", "/ckpt/job-7/step-00000011.ckpt",
        "tally-checkpoints/job-7/step-00000010.ckpt", "/proc/self/cwd/job-7/step-00000010.ckpt",
        "/dev/shm/job-7/step-00000010.ckpt",
        "/ckpt/job-7/step-.ckpt", "/ckpt/job-7/step-1x.ckpt", "/ckpt/job-7/step-00000010.ckpt.tmp",
        "/ckpt/job-8/step-00000010.ckpt", "/ckpt/job-7/../job-8/x", "/ckpt/job-7/./x",
        "/ckpt/job-7//x", "/ckpt/job-7/", "job-7", "/ckpt/job-7/x\n", ""}) {
    absl::Status s = CheckCheckpointPath("jobs/7", bad, 10);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << bad;
    EXPECT_THAT(s.message(), testing::HasSubstr("checkpoint.path")) << bad;
  }
  EXPECT_THAT(CheckCheckpointPath("jobs/7", "/etc/passwd", 10).message(),
              testing::HasSubstr("job-7"));
  // With tallyd's checkpoint_root: the job's folder there, nowhere else.
  EXPECT_TRUE(CheckCheckpointPath("jobs/16", "/ckpt/job-16/step-00000010.ckpt", 10, "/ckpt").ok());
  for (const char* bad : {"/etc/job-16/step-00000010.ckpt", "/ckpt/x/job-16/step-00000010.ckpt",
                          "/ckpt2/job-16/step-00000010.ckpt"}) {
    EXPECT_THAT(CheckCheckpointPath("jobs/16", bad, 10, "/ckpt").message(),
                testing::HasSubstr("is not in /ckpt/job-16 (tallyd's checkpoint_root"))
        << bad;
  }
}

}  // namespace
}  // namespace tally::sched
