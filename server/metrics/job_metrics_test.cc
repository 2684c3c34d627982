#include "server/metrics/job_metrics.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/metrics/text_serializer.h"

namespace tally::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

tally::v1::Job Running() {
  tally::v1::Job j;
  j.set_name("jobs/7");
  j.set_state(tally::v1::JOB_STATE_RUNNING);
  j.set_step(42);
  j.mutable_cost()->set_cost_usd(1.5);
  j.mutable_spec()->mutable_budget()->set_max_dollars(3.0);
  j.mutable_forecast()->set_valid(true);
  j.mutable_forecast()->set_final_val_loss(2.5);
  j.mutable_forecast()->set_low(2.4);
  j.mutable_forecast()->set_high(2.6);
  j.set_target_val_loss(2.45);
  return j;
}

TEST(JobMetricsTest, ARunningJobsSeriesGoWhenItEnds) {
  Registry registry;
  JobMetrics m(&registry);
  tally::v1::Job j = Running();
  m.Update(j);
  tally::v1::Progress p;
  p.set_trained(true);
  p.set_useful_tokens_per_second(1000);
  auto* layer = p.add_moe();
  layer->set_layer(1);
  layer->add_tokens_per_expert(10);
  layer->add_tokens_per_expert(30);
  m.OnProgress(j, p);
  std::string text = SerializeText(registry.Collect());
  EXPECT_THAT(text, HasSubstr("tally_job_step{tally_job=\"jobs/7\"} 42"));
  EXPECT_THAT(text, HasSubstr("tally_job_budget_used_ratio{tally_job=\"jobs/7\"} 0.5"));
  EXPECT_THAT(text, HasSubstr("tally_job_forecast_val_loss{bound=\"low\",tally_job=\"jobs/7\"} 2.4"));
  EXPECT_THAT(text, HasSubstr("tally_job_target_val_loss{tally_job=\"jobs/7\"} 2.45"));
  EXPECT_THAT(text, HasSubstr("tally_job_moe_expert_tokens{expert=\"1\",layer=\"1\",tally_job=\"jobs/7\"} 30"));
  j.set_state(tally::v1::JOB_STATE_SUCCEEDED);
  m.Update(j);
  text = SerializeText(registry.Collect());
  EXPECT_THAT(text, Not(HasSubstr("jobs/7")));
}

TEST(JobMetricsTest, QueuedJobsAndReportsOfEndedJobsMakeNoSeries) {
  Registry registry;
  JobMetrics m(&registry);
  tally::v1::Job j = Running();
  j.set_state(tally::v1::JOB_STATE_QUEUED);
  m.Update(j);
  tally::v1::Progress p;
  p.set_trained(true);
  m.OnProgress(j, p);
  EXPECT_THAT(SerializeText(registry.Collect()), Not(HasSubstr("jobs/7")));
}

}  // namespace
}  // namespace tally::metrics
