// Tenant quotas in the scheduler: max_gpus holds a tenant's jobs back, a
// dollar quota stops its running jobs and refuses its submits, and the spend
// behind it survives a restart.
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

tally::v1::JobSpec Spec() {
  tally::v1::JobSpec spec;
  spec.mutable_model()->set_num_layers(1);
  spec.mutable_model()->set_d_model(16);
  spec.mutable_model()->set_num_heads(2);
  spec.mutable_data()->set_train_path("/data/x");
  spec.mutable_data()->set_seq_len(64);
  spec.mutable_training()->set_max_steps(1000);
  spec.mutable_resources()->set_gpu_type("cpu");
  spec.mutable_resources()->set_gpu_count(1);
  return spec;
}

tally::v1::Hello Hello(const std::string& id) {
  tally::v1::Hello h;
  h.set_worker_id(id);
  h.set_device("cpu");
  h.set_gpu_type("cpu");
  h.set_slots(1);
  return h;
}

class QuotaTest : public ::testing::Test {
 protected:
  QuotaTest() {
    options_.prices.usd_per_gpu_hour["cpu"] = 3600;  // a dollar a second
    options_.quotas["research"] = {1, 5.0, 0};
    sched_ = NewScheduler();
  }
  std::unique_ptr<Scheduler> NewScheduler() {
    registries_.push_back(std::make_unique<metrics::Registry>());
    auto s = std::make_unique<Scheduler>(&store_, &channel_, &clock_, registries_.back().get(),
                                         options_);
    EXPECT_TRUE(s->Recover().ok());
    return s;
  }
  absl::StatusOr<int64_t> Submit(const std::string& tenant) {
    auto job = sched_->Submit(Spec(), "", Actor{"someone", tenant});
    if (!job.ok()) return job.status();
    return std::stoll(job->name().substr(5));
  }
  tally::v1::Job Job(int64_t id) { return store_.GetJob(id)->job(); }
  absl::Status Progress(const std::string& worker, int64_t id, int64_t step) {
    tally::v1::WorkerMessage m;
    m.mutable_progress()->set_job("jobs/" + std::to_string(id));
    m.mutable_progress()->set_attempt(1);
    m.mutable_progress()->set_step(step);
    m.mutable_progress()->set_tokens(step * 100);
    return sched_->OnMessage(worker, m);
  }
  std::string Worker(int64_t id) { return Job(id).worker_ids(0); }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  RecordingChannel channel_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(QuotaTest, MaxGpusHoldsATenantsJobsBackAndSaysWhy) {
  options_.quotas["research"].max_dollars_per_day = 0;
  sched_ = NewScheduler();
  for (const char* w : {"w1", "w2", "w3"}) ASSERT_TRUE(sched_->OnHello(Hello(w)).ok());
  const int64_t a = *Submit("research");
  const int64_t b = *Submit("research");
  const int64_t c = *Submit("dev");
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(c).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Job(b).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Job(b).state_reason(), HasSubstr("tenant research is at its max_gpus 1"));
  // Said once, not every tick.
  const int64_t events = Job(b).last_event_sequence();
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(b).last_event_sequence(), events);
  // When research's running job ends, the waiting one starts.
  ASSERT_TRUE(sched_->Cancel(a, "done", "alice").ok());
  tally::v1::WorkerMessage exit;
  exit.mutable_exit()->set_job("jobs/" + std::to_string(a));
  exit.mutable_exit()->set_attempt(1);
  exit.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
  ASSERT_TRUE(sched_->OnMessage(Worker(a), exit).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(b).state(), tally::v1::JOB_STATE_RUNNING);
}

TEST_F(QuotaTest, ADailyDollarQuotaStopsRunningJobsAndRefusesSubmitsUntilTheWindowRolls) {
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->OnHello(Hello("w2")).ok());
  const int64_t a = *Submit("research");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(Progress("w1", a, 1).ok());
  EXPECT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);  // $3 of $5
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(Progress("w1", a, 2).ok());  // $6: over
  EXPECT_EQ(Job(a).state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
  EXPECT_THAT(Job(a).state_reason(), HasSubstr("tenant quota: research spent $6"));
  EXPECT_THAT(Job(a).state_reason(), HasSubstr("max_dollars_per_day is $5"));

  absl::StatusOr<int64_t> refused = Submit("research");
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("max_dollars_per_day"));
  EXPECT_TRUE(Submit("dev").ok());  // another tenant is not limited

  // The spend is stored: a restarted tallyd still refuses.
  sched_ = NewScheduler();
  EXPECT_EQ(Submit("research").status().code(), absl::StatusCode::kResourceExhausted);
  // A day later the window has room again.
  clock_.Advance(absl::Hours(25));
  EXPECT_TRUE(Submit("research").ok());
}

TEST_F(QuotaTest, AtTheCapQueuedJobsWaitAndRunningJobsStopAtTheTickWithoutAReport) {
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  const int64_t a = *Submit("research");
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(a).state(), tally::v1::JOB_STATE_RUNNING);
  // Queued behind it (max_gpus 1), then the cap is reached with no report:
  // the tick counts the running job's uncommitted dollars.
  const int64_t b = *Submit("research");
  clock_.Advance(absl::Seconds(6));  // $6 of $5
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(a).state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
  EXPECT_THAT(Job(a).state_reason(), HasSubstr("tenant quota: research"));
  // The freed GPU does not start b: the tenant is at its dollar cap.
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(b).state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_THAT(Job(b).state_reason(),
              HasSubstr("waiting: tenant research is at its max_dollars_per_day"));
  const int64_t events = Job(b).last_event_sequence();
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(b).last_event_sequence(), events);  // said once
  // A day later the window has room: b starts (on the worker, back after
  // the day of silence).
  clock_.Advance(absl::Hours(25));
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(b).state(), tally::v1::JOB_STATE_RUNNING);
}

// The fixture serves report sanity too: progress within an attempt only goes
// forward and never past max_steps; anything else moves nothing.
using ReportSanityTest = QuotaTest;

TEST_F(ReportSanityTest, ProgressBackwardsOrPastMaxStepsMovesNothing) {
  options_.quotas.clear();
  sched_ = NewScheduler();
  ASSERT_TRUE(sched_->OnHello(Hello("w1")).ok());
  const int64_t a = *Submit("");
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Progress("w1", a, 50).ok());
  EXPECT_EQ(sched_->ActiveJobView(a)->step(), 50);
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(Progress("w1", a, 10).ok());    // backwards: dropped
  EXPECT_EQ(sched_->ActiveJobView(a)->step(), 50);
  ASSERT_TRUE(Progress("w1", a, 5000).ok());  // past max_steps 1000: dropped
  EXPECT_EQ(sched_->ActiveJobView(a)->step(), 50);
  ASSERT_TRUE(Progress("w1", a, 60).ok());
  EXPECT_EQ(sched_->ActiveJobView(a)->step(), 60);
}

}  // namespace
}  // namespace tally::sched
