// The scheduler takes a worker's log batch only for an attempt it runs,
// stores it, counts it and wakes log watchers; refusals are counted and the
// stream goes on.
#include <memory>
#include <string>

#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/memory_job_store.h"

namespace tally::sched {
namespace {

tally::v1::WorkerMessage Logs(const std::string& job, int32_t attempt, const std::string& text) {
  tally::v1::WorkerMessage m;
  tally::v1::LogBatch* b = m.mutable_logs();
  b->set_job(job);
  b->set_attempt(attempt);
  auto* l = b->add_lines();
  l->set_text(text);
  l->set_level("info");
  l->set_source("trainer");
  l->mutable_time()->set_seconds(1'700'000'000);
  return m;
}

class SchedulerLogsTest : public ::testing::Test {
 protected:
  SchedulerLogsTest() {
    options_.logs_keep_bytes = 1 << 20;
    sched_ = std::make_unique<Scheduler>(&store_, &channel_, &clock_, &registry_, options_);
    for (const char* w : {"w1", "w2"}) {
      tally::v1::Hello h;
      h.set_worker_id(w);
      h.set_device("cpu");
      h.set_gpu_type("cpu");
      h.set_slots(1);
      EXPECT_TRUE(sched_->OnHello(h).ok());
    }
    auto job = sched_->Submit(TinySpec(), "");
    EXPECT_TRUE(job.ok()) << job.status();
    name_ = job->name();
    EXPECT_TRUE(sched_->Tick().ok());
    runner_ = store_.GetJob(std::stoll(name_.substr(5)))->job().worker_ids(0);
  }
  double Metric(const std::string& key) { return MetricValues(registry_)[key]; }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  RecordingChannel channel_;
  metrics::Registry registry_;
  SchedulerOptions options_;
  std::unique_ptr<Scheduler> sched_;
  std::string name_;
  std::string runner_;
};

TEST_F(SchedulerLogsTest, TheRunningWorkersLinesAreStoredCountedAndWakeWatchers) {
  const int64_t version = sched_->log_notifier()->version();
  ASSERT_TRUE(sched_->OnMessage(runner_, Logs(name_, 1, "step 1")).ok());
  auto lines = store_.ListJobLogs(std::stoll(name_.substr(5)), {});
  ASSERT_TRUE(lines.ok());
  ASSERT_EQ(lines->size(), 1u);
  EXPECT_EQ((*lines)[0].text(), "step 1");
  EXPECT_EQ((*lines)[0].sequence(), 1);
  EXPECT_EQ(Metric("tally_job_log_lines_total,source=trainer"), 1);
  EXPECT_NE(sched_->log_notifier()->version(), version);
}

TEST_F(SchedulerLogsTest, AnotherWorkersOrABadBatchIsRefusedAndCounted) {
  const std::string other = runner_ == "w1" ? "w2" : "w1";
  EXPECT_TRUE(sched_->OnMessage(other, Logs(name_, 1, "not yours")).ok());
  EXPECT_TRUE(sched_->OnMessage(runner_, Logs(name_, 7, "stale attempt")).ok());
  EXPECT_EQ(Metric("tally_worker_reports_refused_total,kind=logs"), 2);
  tally::v1::WorkerMessage bad = Logs(name_, 1, "x");
  bad.mutable_logs()->mutable_lines(0)->set_level("shout");
  EXPECT_TRUE(sched_->OnMessage(runner_, bad).ok()) << "acknowledged, dropped";
  EXPECT_EQ(Metric("tally_worker_reports_refused_total,kind=logs_invalid"), 1);
  EXPECT_TRUE(store_.ListJobLogs(std::stoll(name_.substr(5)), {})->empty());
}

}  // namespace
}  // namespace tally::sched
