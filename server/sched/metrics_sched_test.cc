// The scheduler's metrics across a restart and across worker departures:
// ended jobs' series are rebuilt from the store for what is left of their
// retention, and a worker that leaves cleanly is counted by cause, not lost.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/sched/scheduler.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/memory_job_store.h"

namespace tally::sched {
namespace {

tally::v1::Hello CpuHello(const std::string& id, int slots = 1) {
  tally::v1::Hello h;
  h.set_worker_id(id);
  h.set_device("cpu");
  h.set_gpu_type("cpu");
  h.set_slots(slots);
  return h;
}

class MetricsSchedTest : public ::testing::Test {
 protected:
  MetricsSchedTest() { sched_ = NewScheduler(); }
  std::unique_ptr<Scheduler> NewScheduler() {
    registries_.push_back(std::make_unique<metrics::Registry>());
    return std::make_unique<Scheduler>(&store_, &channel_, &clock_, registries_.back().get(),
                                       options_);
  }
  int64_t Submit() {
    auto job = sched_->Submit(TinySpec(), "");
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? std::stoll(job->name().substr(5)) : 0;
  }
  absl::Status Send(const std::string& worker, const tally::v1::WorkerMessage& m) {
    return sched_->OnMessage(worker, m);
  }
  absl::Status Exit(const std::string& worker, int64_t id, tally::v1::AttemptOutcome outcome,
                    const std::string& cause = "") {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job("jobs/" + std::to_string(id));
    m.mutable_exit()->set_attempt(1);
    m.mutable_exit()->set_outcome(outcome);
    m.mutable_exit()->set_reason("test");
    m.mutable_exit()->set_preemption_cause(cause);
    return Send(worker, m);
  }
  absl::Status Notice(const std::string& worker, const std::string& cause) {
    tally::v1::WorkerMessage m;
    m.mutable_notice()->set_cause(cause);
    m.mutable_notice()->set_deadline_seconds(30);
    return Send(worker, m);
  }
  std::map<std::string, double> Values() { return MetricValues(*registries_.back()); }
  // The series of `family` labelled tally_job=jobs/<id> (and `also`, if set).
  std::vector<std::string> JobSeries(const std::string& family, int64_t id,
                                     const std::string& also = "") {
    std::vector<std::string> out;
    for (const auto& [key, value] : Values()) {
      if (absl::StartsWith(key, family + ",") &&
          absl::StrContains(key, ",tally_job=jobs/" + std::to_string(id)) &&
          absl::StrContains(key, also)) {
        out.push_back(key);
      }
    }
    return out;
  }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  RecordingChannel channel_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(MetricsSchedTest, EndedJobsSeriesSurviveARestartForTheRestOfTheirRetention) {
  const int64_t a = Submit();
  const int64_t b = Submit();
  const int64_t never_ran = Submit();
  ASSERT_TRUE(sched_->OnHello(CpuHello("w1", 2)).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(store_.GetJob(a)->job().state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(store_.GetJob(b)->job().state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Exit("w1", a, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());  // a ends at T
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(sched_->Cancel(b, "enough").ok());  // b ends at T+10m
  ASSERT_TRUE(sched_->Cancel(never_ran, "enough").ok());
  const auto before = Values();
  const std::string a_succeeded =
      "tally_job_attempts_ended_total,outcome=succeeded,tally_job=jobs/" + std::to_string(a);
  ASSERT_EQ(before.at(a_succeeded), 1);
  // Every outcome's series exists from the start, preempted included.
  EXPECT_EQ(before.at("tally_job_attempts_ended_total,outcome=preempted,tally_job=jobs/" +
                      std::to_string(a)),
            0);

  // tallyd restarts at T+10m: a new scheduler over the same store.
  clock_.Advance(absl::Seconds(1));
  sched_ = NewScheduler();
  ASSERT_TRUE(sched_->Recover().ok());
  auto after = Values();
  EXPECT_EQ(JobSeries("tally_job_info", a, "state=succeeded").size(), 1u);
  EXPECT_EQ(JobSeries("tally_job_info", b, "state=cancelled").size(), 1u);
  EXPECT_EQ(JobSeries("tally_job_info", never_ran, "state=cancelled").size(), 1u);
  // Counters come back at the values they had: no reset for increase().
  EXPECT_EQ(after[a_succeeded], 1);
  // Every series a had before the restart is back, with its value.
  for (const auto& [key, value] : before) {
    if (!absl::StrContains(key, "tally_job=jobs/" + std::to_string(a))) continue;
    if (absl::StartsWith(key, "tally_job_tokens_total")) continue;  // from the record
    ASSERT_EQ(after.count(key), 1u) << key;
    EXPECT_EQ(after[key], value) << key;
  }

  // Retention is measured from each job's end, not from the restart.
  clock_.Advance(absl::Minutes(5));  // T+15m1s
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_TRUE(JobSeries("tally_job_info", a).empty()) << "a ended 15 minutes ago";
  EXPECT_EQ(JobSeries("tally_job_info", b).size(), 1u) << "b ended 5 minutes ago";

  // A restart after a's retention rebuilds b only.
  sched_ = NewScheduler();
  ASSERT_TRUE(sched_->Recover().ok());
  EXPECT_TRUE(JobSeries("tally_job_info", a).empty());
  EXPECT_EQ(JobSeries("tally_job_info", b).size(), 1u);
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_TRUE(JobSeries("tally_job_info", b).empty());
}

TEST_F(MetricsSchedTest, LostAttemptsAreCountedAgainAfterARestart) {
  options_.heartbeat_timeout = absl::Seconds(10);
  sched_ = NewScheduler();
  tally::v1::JobSpec spec = TinySpec();
  spec.set_max_attempts(1);
  auto job = sched_->Submit(spec, "");
  ASSERT_TRUE(job.ok());
  const int64_t id = std::stoll(job->name().substr(5));
  ASSERT_TRUE(sched_->OnHello(CpuHello("w1")).ok());
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Seconds(11));  // w1 silent: its attempt is lost, the job fails
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(store_.GetJob(id)->job().state(), tally::v1::JOB_STATE_FAILED);
  const std::string lost =
      "tally_job_attempts_ended_total,outcome=lost,tally_job=jobs/" + std::to_string(id);
  ASSERT_EQ(Values()[lost], 1);
  sched_ = NewScheduler();
  ASSERT_TRUE(sched_->Recover().ok());
  EXPECT_EQ(Values()[lost], 1) << "TallyJobAttemptsLost keeps its increase";
}

TEST_F(MetricsSchedTest, CleanExitsAreCountedByCauseAndNotAsLost) {
  options_.heartbeat_timeout = absl::Seconds(10);
  sched_ = NewScheduler();
  auto values = [&] { return Values(); };
  const std::string lost = "tally_workers_lost_total,gpu_type=cpu";
  auto exits = [&](const std::string& cause) {
    return values()["tally_worker_exits_total,cause=" + cause + ",gpu_type=cpu"];
  };

  // Scale to zero: an idle worker's --exit_when_idle notice, then its stream ends.
  absl::StatusOr<int64_t> idle = sched_->OnHello(CpuHello("idle"));
  ASSERT_TRUE(idle.ok());
  ASSERT_TRUE(Notice("idle", "idle").ok());
  sched_->OnDisconnect("idle", *idle);
  EXPECT_EQ(exits("idle"), 1);

  // A pod deleted under a running attempt: SIGTERM, the attempt checkpoints
  // and is handed back (preempted), then the stream ends.
  const int64_t job = Submit();
  absl::StatusOr<int64_t> busy = sched_->OnHello(CpuHello("busy"));
  ASSERT_TRUE(busy.ok());
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(store_.GetJob(job)->job().state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Notice("busy", "sigterm").ok());
  ASSERT_TRUE(Exit("busy", job, tally::v1::ATTEMPT_OUTCOME_PREEMPTED, "sigterm").ok());
  sched_->OnDisconnect("busy", *busy);
  EXPECT_EQ(exits("sigterm"), 1);

  // Past the heartbeat timeout neither is counted again, as lost.
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(values()[lost], 0);
  EXPECT_EQ(exits("idle"), 1);
  EXPECT_EQ(exits("sigterm"), 1);

  // A stream that breaks without a notice, and one that ends after a notice
  // while its attempt was still held: both lost, neither a clean exit.
  absl::StatusOr<int64_t> broken = sched_->OnHello(CpuHello("broken"));
  ASSERT_TRUE(broken.ok());
  sched_->OnDisconnect("broken", *broken);
  absl::StatusOr<int64_t> hasty = sched_->OnHello(CpuHello("hasty"));
  ASSERT_TRUE(hasty.ok());
  ASSERT_TRUE(sched_->Tick().ok());  // the requeued job starts on hasty
  ASSERT_EQ(store_.GetJob(job)->job().state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(Notice("hasty", "notice_file").ok());
  sched_->OnDisconnect("hasty", *hasty);
  EXPECT_EQ(exits("notice_file"), 0);
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(values()[lost], 2);
  EXPECT_EQ(exits("notice_file"), 0);
  EXPECT_EQ(exits("idle") + exits("sigterm") + exits("sigint"), 2);
}

}  // namespace
}  // namespace tally::sched
