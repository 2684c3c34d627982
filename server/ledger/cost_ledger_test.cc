#include "server/ledger/cost_ledger.h"

#include <cmath>
#include <limits>

#include "common/proto_time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::ledger {
namespace {

using ::testing::HasSubstr;

tally::v1::Job RunningJob(int gpus, absl::Time since) {
  tally::v1::Job j;
  j.set_state(tally::v1::JOB_STATE_RUNNING);
  j.mutable_spec()->mutable_resources()->set_gpu_type("cpu");
  j.mutable_spec()->mutable_resources()->set_gpu_count(gpus);
  *j.mutable_cost()->mutable_accrued_until() = ToProto(since);
  return j;
}

CostLedger Ledger() {
  PriceTable p;
  p.usd_per_gpu_hour["cpu"] = 3.6;  // $0.001 per GPU-second
  p.flops_per_second_per_gpu["cpu"] = 1e9;
  return CostLedger(p);
}

TEST(CostLedgerTest, AccruesGpuSecondsTimesPriceWhileRunningOnly) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  CostLedger ledger = Ledger();
  tally::v1::Job j = RunningJob(2, t0);
  Accrual a = ledger.Accrue(j, true, t0 + absl::Seconds(10));
  EXPECT_NEAR(a.added_usd, 0.02, 1e-12);
  EXPECT_NEAR(a.cost.cost_usd(), 0.02, 1e-12);
  EXPECT_NEAR(a.cost.gpu_seconds(), 20, 1e-9);
  EXPECT_NEAR(a.cost.attempt_usd_since_checkpoint(), 0.02, 1e-12);
  EXPECT_EQ(FromProto(a.cost.accrued_until()), t0 + absl::Seconds(10));
  // The input is a value: nothing was written to it.
  EXPECT_EQ(j.cost().cost_usd(), 0);
  // Not running: time moves, dollars do not.
  Accrual idle = ledger.Accrue(j, false, t0 + absl::Seconds(10));
  EXPECT_EQ(idle.added_usd, 0);
  EXPECT_EQ(FromProto(idle.cost.accrued_until()), t0 + absl::Seconds(10));
  // A time before accrued_until adds nothing and does not move it back.
  *j.mutable_cost() = a.cost;
  Accrual back = ledger.Accrue(j, true, t0);
  EXPECT_EQ(back.added_usd, 0);
  EXPECT_EQ(FromProto(back.cost.accrued_until()), t0 + absl::Seconds(10));
}

TEST(CostLedgerTest, LostWorkIsTheSpendSinceTheLastCheckpoint) {
  tally::v1::CostStatus c;
  c.set_cost_usd(1.0);
  c.set_attempt_usd_since_checkpoint(0.25);
  c.set_lost_usd(0.5);
  Accrual a = Ledger().ChargeLost(c);
  EXPECT_DOUBLE_EQ(a.added_usd, 0.25);
  EXPECT_DOUBLE_EQ(a.cost.lost_usd(), 0.75);
  EXPECT_DOUBLE_EQ(a.cost.attempt_usd_since_checkpoint(), 0);
  EXPECT_DOUBLE_EQ(a.cost.cost_usd(), 1.0);
}

TEST(CostLedgerTest, PricesACheckpointAgainstThePreviousOrTheBaseline) {
  tally::v1::Job j;
  j.mutable_cost()->set_cost_usd(3.0);
  j.mutable_early_stopping()->set_has_baseline(true);
  j.mutable_early_stopping()->set_baseline_val_loss(5.0);
  tally::v1::Checkpoint ck;
  ck.set_tokens(1000);
  ck.set_val_loss(4.0);
  tally::v1::Checkpoint first = Ledger().PriceCheckpoint(j, ck, std::nullopt);
  EXPECT_DOUBLE_EQ(first.cost_usd(), 3.0);
  EXPECT_DOUBLE_EQ(first.cost_since_previous_usd(), 3.0);
  EXPECT_DOUBLE_EQ(first.usd_per_val_loss_improvement(), 3.0);  // $3 for 1 nat
  j.mutable_cost()->set_cost_usd(4.0);
  ck.set_tokens(3000);
  ck.set_val_loss(3.5);
  tally::v1::Checkpoint second = Ledger().PriceCheckpoint(j, ck, first);
  EXPECT_DOUBLE_EQ(second.cost_since_previous_usd(), 1.0);
  EXPECT_EQ(second.tokens_since_previous(), 2000);
  EXPECT_DOUBLE_EQ(second.usd_per_val_loss_improvement(), 2.0);
}

// With early_stopping.metric quantized_val_loss the gain is of the quantized
// loss (the baseline is of it too): a checkpoint whose val_loss improved but
// whose quantized loss did not has no price per gain.
TEST(CostLedgerTest, PricesACheckpointByTheQuantizedLossWhenThatIsTheMetric) {
  tally::v1::Job j;
  j.mutable_spec()->mutable_early_stopping()->set_metric("quantized_val_loss");
  j.mutable_cost()->set_cost_usd(3.0);
  j.mutable_early_stopping()->set_has_baseline(true);
  j.mutable_early_stopping()->set_baseline_val_loss(5.5);  // the step-0 quantized loss
  tally::v1::Checkpoint ck;
  ck.set_tokens(1000);
  ck.set_val_loss(4.0);
  ck.set_quantized_val_loss(4.5);
  tally::v1::Checkpoint first = Ledger().PriceCheckpoint(j, ck, std::nullopt);
  EXPECT_DOUBLE_EQ(first.usd_per_val_loss_improvement(), 3.0);  // $3 for 5.5 -> 4.5
  EXPECT_DOUBLE_EQ(first.quantized_val_loss(), 4.5);
  j.mutable_cost()->set_cost_usd(4.0);
  ck.set_tokens(3000);
  ck.set_val_loss(3.5);            // better in float
  ck.set_quantized_val_loss(4.6);  // worse quantized
  tally::v1::Checkpoint second = Ledger().PriceCheckpoint(j, ck, first);
  EXPECT_DOUBLE_EQ(second.cost_since_previous_usd(), 1.0);
  EXPECT_DOUBLE_EQ(second.usd_per_val_loss_improvement(), 0);
  ck.set_quantized_val_loss(4.0);
  tally::v1::Checkpoint third = Ledger().PriceCheckpoint(j, ck, first);
  EXPECT_DOUBLE_EQ(third.usd_per_val_loss_improvement(), 2.0);  // $1 for 4.5 -> 4.0
  // Not evaluated quantized at its step: no gain to price.
  ck.clear_quantized_val_loss();
  EXPECT_DOUBLE_EQ(Ledger().PriceCheckpoint(j, ck, first).usd_per_val_loss_improvement(), 0);
}

TEST(CostLedgerTest, BudgetStopsAtMaxDollars) {
  tally::v1::Job j = RunningJob(1, absl::UnixEpoch());
  j.mutable_spec()->mutable_budget()->set_max_dollars(0.05);
  j.mutable_cost()->set_cost_usd(0.0499);
  EXPECT_FALSE(Ledger().CheckBudget(j).has_value());
  j.mutable_cost()->set_cost_usd(0.05);
  auto stop = Ledger().CheckBudget(j);
  ASSERT_TRUE(stop.has_value());
  EXPECT_THAT(stop->reason, HasSubstr("spent $0.0500 of max_dollars $0.0500"));
  j.set_state(tally::v1::JOB_STATE_QUEUED);
  EXPECT_FALSE(Ledger().CheckBudget(j).has_value());
  j.set_state(tally::v1::JOB_STATE_RUNNING);
  j.mutable_spec()->mutable_budget()->set_max_dollars(0);  // no budget
  EXPECT_FALSE(Ledger().CheckBudget(j).has_value());
}

TEST(CostLedgerTest, EstimateIsConfiguredThenMeasured) {
  CostLedger ledger = Ledger();
  tally::v1::JobSpec spec;
  spec.mutable_model()->set_num_layers(2);
  spec.mutable_model()->set_d_model(64);
  spec.mutable_model()->set_d_ff(256);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_data()->set_seq_len(128);
  spec.mutable_training()->set_max_steps(100);
  spec.mutable_training()->set_global_batch_tokens(1024);
  spec.mutable_resources()->set_gpu_type("cpu");
  spec.mutable_resources()->set_gpu_count(1);
  tally::v1::CostEstimate e = ledger.Estimate(spec);
  EXPECT_EQ(e.throughput_source(), "configured");
  EXPECT_EQ(e.tokens(), 102400);
  EXPECT_NEAR(e.seconds(), e.flops_per_token() * 102400 / 1e9, 1e-6);
  tally::v1::Job done;
  *done.mutable_spec() = spec;
  done.set_tokens(1000);
  done.mutable_cost()->set_gpu_seconds(1.0);
  ledger.RecordFinished(done);
  e = ledger.Estimate(spec);
  EXPECT_THAT(e.throughput_source(), HasSubstr("measured from 1 finished cpu jobs"));
  EXPECT_NEAR(e.flops_per_second_per_gpu(), CostLedger::FlopsPerToken(spec) * 1000, 1e-3);
}

// A distillation teacher's forward pass (a third of its training FLOPs) is
// priced when the spec states its shape, and said to be missing otherwise.
TEST(CostLedgerTest, EstimateCountsADistillationTeachersForwardPass) {
  CostLedger ledger = Ledger();
  tally::v1::JobSpec spec;
  spec.mutable_model()->set_num_layers(1);
  spec.mutable_model()->set_d_model(64);
  spec.mutable_data()->set_seq_len(128);
  spec.mutable_training()->set_max_steps(100);
  spec.mutable_training()->set_global_batch_tokens(1024);
  spec.mutable_resources()->set_gpu_type("cpu");
  spec.mutable_resources()->set_gpu_count(1);
  const double student = ledger.Estimate(spec).flops_per_token();
  EXPECT_TRUE(ledger.Estimate(spec).teacher_source().empty());

  auto* distill = spec.mutable_training()->mutable_distill();
  distill->mutable_teacher()->set_checkpoint("/data/teacher.ckpt");
  tally::v1::CostEstimate e = ledger.Estimate(spec);
  EXPECT_EQ(e.flops_per_token(), student);
  EXPECT_EQ(e.teacher_flops_per_token(), 0);
  EXPECT_THAT(e.teacher_source(), HasSubstr("training.distill.teacher.model"));

  auto* teacher = distill->mutable_teacher()->mutable_model();
  teacher->set_num_layers(4);
  teacher->set_d_model(128);
  e = ledger.Estimate(spec);
  tally::v1::JobSpec as_student = spec;
  *as_student.mutable_model() = *teacher;
  as_student.mutable_training()->clear_distill();
  const double teacher_training = CostLedger::FlopsPerToken(as_student);
  EXPECT_NEAR(e.teacher_flops_per_token(), teacher_training / 3, 1e-6 * teacher_training);
  EXPECT_NEAR(e.flops_per_token(), student + teacher_training / 3, 1e-6 * teacher_training);
  EXPECT_NEAR(e.seconds(), e.flops_per_token() * 102400 / 1e9, 1e-6);
}

PriceTable SpotPrices() {
  PriceTable p;
  p.usd_per_gpu_hour["h200"] = 3.6;       // $0.001 per GPU-second
  p.spot_usd_per_gpu_hour["h200"] = 1.8;  // half that on spot
  p.usd_per_gpu_hour["a100"] = 2.0;       // no spot price
  p.flops_per_second_per_gpu["h200"] = 1e9;
  return p;
}

TEST(CostLedgerTest, SpotPriceFallsBackToOnDemand) {
  const PriceTable p = SpotPrices();
  EXPECT_DOUBLE_EQ(p.SpotPrice("h200"), 1.8);
  EXPECT_DOUBLE_EQ(p.SpotPrice("a100"), 2.0);  // on-demand
  EXPECT_DOUBLE_EQ(p.SpotPrice("tpu"), 0);     // unpriced
  EXPECT_THAT(p.Describe(), HasSubstr("spot $/GPU-hour: h200=1.8"));
  EXPECT_THAT(PriceTable{}.Describe(), HasSubstr("no prices configured"));
  EXPECT_THAT(Ledger().prices().Describe(), HasSubstr("no spot prices"));
}

TEST(CostLedgerTest, PriceForBlendsOnDemandAndSpot) {
  const PriceTable p = SpotPrices();
  EXPECT_DOUBLE_EQ(p.PriceFor("h200", 4, 0), 3.6);
  EXPECT_DOUBLE_EQ(p.PriceFor("h200", 4, 4), 1.8);
  EXPECT_DOUBLE_EQ(p.PriceFor("h200", 4, 1), (3 * 3.6 + 1.8) / 4);
  // Out-of-range counts are clamped, not trusted.
  EXPECT_DOUBLE_EQ(p.PriceFor("h200", 4, 9), 1.8);
  EXPECT_DOUBLE_EQ(p.PriceFor("h200", 4, -2), 3.6);
  EXPECT_DOUBLE_EQ(p.PriceFor("h200", 0, 1), 1.8);  // 0 GPUs count as 1
  EXPECT_DOUBLE_EQ(p.PriceFor("a100", 2, 1), 2.0);
}

TEST(CostLedgerTest, AccruesAtTheBlendedPriceAndCountsSpotGpuSeconds) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  CostLedger ledger(SpotPrices());
  tally::v1::Job j = RunningJob(4, t0);
  j.mutable_spec()->mutable_resources()->set_gpu_type("h200");
  j.mutable_cost()->set_spot_gpus(1);
  Accrual a = ledger.Accrue(j, true, t0 + absl::Seconds(100));
  const double blended = (3 * 3.6 + 1.8) / 4;
  EXPECT_DOUBLE_EQ(a.cost.usd_per_gpu_hour(), blended);
  // 3 GPUs x 100 s at $0.001 + 1 GPU x 100 s at $0.0005.
  EXPECT_NEAR(a.added_usd, 0.35, 1e-12);
  EXPECT_NEAR(a.cost.gpu_seconds(), 400, 1e-9);
  EXPECT_NEAR(a.cost.spot_gpu_seconds(), 100, 1e-9);
  // Not running: no spot time either.
  *j.mutable_cost() = a.cost;
  Accrual idle = ledger.Accrue(j, false, t0 + absl::Seconds(200));
  EXPECT_NEAR(idle.cost.spot_gpu_seconds(), 100, 1e-9);
  // An on-demand attempt adds no spot time.
  j.mutable_cost()->set_spot_gpus(0);
  *j.mutable_cost()->mutable_accrued_until() = ToProto(t0);
  Accrual od = ledger.Accrue(j, true, t0 + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(od.cost.usd_per_gpu_hour(), 3.6);
  EXPECT_NEAR(od.cost.spot_gpu_seconds(), 100, 1e-9);
}

TEST(CostLedgerTest, AnAttemptOnFewerGpusThanTheSpecAccruesForItsOwn) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  CostLedger ledger(SpotPrices());
  tally::v1::Job j = RunningJob(4, t0);
  j.mutable_spec()->mutable_resources()->set_gpu_type("h200");
  j.mutable_cost()->set_attempt_gpus(2);  // resumed on 2 of its 4 GPUs
  Accrual a = ledger.Accrue(j, true, t0 + absl::Seconds(100));
  EXPECT_NEAR(a.added_usd, 0.2, 1e-12);  // 2 GPUs x 100 s at $0.001
  EXPECT_NEAR(a.cost.gpu_seconds(), 200, 1e-9);
}

TEST(CostLedgerTest, RedoneWorkIsNotLostWork) {
  tally::v1::CostStatus c;
  c.set_cost_usd(1.0);
  c.set_attempt_usd_since_checkpoint(0.25);
  c.set_lost_usd(0.5);
  c.set_redone_usd(0.125);
  Accrual redone = Ledger().ChargeRedone(c, /*checkpoint_at_exit=*/false);
  EXPECT_DOUBLE_EQ(redone.added_usd, 0.25);
  EXPECT_DOUBLE_EQ(redone.cost.redone_usd(), 0.375);
  EXPECT_DOUBLE_EQ(redone.cost.lost_usd(), 0.5);
  EXPECT_DOUBLE_EQ(redone.cost.attempt_usd_since_checkpoint(), 0);
  EXPECT_DOUBLE_EQ(redone.cost.cost_usd(), 1.0);
  // The notice checkpoint landed: nothing is redone.
  Accrual kept = Ledger().ChargeRedone(c, /*checkpoint_at_exit=*/true);
  EXPECT_DOUBLE_EQ(kept.added_usd, 0);
  EXPECT_DOUBLE_EQ(kept.cost.redone_usd(), 0.125);
  EXPECT_DOUBLE_EQ(kept.cost.lost_usd(), 0.5);
  EXPECT_DOUBLE_EQ(kept.cost.attempt_usd_since_checkpoint(), 0);
  EXPECT_DOUBLE_EQ(kept.cost.cost_usd(), 1.0);
}

tally::v1::JobSpec H200Spec(int gpus) {
  tally::v1::JobSpec spec;
  spec.mutable_model()->set_num_layers(2);
  spec.mutable_model()->set_d_model(64);
  spec.mutable_model()->set_d_ff(256);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_data()->set_seq_len(128);
  spec.mutable_training()->set_max_steps(1000);
  spec.mutable_training()->set_global_batch_tokens(1 << 20);
  spec.mutable_training()->set_checkpoint_interval_steps(100);
  spec.mutable_resources()->set_gpu_type("h200");
  spec.mutable_resources()->set_gpu_count(gpus);
  return spec;
}

void ExpectAllFinite(const tally::v1::CostEstimate& e) {
  for (double v : {e.seconds(), e.gpu_hours(), e.usd_per_gpu_hour(), e.cost_usd(),
                   e.spot_usd_per_gpu_hour(), e.preemptions_per_gpu_hour(),
                   e.spot_expected_preemptions(), e.spot_redone_usd(), e.spot_cost_usd(),
                   e.spot_savings_usd()}) {
    EXPECT_TRUE(std::isfinite(v)) << e.DebugString();
  }
}

TEST(CostLedgerTest, SpotEstimateWithNoObservedPreemptions) {
  CostLedger ledger(SpotPrices());
  tally::v1::CostEstimate e = ledger.Estimate(H200Spec(2));
  ExpectAllFinite(e);
  ASSERT_GT(e.gpu_hours(), 0);
  EXPECT_DOUBLE_EQ(e.spot_usd_per_gpu_hour(), 1.8);
  EXPECT_EQ(e.preemptions_per_gpu_hour(), 0);
  EXPECT_THAT(e.preemption_rate_source(), HasSubstr("none observed"));
  EXPECT_EQ(e.spot_expected_preemptions(), 0);
  EXPECT_EQ(e.spot_redone_usd(), 0);
  EXPECT_NEAR(e.spot_cost_usd(), 1.8 * e.gpu_hours(), 1e-9);
  EXPECT_NEAR(e.spot_savings_usd(), e.cost_usd() / 2, 1e-9);
}

TEST(CostLedgerTest, SpotEstimateAtTheMeasuredRateAndRedoneHours) {
  CostLedger ledger(SpotPrices());
  // Ran 2 GPUs on spot for 10 GPU-hours, preempted 4 times by notice (5
  // times in all), redoing $0.9 of work at its mean $1.8/GPU-hour: 0.5
  // GPU-hours, 0.25 wall-clock hours, 0.05 per preemption.
  tally::v1::Job done;
  *done.mutable_spec() = H200Spec(2);
  done.set_tokens(1000);
  done.mutable_cost()->set_gpu_seconds(36000);
  done.mutable_cost()->set_cost_usd(18.0);
  done.mutable_cost()->set_spot_gpu_seconds(36000);
  done.mutable_cost()->set_redone_usd(0.9);
  done.mutable_preemption()->set_count(5);
  done.mutable_preemption()->set_by_notice(4);
  ledger.RecordFinished(done);
  // A spot job that trained nothing still counts for the rate, not for
  // throughput.
  tally::v1::Job empty;
  *empty.mutable_spec() = H200Spec(1);
  empty.mutable_cost()->set_spot_gpu_seconds(3600 * 6);
  // An on-demand job's notices are not spot preemptions.
  tally::v1::Job on_demand;
  *on_demand.mutable_spec() = H200Spec(1);
  on_demand.set_tokens(1000);
  on_demand.mutable_cost()->set_gpu_seconds(3600);
  on_demand.mutable_cost()->set_cost_usd(3.6);
  on_demand.mutable_preemption()->set_count(3);
  on_demand.mutable_preemption()->set_by_notice(3);
  ledger.RecordFinished(empty);
  ledger.RecordFinished(on_demand);

  const tally::v1::JobSpec spec = H200Spec(4);
  tally::v1::CostEstimate e = ledger.Estimate(spec);
  ExpectAllFinite(e);
  EXPECT_THAT(e.throughput_source(), HasSubstr("measured from 2 finished h200 jobs"));
  EXPECT_DOUBLE_EQ(e.preemptions_per_gpu_hour(), 4.0 / 16.0);
  EXPECT_EQ(e.preemption_rate_source(),
            "measured from 2 finished h200 jobs (16 spot GPU-hours)");
  ASSERT_GT(e.gpu_hours(), 0);
  EXPECT_NEAR(e.spot_expected_preemptions(), 0.25 * e.gpu_hours(), 1e-9);
  // 0.05 wall-clock hours per preemption x 4 GPUs, at the spot price.
  EXPECT_NEAR(e.spot_redone_usd(), e.spot_expected_preemptions() * 0.05 * 4 * 1.8, 1e-9);
  EXPECT_NEAR(e.spot_cost_usd(), 1.8 * e.gpu_hours() + e.spot_redone_usd(), 1e-9);
  EXPECT_NEAR(e.spot_savings_usd(), e.cost_usd() - e.spot_cost_usd(), 1e-9);
}

TEST(CostLedgerTest, SpotEstimateFallsBackToHalfACheckpointInterval) {
  CostLedger ledger(SpotPrices());
  // Spot time and notices, but no price to turn redone dollars into hours.
  tally::v1::Job done;
  *done.mutable_spec() = H200Spec(1);
  done.mutable_cost()->set_gpu_seconds(7200);
  done.mutable_cost()->set_spot_gpu_seconds(7200);
  done.mutable_cost()->set_redone_usd(1.0);
  done.mutable_preemption()->set_count(1);
  done.mutable_preemption()->set_by_notice(1);
  ledger.RecordFinished(done);
  tally::v1::CostEstimate e = ledger.Estimate(H200Spec(1));
  ExpectAllFinite(e);
  EXPECT_DOUBLE_EQ(e.preemptions_per_gpu_hour(), 0.5);
  // Interval 100 of 1000 steps: a preemption redoes 5% of the run.
  EXPECT_NEAR(e.spot_redone_usd(),
              e.spot_expected_preemptions() * 0.05 * e.gpu_hours() * 1.8, 1e-9);
  // No checkpoint interval: half the run.
  tally::v1::JobSpec no_interval = H200Spec(1);
  no_interval.mutable_training()->set_checkpoint_interval_steps(0);
  tally::v1::CostEstimate half = ledger.Estimate(no_interval);
  EXPECT_NEAR(half.spot_redone_usd(),
              half.spot_expected_preemptions() * 0.5 * half.gpu_hours() * 1.8, 1e-9);
}

TEST(CostLedgerTest, SpotEstimateIsNeverNanOrInf) {
  // No prices at all, a preempted job with zero cost, spot GPU-seconds but no
  // GPU-seconds, and no throughput: every field is finite, dollars are 0.
  CostLedger ledger;
  tally::v1::Job odd;
  *odd.mutable_spec() = H200Spec(1);
  odd.mutable_cost()->set_spot_gpu_seconds(10);
  odd.mutable_cost()->set_redone_usd(0);
  odd.mutable_preemption()->set_count(2);
  odd.mutable_preemption()->set_by_notice(2);
  ledger.RecordFinished(odd);
  tally::v1::Job inf;
  *inf.mutable_spec() = H200Spec(1);
  inf.mutable_cost()->set_spot_gpu_seconds(std::numeric_limits<double>::infinity());
  ledger.RecordFinished(inf);
  for (const tally::v1::JobSpec& spec : {H200Spec(1), tally::v1::JobSpec()}) {
    tally::v1::CostEstimate e = ledger.Estimate(spec);
    ExpectAllFinite(e);
    EXPECT_EQ(e.cost_usd(), 0);
    EXPECT_EQ(e.spot_usd_per_gpu_hour(), 0);
    EXPECT_EQ(e.spot_redone_usd(), 0);
    EXPECT_EQ(e.spot_cost_usd(), 0);
    EXPECT_EQ(e.spot_savings_usd(), 0);
  }
  // Prices but zero measured rate and unknown throughput.
  PriceTable p = SpotPrices();
  p.flops_per_second_per_gpu.clear();
  tally::v1::CostEstimate e = CostLedger(p).Estimate(H200Spec(1));
  ExpectAllFinite(e);
  EXPECT_EQ(e.gpu_hours(), 0);
  EXPECT_EQ(e.spot_cost_usd(), 0);
}

}  // namespace
}  // namespace tally::ledger
