// The autoscaling read side of the scheduler: tally_gpus_wanted (queued GPUs
// that workers could run, plus running ones) and tally_workers_idle, by GPU
// type, and a worker's "idle" notice.
#include <map>
#include <memory>
#include <string>

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
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

class ScaleTest : public ::testing::Test {
 protected:
  ScaleTest() {
    options_.prices.usd_per_gpu_hour["cpu"] = 3600;  // a dollar a GPU-second
    options_.prices.usd_per_gpu_hour["h200"] = 3600;
    NewScheduler();
  }
  void NewScheduler() {
    registry_ = std::make_unique<metrics::Registry>();
    sched_ = std::make_unique<Scheduler>(&store_, &channel_, &clock_, registry_.get(), options_);
    ASSERT_TRUE(sched_->Recover().ok());
  }
  void Hello(const std::string& w, const std::string& gpu_type = "cpu", int slots = 1) {
    tally::v1::Hello h;
    h.set_worker_id(w);
    h.set_gpu_type(gpu_type);
    h.set_slots(slots);
    absl::StatusOr<int64_t> generation = sched_->OnHello(h);
    ASSERT_TRUE(generation.ok()) << generation.status();
    generations_[w] = *generation;
  }
  int64_t Submit(const std::string& gpu_type, int gpus, const std::string& tenant = "",
                 int priority = 0) {
    tally::v1::JobSpec spec = TinySpec(gpus);
    spec.mutable_resources()->set_gpu_type(gpu_type);
    spec.set_priority(priority);
    auto job = sched_->Submit(spec, "", Actor{"someone", tenant});
    EXPECT_TRUE(job.ok()) << job.status();
    clock_.Advance(absl::Milliseconds(1));  // distinct submission times
    return job.ok() ? std::stoll(job->name().substr(5)) : 0;
  }
  tally::v1::Job Job(int64_t id) { return store_.GetJob(id)->job(); }
  absl::Status Notice(const std::string& w, const std::string& cause) {
    tally::v1::WorkerMessage m;
    m.mutable_notice()->set_cause(cause);
    m.mutable_notice()->set_deadline_seconds(25);
    return sched_->OnMessage(w, m);
  }
  absl::Status Exit(const std::string& w, int64_t id, tally::v1::AttemptOutcome outcome,
                    const std::string& cause = "") {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job("jobs/" + std::to_string(id));
    m.mutable_exit()->set_attempt(Job(id).attempt());
    m.mutable_exit()->set_outcome(outcome);
    m.mutable_exit()->set_retryable(true);
    m.mutable_exit()->set_reason("exit");
    m.mutable_exit()->set_preemption_cause(cause);
    return sched_->OnMessage(w, m);
  }
  double Metric(const std::string& key) {
    auto values = MetricValues(*registry_);
    auto it = values.find(key);
    return it == values.end() ? -1 : it->second;  // -1: no such series
  }
  double Wanted(const std::string& type) { return Metric("tally_gpus_wanted,gpu_type=" + type); }
  double Idle(const std::string& type) { return Metric("tally_workers_idle,gpu_type=" + type); }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  RecordingChannel channel_;
  SchedulerOptions options_;
  std::unique_ptr<metrics::Registry> registry_;
  std::unique_ptr<Scheduler> sched_;
  std::map<std::string, int64_t> generations_;
};

TEST_F(ScaleTest, WithNoWorkersQueuedGpusAreWantedByTypeAndPricedTypesShowZero) {
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("cpu"), 0);
  EXPECT_EQ(Wanted("h200"), 0);
  EXPECT_EQ(Idle("cpu"), 0);
  Submit("h200", 2);
  Submit("h200", 1);
  Submit("cpu", 1);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("h200"), 3);
  EXPECT_EQ(Wanted("cpu"), 1);
  EXPECT_EQ(Idle("h200"), 0);
  EXPECT_THAT(sched_->GpusWanted(), UnorderedElementsAre(Pair("cpu", 1), Pair("h200", 3)));
}

TEST_F(ScaleTest, RunningAttemptsStayWantedAndIdleWorkersAreConnectedLiveAndNotDraining) {
  const int64_t a = Submit("cpu", 2);
  Hello("w0");
  Hello("w1");
  Hello("w2");
  EXPECT_EQ(Idle("cpu"), 3);  // said at the Hello, before any tick
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Wanted("cpu"), 2);  // running: still wanted
  EXPECT_EQ(Idle("cpu"), 1);
  // Another job that does not fit what is free: wanted too.
  Submit("cpu", 2);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("cpu"), 4);
  EXPECT_EQ(Idle("cpu"), 1);

  // The idle worker leaves with an "idle" notice: no longer idle (nothing
  // will be placed on it), and nothing is placed on it.
  std::string idle_worker;
  for (const WorkerView& w : sched_->Workers()) {
    if (w.used_slots == 0) idle_worker = w.record.worker_id();
  }
  ASSERT_FALSE(idle_worker.empty());
  ASSERT_TRUE(Notice(idle_worker, "idle").ok());
  EXPECT_EQ(Idle("cpu"), 0);
  EXPECT_THAT(sched_->IdleWorkers(), UnorderedElementsAre(Pair("cpu", 0)));

  // A disconnected worker is not idle; one back is.
  sched_->OnDisconnect(idle_worker, generations_[idle_worker]);
  Hello("w3", "h200");
  EXPECT_EQ(Idle("h200"), 1);
  // Silent past the heartbeat timeout: not idle (nothing would be placed).
  clock_.Advance(options_.heartbeat_timeout + absl::Seconds(1));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Idle("h200"), 0);
}

TEST_F(ScaleTest, JobsHeldBackByTheirTenantsMaxGpusAreNotWantedInTheOrderTickOffersThem) {
  options_.quotas["research"] = {/*max_gpus=*/2, 0, 0};
  NewScheduler();
  Submit("cpu", 2, "research", /*priority=*/0);  // after b: 1 + 2 > 2, held back
  Submit("cpu", 1, "research", /*priority=*/5);  // offered first
  Submit("cpu", 1, "research", /*priority=*/0);  // 1 + 1 fits
  Submit("cpu", 4, "dev");                       // no quota
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("cpu"), 6);
}

TEST_F(ScaleTest, AQueuedJobOfATenantAtItsDollarQuotaIsNotWanted) {
  options_.quotas["research"] = {0, /*max_dollars_per_day=*/5.0, 0};
  NewScheduler();
  Hello("w1");
  const int64_t a = Submit("cpu", 1, "research");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);
  const int64_t b = Submit("cpu", 1, "research");
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("cpu"), 2);  // a runs, b waits for a worker
  clock_.Advance(absl::Seconds(6));  // $6 of $5: a stops, b waits for the window
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(a).state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
  ASSERT_EQ(Job(b).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Job(b).state_reason(), HasSubstr("max_dollars_per_day"));
  EXPECT_EQ(Wanted("cpu"), 0);
}

TEST_F(ScaleTest, AnAssignmentThatCrossedAnIdleNoticeIsAPreemptionNotAFailure) {
  Hello("w0");
  const int64_t id = Submit("cpu", 1);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Notice("w0", "idle").ok());
  ASSERT_TRUE(Exit("w0", id, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, "idle").ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Metric("tally_preemptions_total,cause=idle,gpu_type=cpu"), 1);
  EXPECT_EQ(Metric("tally_attempts_ended_total,outcome=failed"), 0);
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("cpu"), 1);  // queued again, no worker to take it
  EXPECT_EQ(Idle("cpu"), 0);
}

TEST_F(ScaleTest, AnAssignmentWhoseAnswerWasLostWithTheIdleWorkerIsAPreemptionToo) {
  Hello("w0");
  const int64_t id = Submit("cpu", 1);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Notice("w0", "idle").ok());
  sched_->OnDisconnect("w0", generations_["w0"]);
  clock_.Advance(options_.heartbeat_timeout + absl::Seconds(1));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Metric("tally_preemptions_total,cause=idle,gpu_type=cpu"), 1);
  EXPECT_EQ(Metric("tally_attempts_ended_total,outcome=failed"), 0);
  EXPECT_EQ(Metric("tally_attempts_ended_total,outcome=lost"), 0);
}

TEST_F(ScaleTest, ATypeNoJobOrWorkerNamesAnyMoreLosesItsSeries) {
  const int64_t id = Submit("l4", 1);  // not priced: no worker, no price
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("l4"), 1);
  EXPECT_EQ(Idle("l4"), 0);
  ASSERT_TRUE(sched_->Cancel(id, "not needed").ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Wanted("l4"), -1);
  EXPECT_EQ(Idle("l4"), -1);
  EXPECT_EQ(Wanted("cpu"), 0);  // priced: stays, at 0
}

}  // namespace
}  // namespace tally::sched
