#include "server/metrics/job_metrics.h"

#include <map>
#include <sstream>
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
  j.set_attempt(1);
  j.set_step(42);
  j.set_val_loss(2.7);
  j.mutable_early_stopping()->set_has_best(true);
  j.mutable_early_stopping()->set_best_val_loss(2.6);
  j.mutable_cost()->set_cost_usd(1.5);
  j.mutable_spec()->set_display_name("tiny run");
  j.mutable_spec()->mutable_resources()->set_gpu_type("h200");
  j.mutable_spec()->mutable_budget()->set_max_dollars(3.0);
  (*j.mutable_spec()->mutable_labels())["team"] = "search";
  j.mutable_forecast()->set_valid(true);
  j.mutable_forecast()->set_final_val_loss(2.5);
  j.mutable_forecast()->set_low(2.4);
  j.mutable_forecast()->set_high(2.6);
  j.set_target_val_loss(2.45);
  return j;
}

tally::v1::Job Ended(tally::v1::Job j, tally::v1::JobState state, int64_t end_seconds) {
  j.set_state(state);
  j.mutable_end_time()->set_seconds(end_seconds);
  return j;
}

// name{labels} -> value, with the labels as the serializer writes them.
std::map<std::string, double> Series(const Registry& registry) {
  std::map<std::string, double> out;
  std::istringstream text(SerializeText(registry.Collect()));
  for (std::string line; std::getline(text, line);) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

tally::v1::Progress Report(int32_t attempt, int64_t tokens, int64_t padding = 0,
                           int64_t overflows = 0) {
  tally::v1::Progress p;
  p.set_trained(true);
  p.set_attempt(attempt);
  p.set_tokens(tokens);
  p.set_padding_tokens(padding);
  p.set_fp8_overflows(overflows);
  p.set_useful_tokens_per_second(1000);
  return p;
}

TEST(JobMetricsTest, ARunningJobsSeries) {
  Registry registry;
  JobMetrics m(&registry);
  tally::v1::Job j = Running();
  m.Update(j);
  tally::v1::Progress p = Report(1, 0);
  auto* layer = p.add_moe();
  layer->set_layer(1);
  layer->add_tokens_per_expert(10);
  layer->add_tokens_per_expert(30);
  m.OnProgress(j, p);
  const std::string text = SerializeText(registry.Collect());
  EXPECT_THAT(text, HasSubstr("tally_job_step{tally_job=\"jobs/7\"} 42"));
  EXPECT_THAT(text, HasSubstr("tally_job_budget_used_ratio{tally_job=\"jobs/7\"} 0.5"));
  EXPECT_THAT(text, HasSubstr("tally_job_forecast_val_loss{bound=\"low\",tally_job=\"jobs/7\"} 2.4"));
  EXPECT_THAT(text, HasSubstr("tally_job_target_val_loss{tally_job=\"jobs/7\"} 2.45"));
  EXPECT_THAT(text, HasSubstr("tally_job_moe_expert_tokens{expert=\"1\",layer=\"1\",tally_job=\"jobs/7\"} 30"));
  EXPECT_THAT(text, HasSubstr("tally_job_info{display_name=\"tiny run\",gpu_type=\"h200\","
                              "state=\"running\",tally_job=\"jobs/7\"} 1"));
  // Counters of a job exist at 0 from its start, so the first event shows.
  EXPECT_THAT(text, HasSubstr("tally_job_attempts_ended_total{outcome=\"lost\",tally_job=\"jobs/7\"} 0"));
  EXPECT_THAT(text, HasSubstr("# TYPE tally_job_tokens_total counter"));
}

TEST(JobMetricsTest, FinalValuesStayForTheRetentionThenEverySeriesGoes) {
  Registry registry;
  JobMetricsOptions o;
  o.retention = absl::Minutes(15);
  JobMetrics m(&registry, o);
  tally::v1::Job j = Running();
  m.OnAttemptStarted(j);
  m.Update(j);
  m.OnProgress(j, Report(1, 100));
  // It spends its whole budget, and its last evaluation improved.
  j.mutable_cost()->set_cost_usd(3.0);
  j.set_step(50);
  j.set_val_loss(2.55);
  j.mutable_early_stopping()->set_best_val_loss(2.55);
  const absl::Time end = absl::FromUnixSeconds(1000);
  m.Update(Ended(j, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, 1000));
  m.Expire(end + absl::Minutes(15) - absl::Seconds(1));
  auto s = Series(registry);
  EXPECT_EQ(s["tally_job_step{tally_job=\"jobs/7\"}"], 50);
  EXPECT_EQ(s["tally_job_budget_used_ratio{tally_job=\"jobs/7\"}"], 1.0);
  EXPECT_EQ(s["tally_job_best_val_loss{tally_job=\"jobs/7\"}"], 2.55);
  EXPECT_EQ(s["tally_job_val_loss{tally_job=\"jobs/7\"}"], 2.55);
  EXPECT_EQ(s["tally_job_cost_dollars{tally_job=\"jobs/7\"}"], 3.0);
  EXPECT_EQ(s["tally_job_tokens_total{kind=\"useful\",tally_job=\"jobs/7\"}"], 100);
  // An ended job computes nothing: summing throughput stays right.
  EXPECT_EQ(s["tally_job_useful_tokens_per_second{tally_job=\"jobs/7\"}"], 0);
  EXPECT_EQ(s.count("tally_job_info{display_name=\"tiny run\",gpu_type=\"h200\","
                    "state=\"budget_exhausted\",tally_job=\"jobs/7\"}"),
            1u);
  EXPECT_EQ(s.count("tally_job_info{display_name=\"tiny run\",gpu_type=\"h200\","
                    "state=\"running\",tally_job=\"jobs/7\"}"),
            0u)
      << "one info series per job";
  EXPECT_EQ(m.NumJobs(), 1u);
  // A later report or commit of the ended job changes nothing.
  m.OnProgress(Ended(j, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, 1000), Report(1, 500));
  EXPECT_EQ(Series(registry)["tally_job_tokens_total{kind=\"useful\",tally_job=\"jobs/7\"}"], 100);
  m.Expire(end + absl::Minutes(15));
  EXPECT_THAT(SerializeText(registry.Collect()), Not(HasSubstr("jobs/7")));
  EXPECT_EQ(m.NumJobs(), 0u);
}

// tally_job_quantized_val_loss: only for a job evaluated quantized, with the
// val_loss gauge's lifetime (final value kept for the retention, then gone,
// rebuilt by a restart within it).
TEST(JobMetricsTest, TheQuantizedLossIsAGaugeOfJobsThatHaveOne) {
  Registry registry;
  JobMetrics m(&registry);  // 15 minutes
  tally::v1::Job j = Running();
  m.Update(j);
  EXPECT_THAT(SerializeText(registry.Collect()),
              Not(HasSubstr("tally_job_quantized_val_loss{")))
      << "absent is not 0";
  EXPECT_THAT(SerializeText(registry.Collect()),
              HasSubstr("# HELP tally_job_quantized_val_loss Latest quantized validation loss"));
  j.set_quantized_val_loss(2.78);
  m.Update(j);
  EXPECT_EQ(Series(registry)["tally_job_quantized_val_loss{tally_job=\"jobs/7\"}"], 2.78);
  j.set_quantized_val_loss(2.74);
  const absl::Time end = absl::FromUnixSeconds(1000);
  m.Update(Ended(j, tally::v1::JOB_STATE_SUCCEEDED, 1000));
  m.Expire(end + absl::Minutes(15) - absl::Seconds(1));
  EXPECT_EQ(Series(registry)["tally_job_quantized_val_loss{tally_job=\"jobs/7\"}"], 2.74);
  m.Expire(end + absl::Minutes(15));
  EXPECT_THAT(SerializeText(registry.Collect()), Not(HasSubstr("jobs/7")));
  // A restart within the retention brings the final value back.
  Registry after_restart;
  JobMetrics restored(&after_restart);
  restored.RestoreEnded(Ended(j, tally::v1::JOB_STATE_SUCCEEDED, 1000), {},
                        end + absl::Minutes(5));
  EXPECT_EQ(Series(after_restart)["tally_job_quantized_val_loss{tally_job=\"jobs/7\"}"], 2.74);
}

TEST(JobMetricsTest, ZeroRetentionRemovesAtOnce) {
  Registry registry;
  JobMetricsOptions o;
  o.retention = absl::ZeroDuration();
  JobMetrics m(&registry, o);
  tally::v1::Job j = Running();
  m.Update(j);
  m.OnProgress(j, Report(1, 10));
  m.Update(Ended(j, tally::v1::JOB_STATE_SUCCEEDED, 1000));
  EXPECT_THAT(SerializeText(registry.Collect()), Not(HasSubstr("jobs/7")));
}

TEST(JobMetricsTest, AJobThatNeverRanHasOnlyItsInfo) {
  Registry registry;
  JobMetrics m(&registry);
  tally::v1::Job j = Running();
  j.set_state(tally::v1::JOB_STATE_QUEUED);
  j.set_attempt(0);
  m.Update(j);
  m.OnProgress(j, Report(1, 10));
  auto s = Series(registry);
  EXPECT_EQ(s.count("tally_job_info{display_name=\"tiny run\",gpu_type=\"h200\","
                    "state=\"queued\",tally_job=\"jobs/7\"}"),
            1u);
  // Its attempt counters exist at 0 while it waits: a first attempt that
  // fails as it starts is an increase Prometheus can see.
  EXPECT_EQ(s.count("tally_job_attempts_ended_total{outcome=\"failed\",tally_job=\"jobs/7\"}"),
            1u);
  m.Update(Ended(j, tally::v1::JOB_STATE_CANCELLED, 5));
  const std::string text = SerializeText(registry.Collect());
  EXPECT_THAT(text, HasSubstr("state=\"cancelled\",tally_job=\"jobs/7\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("tally_job_step{")));
  EXPECT_THAT(text, Not(HasSubstr("tally_job_tokens_total{")));
}

TEST(JobMetricsTest, InfoCarriesTheChosenSpecLabelsBounded) {
  Registry registry;
  JobMetricsOptions o;
  o.info_labels = {"team", "project"};
  JobMetrics m(&registry, o);
  tally::v1::Job j = Running();
  j.mutable_spec()->set_display_name(std::string(200, 'x') + "\xc3\xa9");
  m.Update(j);
  const std::string text = SerializeText(registry.Collect());
  EXPECT_THAT(text, HasSubstr("display_name=\"" + std::string(128, 'x') + "\",gpu_type=\"h200\","
                              "label_project=\"\",label_team=\"search\",state=\"running\""));
}

TEST(JobMetricsTest, InfoNamesTheRuleThatStoppedTheJob) {
  Registry registry;
  JobMetrics m(&registry);
  tally::v1::Job j = Running();
  m.Update(j);
  j.mutable_early_stopping()->set_stop_rule("divergence");
  m.Update(Ended(j, tally::v1::JOB_STATE_EARLY_STOPPED, 9));
  const std::string text = SerializeText(registry.Collect());
  EXPECT_THAT(text, HasSubstr("state=\"early_stopped\",stop_rule=\"divergence\",tally_job=\"jobs/7\"} 1"));
}

TEST(JobMetricsTest, OptionsAreValidatedNamingTheFlag) {
  JobMetricsOptions o;
  EXPECT_TRUE(ValidateJobMetricsOptions(o).ok());
  o.info_labels = {"team", "9lives"};
  EXPECT_THAT(std::string(ValidateJobMetricsOptions(o).message()),
              HasSubstr("--job_info_labels: \"9lives\""));
  o.info_labels = {"team", "team"};
  EXPECT_THAT(std::string(ValidateJobMetricsOptions(o).message()), HasSubstr("listed twice"));
  o.info_labels = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
  EXPECT_THAT(std::string(ValidateJobMetricsOptions(o).message()), HasSubstr("at most 8"));
  o.info_labels.clear();
  o.retention = absl::Seconds(-1);
  EXPECT_THAT(std::string(ValidateJobMetricsOptions(o).message()),
              HasSubstr("--job_metrics_retention"));
  o.retention = absl::Minutes(1);
  o.max_expert_series = -1;
  EXPECT_THAT(std::string(ValidateJobMetricsOptions(o).message()),
              HasSubstr("--moe_expert_series_max"));
}

TEST(JobMetricsTest, TokensCountComputedWorkAcrossAttempts) {
  Registry registry;
  JobMetrics m(&registry);
  m.AddGpuType("h200");
  tally::v1::Job j = Running();
  auto useful = [&] {
    return Series(registry)["tally_job_tokens_total{kind=\"useful\",tally_job=\"jobs/7\"}"];
  };
  auto fleet = [&] {
    return Series(registry)["tally_tokens_total{gpu_type=\"h200\",kind=\"useful\"}"];
  };
  EXPECT_EQ(Series(registry).count("tally_tokens_total{gpu_type=\"h200\",kind=\"padding\"}"), 1u);
  m.OnAttemptStarted(j);
  m.Update(j);
  m.OnProgress(j, Report(1, 100, 10));  // the first attempt counts from 0
  m.OnProgress(j, Report(1, 250, 20));
  EXPECT_EQ(useful(), 250);
  EXPECT_EQ(fleet(), 250);
  EXPECT_EQ(Series(registry)["tally_tokens_total{gpu_type=\"h200\",kind=\"padding\"}"], 20);
  // Attempt 2 resumes from a checkpoint at 200 tokens: its first report is
  // its starting point, then it redoes 50 and does 100 more.
  j.set_attempt(2);
  m.OnAttemptStarted(j);
  m.OnProgress(j, Report(2, 210));
  m.OnProgress(j, Report(2, 350));
  EXPECT_EQ(useful(), 390);
  // A report going backwards (a restarted process) is not negative work.
  m.OnProgress(j, Report(2, 300));
  m.OnProgress(j, Report(2, 310));
  EXPECT_EQ(useful(), 400);
  EXPECT_EQ(fleet(), 400);
}

TEST(JobMetricsTest, AnAdoptedAttemptCountsFromItsFirstReport) {
  // tallyd restarted: the attempt's earlier tokens were counted by the
  // previous process; counting them again would be a spike in rate().
  Registry registry;
  JobMetrics m(&registry);
  tally::v1::Job j = Running();
  m.Update(j);
  m.OnProgress(j, Report(1, 5000));
  m.OnProgress(j, Report(1, 5100));
  EXPECT_EQ(Series(registry)["tally_job_tokens_total{kind=\"useful\",tally_job=\"jobs/7\"}"], 100);
}

TEST(JobMetricsTest, Fp8OverflowsAndValuesCastAreCountersOverAttempts) {
  Registry registry;
  JobMetrics m(&registry);
  m.AddGpuType("h200");
  tally::v1::Job j = Running();
  j.mutable_spec()->mutable_precision()->set_compute(tally::v1::PRECISION_FP8);
  m.OnAttemptStarted(j);
  m.Update(j);
  auto s = Series(registry);
  EXPECT_EQ(s.count("tally_job_fp8_overflows_total{tally_job=\"jobs/7\"}"), 1u)
      << "created at 0 for an FP8 job";
  EXPECT_EQ(s.count("tally_job_fp8_values_total{tally_job=\"jobs/7\"}"), 1u);
  EXPECT_EQ(s.count("tally_fp8_values_total{gpu_type=\"h200\"}"), 1u);
  auto p = Report(1, 100, 0, 7);
  p.set_fp8_product_fraction(1);
  p.set_fp8_values(1000);
  m.OnProgress(j, p);
  p.set_fp8_overflows(12);
  p.set_fp8_values(2000);
  m.OnProgress(j, p);
  j.set_attempt(2);
  m.OnAttemptStarted(j);
  p.set_attempt(2);
  p.set_fp8_overflows(3);  // per attempt: counts from 0 again
  p.set_fp8_values(500);
  m.OnProgress(j, p);
  s = Series(registry);
  EXPECT_EQ(s["tally_job_fp8_overflows_total{tally_job=\"jobs/7\"}"], 15);
  EXPECT_EQ(s["tally_fp8_overflows_total{gpu_type=\"h200\"}"], 15);
  EXPECT_EQ(s["tally_job_fp8_values_total{tally_job=\"jobs/7\"}"], 2500);
  EXPECT_EQ(s["tally_fp8_values_total{gpu_type=\"h200\"}"], 2500);
  // An attempt adopted after a restart (its start not seen here) counts from
  // its first report; one that goes backwards starts afresh, never negative.
  Registry restarted;
  JobMetrics adopted(&restarted);
  p.set_fp8_overflows(40);
  p.set_fp8_values(9000);
  adopted.OnProgress(j, p);
  p.set_fp8_overflows(41);
  p.set_fp8_values(9600);
  adopted.OnProgress(j, p);
  p.set_fp8_overflows(2);
  p.set_fp8_values(100);
  adopted.OnProgress(j, p);
  p.set_fp8_overflows(5);
  p.set_fp8_values(300);
  adopted.OnProgress(j, p);
  s = Series(restarted);
  EXPECT_EQ(s["tally_job_fp8_overflows_total{tally_job=\"jobs/7\"}"], 4);
  EXPECT_EQ(s["tally_job_fp8_values_total{tally_job=\"jobs/7\"}"], 800);
}

TEST(JobMetricsTest, AttemptsEndedPerJob) {
  Registry registry;
  JobMetrics m(&registry);
  tally::v1::Job j = Running();
  m.Update(j);
  m.OnAttemptEnded(j, "lost");
  auto s = Series(registry);
  EXPECT_EQ(s["tally_job_attempts_ended_total{outcome=\"lost\",tally_job=\"jobs/7\"}"], 1);
  EXPECT_EQ(s["tally_job_attempts_ended_total{outcome=\"failed\",tally_job=\"jobs/7\"}"], 0);
}

tally::v1::MoeLayerLoad Load(std::vector<int64_t> tokens) {
  tally::v1::MoeLayerLoad l;
  l.set_layer(3);
  for (int64_t n : tokens) l.add_tokens_per_expert(n);
  return l;
}

TEST(AssessMoeLayerTest, SharesAreNormalisedByKOverE) {
  struct Case {
    std::vector<int64_t> tokens;
    int top_k;
    bool collapsed;
    int idle;
    const char* why;
  };
  const std::vector<Case> cases = {
      {{250, 250, 250, 250}, 2, false, 0, "balanced, E=4 k=2"},
      {{300, 280, 400, 20}, 2, true, 1,
       "one expert at 4% of tokens (fair 50%): the collapse the old max-share > 0.5 rule missed"},
      {{500, 500, 0, 0}, 2, true, 2, "two experts idle"},
      {{500, 300, 100, 100}, 2, true, 0, "busiest takes every token (limit 75% for E=4 k=2)"},
      {{350, 300, 200, 150}, 2, false, 0, "busiest at 70% of tokens, under the 75% limit"},
      {std::vector<int64_t>(64, 32), 2, false, 0, "E=64 balanced"},
      {[] {
         std::vector<int64_t> v(64, 32);
         v[0] = 32 * 4;  // 4x fair, 12.5% of tokens
         v[1] = 0;
         for (int i = 2; i < 5; ++i) v[i] = 0;
         return v;
       }(),
       2, true, 4, "E=64: idle experts and one at 4x its fair share"},
      {{100, 100}, 2, false, 0, "k == E cannot collapse"},
      {{0, 0, 0, 0}, 2, false, 0, "no tokens routed"},
      {{90, 5, 5}, 0, true, 0, "k defaults to 1: 90% of tokens, fair 33%"},
  };
  for (const Case& c : cases) {
    const MoeLayerHealth h = AssessMoeLayer(Load(c.tokens), c.top_k);
    EXPECT_EQ(h.collapsed, c.collapsed) << c.why;
    EXPECT_EQ(h.idle_experts, c.idle) << c.why;
    EXPECT_EQ(h.layer, 3);
  }
  const MoeLayerHealth h = AssessMoeLayer(Load({500, 300, 100, 100}), 2);
  EXPECT_DOUBLE_EQ(h.fair_share, 0.5);
  EXPECT_DOUBLE_EQ(h.busiest_share, 1.0);
  EXPECT_DOUBLE_EQ(h.min_share, 0.2);
  EXPECT_DOUBLE_EQ(h.median_share, 0.4);
  EXPECT_EQ(h.busiest_expert, 0);
}

TEST(JobMetricsTest, PerExpertSeriesAreCappedAndTheSummaryStays) {
  Registry registry;
  JobMetricsOptions o;
  o.max_expert_series = 4;
  JobMetrics m(&registry, o);
  tally::v1::Job j = Running();
  m.Update(j);
  tally::v1::Progress p = Report(1, 10);
  std::vector<MoeLayerHealth> health;
  for (int layer = 0; layer < 2; ++layer) {
    auto* l = p.add_moe();
    *l = Load({500, 500, 0, 0});
    l->set_layer(layer);
    health.push_back(AssessMoeLayer(*l, 2));
  }
  m.OnProgress(j, p, health);
  auto s = Series(registry);
  const std::string text = SerializeText(registry.Collect());
  EXPECT_THAT(text, Not(HasSubstr("tally_job_moe_expert_tokens{")));
  EXPECT_EQ(s["tally_job_moe_expert_share{layer=\"1\",stat=\"max\",tally_job=\"jobs/7\"}"], 1.0);
  EXPECT_EQ(s["tally_job_moe_expert_share{layer=\"1\",stat=\"fair\",tally_job=\"jobs/7\"}"], 0.5);
  EXPECT_EQ(s["tally_job_moe_idle_experts{layer=\"0\",tally_job=\"jobs/7\"}"], 2);
  EXPECT_EQ(s["tally_job_moe_collapsed{layer=\"0\",tally_job=\"jobs/7\"}"], 1);
}

TEST(JobMetricsTest, RestoredEndedJobKeepsWhatIsLeftOfItsRetention) {
  Registry registry;
  JobMetrics m(&registry);  // 15 minutes
  tally::v1::Job j = Ended(Running(), tally::v1::JOB_STATE_FAILED, 1000);
  j.set_attempt(3);
  j.set_tokens(5000);
  const absl::Time end = absl::FromUnixSeconds(1000);
  // Ended 16 minutes ago: nothing is rebuilt.
  EXPECT_FALSE(m.WithinRetention(j, end + absl::Minutes(16)));
  m.RestoreEnded(j, {{"lost", 2}, {"failed", 1}}, end + absl::Minutes(16));
  EXPECT_EQ(m.NumJobs(), 0u);
  // Ended 10 minutes ago: its final values, its attempts by outcome, its tokens.
  m.RestoreEnded(j, {{"lost", 2}, {"failed", 1}}, end + absl::Minutes(10));
  auto s = Series(registry);
  EXPECT_EQ(s["tally_job_attempts_ended_total{outcome=\"lost\",tally_job=\"jobs/7\"}"], 2);
  EXPECT_EQ(s["tally_job_attempts_ended_total{outcome=\"failed\",tally_job=\"jobs/7\"}"], 1);
  EXPECT_EQ(s["tally_job_attempts_ended_total{outcome=\"succeeded\",tally_job=\"jobs/7\"}"], 0);
  EXPECT_EQ(s["tally_job_tokens_total{kind=\"useful\",tally_job=\"jobs/7\"}"], 5000);
  EXPECT_EQ(s["tally_job_best_val_loss{tally_job=\"jobs/7\"}"], 2.6);
  EXPECT_THAT(SerializeText(registry.Collect()), HasSubstr("state=\"failed\""));
  // A second restore (the same job listed twice) adds nothing.
  m.RestoreEnded(j, {{"lost", 2}}, end + absl::Minutes(10));
  s = Series(registry);
  EXPECT_EQ(s["tally_job_attempts_ended_total{outcome=\"lost\",tally_job=\"jobs/7\"}"], 2);
  // They go 15 minutes after the job's end, not after the restore.
  m.Expire(end + absl::Minutes(15) - absl::Seconds(1));
  EXPECT_EQ(m.NumJobs(), 1u);
  m.Expire(end + absl::Minutes(15));
  EXPECT_EQ(m.NumJobs(), 0u);
  EXPECT_THAT(SerializeText(registry.Collect()), Not(HasSubstr("jobs/7")));
  // Running jobs, and jobs with no end time, are not restored as ended.
  EXPECT_FALSE(m.WithinRetention(Running(), end));
  tally::v1::Job no_end = j;
  no_end.clear_end_time();
  EXPECT_FALSE(m.WithinRetention(no_end, end));
}

TEST(JobMetricsTest, NoRetentionRestoresNothing) {
  Registry registry;
  JobMetricsOptions o;
  o.retention = absl::ZeroDuration();
  JobMetrics m(&registry, o);
  const tally::v1::Job j = Ended(Running(), tally::v1::JOB_STATE_SUCCEEDED, 1000);
  m.RestoreEnded(j, {{"succeeded", 1}}, absl::FromUnixSeconds(1000));
  EXPECT_EQ(m.NumJobs(), 0u);
}

}  // namespace
}  // namespace tally::metrics
