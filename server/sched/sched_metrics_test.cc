// SchedMetrics on its own: what a committed plan moves, the refusal and
// worker counters, and the gauges' series (kept at 0, or dropped).
#include "server/sched/sched_metrics.h"

#include <map>
#include <string>

#include "gtest/gtest.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/memory_job_store.h"

namespace tally::sched {
namespace {

class SchedMetricsTest : public ::testing::Test {
 protected:
  std::map<std::string, double> Values() { return MetricValues(registry_); }
  metrics::Registry registry_;
  store::InMemoryJobStore store_;
  SchedMetrics metrics_{&registry_, &store_, {}};
};

TEST_F(SchedMetricsTest, ACommittedPlanMovesWhatItSays) {
  metrics_.AddGpuType("h100");
  tally::v1::Job job;
  job.set_name("jobs/1");
  job.mutable_spec()->mutable_resources()->set_gpu_type("h100");
  job.set_state(tally::v1::JOB_STATE_EARLY_STOPPED);
  Plan plan;
  plan.transitions = {tally::v1::JOB_STATE_EARLY_STOPPED};
  plan.attempts_ended = {"stopped"};
  plan.finished = true;
  plan.end_rule = "patience";
  plan.early_stop_rule = "patience";
  plan.cost_added_usd = 1.5;
  plan.redone_added_usd = 0.25;
  plan.preemption_cause = "priority";
  plan.queue_wait_seconds = 3;
  metrics_.OnPlanCommitted(plan, job);

  auto v = Values();
  EXPECT_EQ(v["tally_job_transitions_total,state=early_stopped"], 1);
  EXPECT_EQ(v["tally_attempts_ended_total,outcome=stopped"], 1);
  EXPECT_EQ(v["tally_job_ends_total,reason_rule=patience,state=early_stopped"], 1);
  EXPECT_EQ(v["tally_early_stops_total,rule=patience"], 1);
  EXPECT_DOUBLE_EQ(v["tally_cost_dollars_total,gpu_type=h100"], 1.5);
  EXPECT_DOUBLE_EQ(v["tally_cost_redone_dollars_total,gpu_type=h100"], 0.25);
  EXPECT_EQ(v["tally_cost_lost_dollars_total,gpu_type=h100"], 0);
  EXPECT_EQ(v["tally_preemptions_total,cause=priority,gpu_type=h100"], 1);
  EXPECT_EQ(v["tally_queue_wait_seconds"], 1);  // one observation

  // A plan that names no end rule ends by its state's default.
  job.set_state(tally::v1::JOB_STATE_SUCCEEDED);
  Plan done;
  done.finished = true;
  metrics_.OnPlanCommitted(done, job);
  EXPECT_EQ(Values()["tally_job_ends_total,reason_rule=max_steps,state=succeeded"], 1);
  EXPECT_EQ(DefaultEndRule(tally::v1::JOB_STATE_CANCELLED), "cancel");
  EXPECT_EQ(StateLabel(tally::v1::JOB_STATE_BUDGET_EXHAUSTED), "budget_exhausted");
}

TEST_F(SchedMetricsTest, RefusalsAndWorkersAreCountedByLabel) {
  metrics_.OnReportRefused("repeated");
  metrics_.OnReportRefused("repeated");
  metrics_.OnWorkerLost("");
  metrics_.OnWorkerExited("a100", "sigterm");
  metrics_.OnSubmitted();
  auto v = Values();
  EXPECT_EQ(v["tally_worker_reports_refused_total,kind=repeated"], 2);
  EXPECT_EQ(v["tally_worker_reports_refused_total,kind=invalid"], 0);  // listed at 0
  EXPECT_EQ(v["tally_workers_lost_total,gpu_type=unknown"], 1);
  EXPECT_EQ(v["tally_worker_exits_total,cause=sigterm,gpu_type=a100"], 1);
  EXPECT_EQ(v["tally_job_transitions_total,state=queued"], 1);
}

TEST_F(SchedMetricsTest, TenantGaugesFollowTheQuotaTheyAreGiven) {
  ledger::TenantQuota q;
  q.max_gpus = 4;
  q.max_dollars_per_day = 10;
  metrics_.SetTenant("acme", 2.5, 7.5, 3, &q);
  metrics_.SetTenant("solo", 1, 1, 0, nullptr);
  auto v = Values();
  EXPECT_EQ(v["tally_tenant_spend_usd,tenant=acme,window=day"], 2.5);
  EXPECT_EQ(v["tally_tenant_spend_usd,tenant=acme,window=month"], 7.5);
  EXPECT_EQ(v["tally_tenant_gpus,state=in_use,tenant=acme"], 3);
  EXPECT_EQ(v["tally_tenant_gpus,state=quota,tenant=acme"], 4);
  EXPECT_EQ(v["tally_tenant_quota_usd,tenant=acme,window=day"], 10);
  EXPECT_EQ(v.count("tally_tenant_quota_usd,tenant=acme,window=month"), 0u);  // no such quota
  EXPECT_EQ(v.count("tally_tenant_gpus,state=quota,tenant=solo"), 0u);
}

TEST_F(SchedMetricsTest, FleetSeriesStayAtZeroAndScaleSeriesOfGoneTypesGo) {
  WorkerRegistry workers(absl::Seconds(10));
  WorkerState& w = workers.Add("w1");
  w.rec.set_gpu_type("h100");
  w.rec.set_slots(2);
  w.connected = true;
  workers.Hold("w1", {1, 1}, 1);
  metrics_.SetFleet(workers);
  auto v = Values();
  EXPECT_EQ(v["tally_workers,gpu_type=h100,state=connected"], 1);
  EXPECT_EQ(v["tally_worker_slots,gpu_type=h100,state=used"], 1);
  EXPECT_EQ(v["tally_worker_slots,gpu_type=h100,state=free"], 1);
  workers.Forget("w1");
  metrics_.SetFleet(workers);
  v = Values();
  EXPECT_EQ(v.count("tally_workers,gpu_type=h100,state=connected"), 1u);  // kept, at 0
  EXPECT_EQ(v["tally_workers,gpu_type=h100,state=connected"], 0);

  metrics_.SetScale({{"h100", 8}}, {{"h100", 1}, {"a100", 0}});
  v = Values();
  EXPECT_EQ(v["tally_gpus_wanted,gpu_type=h100"], 8);
  EXPECT_EQ(v["tally_gpus_wanted,gpu_type=a100"], 0);
  EXPECT_EQ(v["tally_workers_idle,gpu_type=h100"], 1);
  metrics_.SetScale({{"h100", 2}}, {});
  v = Values();
  EXPECT_EQ(v.count("tally_gpus_wanted,gpu_type=a100"), 0u);  // dropped
  EXPECT_EQ(v["tally_gpus_wanted,gpu_type=h100"], 2);
  metrics_.SetQueueDepth(5);
  EXPECT_EQ(Values()["tally_queue_depth"], 5);
}

}  // namespace
}  // namespace tally::sched
