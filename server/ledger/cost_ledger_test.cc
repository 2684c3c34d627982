#include "server/ledger/cost_ledger.h"

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

}  // namespace
}  // namespace tally::ledger
