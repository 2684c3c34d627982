// The scheduler's cost ledger and early stopping, on a fake clock and the
// in-memory store: what tallyd decides, and that it survives a restart.
#include <cmath>
#include <memory>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sched/scheduler.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/memory_job_store.h"

namespace tally::sched {
namespace {

using ::testing::HasSubstr;
using tally::v1::ControllerMessage;

class JobPoliciesTest : public ::testing::Test {
 protected:
  JobPoliciesTest() {
    options_.prices.usd_per_gpu_hour["cpu"] = 3.6;  // $0.001 per GPU-second
    options_.prices.flops_per_second_per_gpu["cpu"] = 1e9;
    Restart();
  }
  // A fresh scheduler over the same store: what a tallyd restart does.
  void Restart() {
    registries_.push_back(std::make_unique<metrics::Registry>());
    sched_ = std::make_unique<Scheduler>(&store_, &channel_, &clock_, registries_.back().get(),
                                         options_);
    ASSERT_TRUE(sched_->Recover().ok());
  }
  // Worker w0 reconnects to a restarted tallyd, still running attempt 1 of
  // the job: tallyd adopts it.
  void Readopt(int64_t id) {
    tally::v1::Hello h;
    h.set_worker_id("w0");
    h.set_gpu_type("cpu");
    h.set_slots(1);
    auto* r = h.add_running();
    r->set_job("jobs/" + std::to_string(id));
    r->set_attempt(1);
    ASSERT_TRUE(sched_->OnHello(h).ok());
  }
  tally::v1::JobSpec Spec(int gpus = 1) { return TinySpec(gpus); }
  int64_t Start(tally::v1::JobSpec spec) {
    auto job = sched_->Submit(spec, "");
    EXPECT_TRUE(job.ok()) << job.status();
    for (int i = 0; i < spec.resources().gpu_count(); ++i) {
      tally::v1::Hello h;
      h.set_worker_id("w" + std::to_string(i));
      h.set_gpu_type("cpu");
      h.set_slots(1);
      EXPECT_TRUE(sched_->OnHello(h).ok());
    }
    EXPECT_TRUE(sched_->Tick().ok());
    const int64_t id = std::stoll(job->name().substr(5));
    EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
    return id;
  }
  tally::v1::Job Job(int64_t id) { return store_.GetJob(id)->job(); }
  void Send(tally::v1::WorkerMessage m) {
    const absl::Status s = sched_->OnMessage("w0", m);
    ASSERT_TRUE(s.ok()) << s;
  }
  void Eval(int64_t id, int64_t step, double loss) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job("jobs/" + std::to_string(id));
    m.mutable_eval()->set_attempt(Job(id).attempt());
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_val_loss(loss);
    Send(m);
  }
  // An evaluation with its quantized loss (a job with training.eval_quantized).
  void QuantizedEval(int64_t id, int64_t step, double loss, double quantized) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job("jobs/" + std::to_string(id));
    m.mutable_eval()->set_attempt(Job(id).attempt());
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_val_loss(loss);
    m.mutable_eval()->set_quantized_val_loss(quantized);
    Send(m);
  }
  void Checkpoint(int64_t id, int64_t step, int64_t tokens) {
    tally::v1::WorkerMessage m;
    m.mutable_checkpoint()->set_job("jobs/" + std::to_string(id));
    m.mutable_checkpoint()->set_attempt(Job(id).attempt());
    m.mutable_checkpoint()->set_step(step);
    m.mutable_checkpoint()->set_tokens(tokens);
    m.mutable_checkpoint()->set_path(CheckpointPath("jobs/" + std::to_string(id), step));
    Send(m);
  }
  void Progress(int64_t id, int64_t step) {
    tally::v1::WorkerMessage m;
    m.mutable_progress()->set_job("jobs/" + std::to_string(id));
    m.mutable_progress()->set_attempt(Job(id).attempt());
    m.mutable_progress()->set_step(step);
    m.mutable_progress()->set_trained(true);
    Send(m);
  }
  void Beat() {
    tally::v1::WorkerMessage m;
    m.mutable_heartbeat();
    Send(m);
  }
  // The worker obeys a stop order: the attempt exits STOPPED.
  void ExitStopped(int64_t id) {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job("jobs/" + std::to_string(id));
    m.mutable_exit()->set_attempt(Job(id).attempt());
    m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
    m.mutable_exit()->set_reason("stop ordered");
    Send(m);
  }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  RecordingChannel channel_;
  SchedulerOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(JobPoliciesTest, CostAccruesOnlyWhileRunningPerGpu) {
  auto job = sched_->Submit(Spec(2), "");
  ASSERT_TRUE(job.ok());
  const int64_t id = std::stoll(job->name().substr(5));
  clock_.Advance(absl::Seconds(30));  // queued, no workers: free
  ASSERT_TRUE(sched_->Tick().ok());
  for (const char* w : {"w0", "w1"}) {
    tally::v1::Hello h;
    h.set_worker_id(w);
    h.set_gpu_type("cpu");
    h.set_slots(1);
    ASSERT_TRUE(sched_->OnHello(h).ok());
  }
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).cost().cost_usd(), 0);
  clock_.Advance(absl::Seconds(5));
  Progress(id, 5);
  clock_.Advance(absl::Seconds(5));
  Progress(id, 10);  // commits: 10 s x 2 GPUs
  const auto cost = Job(id).cost();
  EXPECT_NEAR(cost.gpu_seconds(), 20.0, 1e-9);
  EXPECT_NEAR(cost.cost_usd(), 0.02, 1e-12);
  EXPECT_DOUBLE_EQ(cost.usd_per_gpu_hour(), 3.6);
}

TEST_F(JobPoliciesTest, BudgetStopsTheJobAtTheNextProgress) {
  auto spec = Spec();
  spec.mutable_budget()->set_max_dollars(0.05);
  const int64_t id = Start(spec);
  clock_.Advance(absl::Seconds(3));
  Progress(id, 1);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(47));
  Progress(id, 2);  // $0.050: at the budget
  const auto j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
  EXPECT_THAT(j.state_reason(), HasSubstr("spent $0.0500 of max_dollars $0.0500"));
  ASSERT_EQ(channel_.stops.size(), 1u);
  EXPECT_EQ(channel_.stop_workers[0], "w0");
  EXPECT_THAT(channel_.stops[0].reason(), ::testing::StartsWith("budget"));
  // The worker's exit afterwards changes nothing.
  tally::v1::WorkerMessage m;
  m.mutable_exit()->set_job(j.name());
  m.mutable_exit()->set_attempt(1);
  m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
  Send(m);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
}

TEST_F(JobPoliciesTest, BudgetAlsoEnforcedByTheTick) {
  auto spec = Spec();
  spec.mutable_budget()->set_max_dollars(0.01);
  const int64_t id = Start(spec);
  clock_.Advance(absl::Seconds(5));
  Beat();
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(sched_->Tick().ok());  // a worker that reports nothing
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
}

TEST_F(JobPoliciesTest, PatienceStopsWithTheRuleTheNumbersAndTheBestCheckpoint) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_patience(2);
  const int64_t id = Start(spec);
  Eval(id, 0, 5.0);
  Eval(id, 100, 3.0);
  Checkpoint(id, 100, 1000);
  Eval(id, 200, 2.95);  // < 3% better: no improvement
  EXPECT_EQ(Job(id).early_stopping().patience_left(), 1);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  Eval(id, 300, 2.99);
  // Decided and committed; the job ends once the worker has stopped.
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).pending_stop().rule(), "patience");
  EXPECT_EQ(Job(id).pending_stop().step(), 300);
  ASSERT_EQ(channel_.stops.size(), 1u);
  EXPECT_EQ(channel_.checkpoint_stops(), 1);
  ExitStopped(id);  // a worker that wrote no final checkpoint
  const auto j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_FALSE(j.has_pending_stop());
  EXPECT_THAT(j.state_reason(), HasSubstr("patience: 2 evaluations without improving"));
  EXPECT_THAT(j.state_reason(), HasSubstr("3.0000 (step 100) by 3%"));
  EXPECT_EQ(j.early_stopping().stop_rule(), "patience");
  EXPECT_THAT(j.early_stopping().best_checkpoint(), testing::EndsWith("/step-00000100.ckpt"));
  auto events = *store_.ListEvents(id, 0, 100);
  EXPECT_EQ(events.back().type(), "early_stopped");
  EXPECT_THAT(events.back().detail(), HasSubstr("best checkpoint: step 100"));
  ASSERT_EQ(channel_.stops.size(), 1u);
}

// The evaluation that stops a job measured a state the job keeps: the
// checkpoint the worker writes at that step (reported after the eval, maybe
// after the stop was decided) is recorded, priced and named the best.
TEST_F(JobPoliciesTest, AnEarlyStopKeepsTheStateItsEvaluationMeasured) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_baseline_evals(1);
  spec.mutable_early_stopping()->set_baseline_min_rel_gain(0.5);
  const int64_t id = Start(spec);
  Eval(id, 0, 4.0);
  Eval(id, 10, 3.9);
  Checkpoint(id, 10, 100);
  Eval(id, 20, 3.5187);  // not 50% better than the baseline: stop
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Job(id).pending_stop().rule(), "no_gain_over_baseline");
  Checkpoint(id, 20, 200);  // written at step 20, in flight when the stop was decided
  ExitStopped(id);
  const auto j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_THAT(j.early_stopping().best_checkpoint(), testing::EndsWith("/step-00000020.ckpt"));
  auto cks = *store_.ListCheckpoints(id);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_DOUBLE_EQ(cks[1].val_loss(), 3.5187);
  auto events = *store_.ListEvents(id, 0, 100);
  EXPECT_THAT(events.back().detail(), HasSubstr("best checkpoint: step 20, val_loss 3.5187"));
}

TEST_F(JobPoliciesTest, ATargetStopSucceedsWithTheCostToTheTarget) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_target_val_loss(3.5);
  const int64_t id = Start(spec);
  auto eval = [&](int64_t step, int64_t tokens, double loss) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job("jobs/" + std::to_string(id));
    m.mutable_eval()->set_attempt(1);
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_tokens(tokens);
    m.mutable_eval()->set_val_loss(loss);
    Send(m);
  };
  eval(0, 0, 5.0);
  clock_.Advance(absl::Seconds(10));
  eval(10, 1000, 4.0);  // $0.01
  clock_.Advance(absl::Seconds(10));
  eval(20, 2000, 3.0);  // $0.02: halfway in loss from 4.0 to 3.0 is the target
  auto j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(j.pending_stop().state(), tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(channel_.checkpoint_stops(), 1) << "the worker keeps the state that reached it";
  const auto& t = j.target_reached();
  EXPECT_DOUBLE_EQ(t.target_val_loss(), 3.5);
  EXPECT_EQ(t.step(), 20);
  EXPECT_EQ(t.tokens(), 2000);
  EXPECT_NEAR(t.cost_usd(), 0.02, 1e-12);
  EXPECT_NEAR(t.gpu_seconds(), 20, 1e-9);
  EXPECT_NEAR(t.cost_to_target_usd(), 0.015, 1e-12);
  EXPECT_NEAR(t.tokens_to_target(), 1500, 1e-9);
  EXPECT_NEAR(t.gpu_seconds_to_target(), 15, 1e-9);
  Checkpoint(id, 20, 2000);
  ExitStopped(id);
  j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_THAT(j.state_reason(), HasSubstr("target reached: val_loss 3.0000 <= target 3.5000"));
  EXPECT_THAT(j.early_stopping().best_checkpoint(), testing::EndsWith("/step-00000020.ckpt"));
  EXPECT_EQ(j.early_stopping().stop_rule(), "") << "reaching the target is not an early stop";
  ASSERT_EQ(j.curve_size(), 3);
  EXPECT_NEAR(j.curve(1).cost_usd(), 0.01, 1e-12);
}

TEST_F(JobPoliciesTest, ATargetRelativeToTheBaselineAndOneReachedAtTheLastStep) {
  auto spec = Spec();
  spec.mutable_training()->set_max_steps(100);
  spec.mutable_early_stopping()->set_target_rel_to_baseline(0.8);
  const int64_t id = Start(spec);
  Eval(id, 0, 5.0);
  EXPECT_DOUBLE_EQ(Job(id).target_val_loss(), 4.0);
  Eval(id, 50, 4.5);
  EXPECT_FALSE(Job(id).has_target_reached());
  Eval(id, 100, 3.9);  // the last step: recorded, nothing left to stop
  EXPECT_EQ(Job(id).target_reached().step(), 100);
  EXPECT_FALSE(Job(id).has_pending_stop());
  EXPECT_EQ(channel_.checkpoint_stops(), 0);
}

TEST_F(JobPoliciesTest, AForecastThatCannotReachTheTargetStopsTheJob) {
  auto spec = Spec();  // 1000 steps
  spec.mutable_early_stopping()->set_target_val_loss(2.0);
  spec.mutable_early_stopping()->set_forecast(true);
  const int64_t id = Start(spec);
  auto eval = [&](int64_t step) {
    const int64_t tokens = step * 100;
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job("jobs/" + std::to_string(id));
    m.mutable_eval()->set_attempt(1);
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_tokens(tokens);
    // Flattening out near 3.0, far above the target.
    m.mutable_eval()->set_val_loss(3.0 + 20.0 / std::sqrt(static_cast<double>(tokens)));
    Send(m);
  };
  eval(100);
  eval(200);
  eval(300);
  EXPECT_FALSE(Job(id).has_pending_stop()) << "3 evaluations: too few to forecast";
  eval(400);
  const auto j = Job(id);
  ASSERT_TRUE(j.forecast().valid()) << j.forecast().reason();
  EXPECT_NEAR(j.forecast().final_val_loss(), 3.063, 0.02);
  EXPECT_EQ(j.forecast().evals_used(), 4);
  EXPECT_EQ(j.pending_stop().rule(), "forecast");
  EXPECT_THAT(j.pending_stop().reason(), HasSubstr("target"));
  ExitStopped(id);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_EQ(Job(id).early_stopping().stop_rule(), "forecast");
}

TEST_F(JobPoliciesTest, EveryJobShowsItsForecastButOnlyAskersAreStopped) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_target_val_loss(2.0);  // out of reach, no forecast stop
  const int64_t id = Start(spec);
  for (int64_t step = 100; step <= 600; step += 100) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job("jobs/" + std::to_string(id));
    m.mutable_eval()->set_attempt(1);
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_tokens(step * 100);
    m.mutable_eval()->set_val_loss(3.0 + 20.0 / std::sqrt(step * 100.0));
    Send(m);
  }
  const auto j = Job(id);
  EXPECT_TRUE(j.forecast().valid());
  EXPECT_LE(j.forecast().low(), j.forecast().final_val_loss());
  EXPECT_GE(j.forecast().high(), j.forecast().final_val_loss());
  EXPECT_FALSE(j.has_pending_stop());
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_RUNNING);
}

TEST_F(JobPoliciesTest, ADecidedStopEndsAfterTheGraceWithoutTheWorker) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_patience(1);
  const int64_t id = Start(spec);
  Eval(id, 0, 5.0);
  Checkpoint(id, 0, 0);
  Eval(id, 10, 5.0);
  ASSERT_TRUE(Job(id).has_pending_stop());
  clock_.Advance(options_.stop_grace - absl::Seconds(1));
  Beat();
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(2));
  Beat();
  ASSERT_TRUE(sched_->Tick().ok());
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  auto events = *store_.ListEvents(id, 0, 100);
  EXPECT_THAT(events.back().detail(), HasSubstr("did not confirm the stop"));
}

TEST_F(JobPoliciesTest, ADecidedStopSurvivesARestartAndIsAskedAgain) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_patience(1);
  const int64_t id = Start(spec);
  Eval(id, 0, 5.0);
  Eval(id, 10, 5.0);
  ASSERT_TRUE(Job(id).has_pending_stop());
  EXPECT_EQ(channel_.checkpoint_stops(), 1);
  Restart();
  Readopt(id);
  EXPECT_EQ(channel_.checkpoint_stops(), 2) << "the adopted attempt is told to stop again";
  Checkpoint(id, 10, 100);
  ExitStopped(id);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_THAT(Job(id).early_stopping().best_checkpoint(), testing::EndsWith("/step-00000010.ckpt"));
}

TEST_F(JobPoliciesTest, NanAtTheFirstEvalDiverges) {
  const int64_t id = Start(Spec());
  Eval(id, 0, std::nan(""));
  EXPECT_EQ(Job(id).pending_stop().rule(), "divergence");
  ExitStopped(id);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_EQ(Job(id).early_stopping().stop_rule(), "divergence");
}

TEST_F(JobPoliciesTest, PatienceAndCostContinueAcrossARestart) {
  auto spec = Spec();
  spec.mutable_early_stopping()->set_patience(3);
  const int64_t id = Start(spec);
  Eval(id, 0, 5.0);
  clock_.Advance(absl::Seconds(10));
  Eval(id, 100, 5.0);  // 1 of 3
  Eval(id, 200, 5.0);  // 2 of 3
  const double cost_before = Job(id).cost().cost_usd();
  EXPECT_NEAR(cost_before, 0.01, 1e-12);
  EXPECT_EQ(Job(id).early_stopping().patience_left(), 1);

  clock_.Advance(absl::Seconds(4));  // tallyd is down; the worker trains on
  Restart();
  Readopt(id);
  clock_.Advance(absl::Seconds(6));
  Progress(id, 250);
  EXPECT_NEAR(Job(id).cost().cost_usd(), 0.02, 1e-12) << "the downtime counts: GPUs were held";
  Eval(id, 200, 5.0);  // the resumed step again: not counted
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_RUNNING);
  Eval(id, 300, 5.0);  // 3 of 3
  EXPECT_EQ(Job(id).pending_stop().rule(), "patience");
  ExitStopped(id);
  EXPECT_EQ(Job(id).state(), tally::v1::JOB_STATE_EARLY_STOPPED);
}

TEST_F(JobPoliciesTest, CheckpointsArePricedAndLostWorkIsCounted) {
  auto spec = Spec();
  spec.set_max_attempts(2);
  const int64_t id = Start(spec);
  Eval(id, 0, 5.0);
  clock_.Advance(absl::Seconds(4));
  Beat();
  Eval(id, 100, 4.0);
  Checkpoint(id, 100, 1000);
  clock_.Advance(absl::Seconds(6));
  Beat();
  Eval(id, 200, 3.0);
  Checkpoint(id, 200, 2500);
  auto cks = *store_.ListCheckpoints(id);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_NEAR(cks[0].cost_usd(), 0.004, 1e-12);
  EXPECT_NEAR(cks[0].usd_per_val_loss_improvement(), 0.004, 1e-12);  // vs the baseline 5.0
  EXPECT_NEAR(cks[1].cost_since_previous_usd(), 0.006, 1e-12);
  EXPECT_EQ(cks[1].tokens_since_previous(), 1500);
  EXPECT_DOUBLE_EQ(cks[1].val_loss(), 3.0);
  EXPECT_NEAR(cks[1].usd_per_val_loss_improvement(), 0.006, 1e-12);

  clock_.Advance(absl::Seconds(7));
  Beat();
  clock_.Advance(absl::Seconds(11));  // silent past the timeout
  ASSERT_TRUE(sched_->Tick().ok());
  const auto j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_NEAR(j.cost().lost_usd(), 0.018, 1e-12);  // 18 s since the step-200 checkpoint
  EXPECT_NEAR(j.cost().cost_usd(), 0.028, 1e-12);
}

TEST_F(JobPoliciesTest, RoutingCollapseWarnsOnceAfterThreeEvaluations) {
  tally::v1::JobSpec spec = Spec();
  spec.mutable_model()->set_num_layers(2);  // layer 1 of 2 is MoE, 3 experts
  spec.mutable_model()->mutable_moe()->set_num_experts(3);
  spec.mutable_model()->mutable_moe()->set_top_k(1);
  const int64_t id = Start(spec);
  auto progress = [&](int64_t step, std::vector<int64_t> tokens) {
    tally::v1::WorkerMessage m;
    m.mutable_progress()->set_job("jobs/" + std::to_string(id));
    m.mutable_progress()->set_attempt(1);
    m.mutable_progress()->set_step(step);
    m.mutable_progress()->set_trained(true);
    auto* l = m.mutable_progress()->add_moe();
    l->set_layer(1);
    for (int64_t n : tokens) l->add_tokens_per_expert(n);
    Send(m);
  };
  auto restart = [&] {  // tallyd restarts; the worker reconnects, still training
    Restart();
    Readopt(id);
  };
  auto warnings = [&] {
    int n = 0;
    const auto events = store_.ListEvents(id, 0, 1000);
    for (const auto& e : *events) n += e.type() == "warning";
    return n;
  };
  progress(1, {90, 5, 5});
  Eval(id, 10, 3.0);
  progress(2, {30, 40, 30});  // balanced again: the count restarts
  Eval(id, 20, 3.0);
  for (int i = 0; i < 3; ++i) {
    progress(3 + i, {10, 80, 10});
    Eval(id, 30 + 10 * i, 3.0);
    EXPECT_EQ(warnings(), i == 2 ? 1 : 0);
    // The streak survives tallyd restarting in the middle of it.
    if (i == 0) restart();
  }
  EXPECT_EQ(Job(id).routing().collapsed_evals(), 3);
  restart();
  progress(9, {10, 80, 10});
  Eval(id, 70, 3.0);
  EXPECT_EQ(warnings(), 1) << "warned once, across a restart too";
  auto events = *store_.ListEvents(id, 0, 1000);
  for (const auto& e : events) {
    if (e.type() == "warning") {
      EXPECT_THAT(e.reason(), HasSubstr("routing collapse: layer 1 expert 1 took 80%"));
    }
  }
}

TEST_F(JobPoliciesTest, EstimateIsConfiguredThenMeasured) {
  auto spec = Spec();
  spec.mutable_training()->set_max_steps(10);
  auto e = sched_->EstimateCost(spec);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->throughput_source(), "configured");
  EXPECT_EQ(e->tokens(), 10 * 64 * 8);
  EXPECT_GT(e->flops_per_token(), 0);
  EXPECT_NEAR(e->seconds(), e->flops_per_token() * e->tokens() / 1e9, 1e-9);
  EXPECT_NEAR(e->cost_usd(), e->seconds() * 0.001, 1e-12);
  // The submitted job keeps its estimate beside what it will cost.
  const int64_t id = Start(spec);
  EXPECT_NEAR(Job(id).cost().estimate().cost_usd(), e->cost_usd(), 1e-15);
  clock_.Advance(absl::Seconds(2));
  tally::v1::WorkerMessage m;
  m.mutable_progress()->set_job("jobs/" + std::to_string(id));
  m.mutable_progress()->set_attempt(1);
  m.mutable_progress()->set_step(10);
  m.mutable_progress()->set_tokens(5120);
  Send(m);
  m.Clear();
  m.mutable_exit()->set_job("jobs/" + std::to_string(id));
  m.mutable_exit()->set_attempt(1);
  m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_SUCCEEDED);
  Send(m);
  auto measured = sched_->EstimateCost(spec);
  EXPECT_EQ(measured->throughput_source(), "measured from 1 finished cpu jobs");
  EXPECT_NEAR(measured->flops_per_second_per_gpu(), e->flops_per_token() * 5120 / 2.0, 1e-6);
  // And the measurement survives a restart.
  Restart();
  EXPECT_EQ(sched_->EstimateCost(spec)->throughput_source(), "measured from 1 finished cpu jobs");
  auto bad = Spec();
  bad.mutable_model()->set_num_heads(3);
  EXPECT_THAT(sched_->EstimateCost(bad).status().message(), HasSubstr("spec.model.num_heads"));
}

// A spec evaluated quantized (q4_0 of the feed-forward weights, as its
// export will be) and judged by that loss.
tally::v1::JobSpec QuantizedSpec() {
  tally::v1::JobSpec spec = TinySpec();
  spec.mutable_model()->set_d_model(32);  // whole blocks of 32 weights
  spec.mutable_training()->set_eval_quantized("q4_0");
  spec.mutable_early_stopping()->set_metric("quantized_val_loss");
  return spec;
}

// Judged by the quantized loss, a job stops on its patience while val_loss
// keeps improving; its best checkpoint is the lowest quantized loss, and the
// checkpoints are priced by it.
TEST_F(JobPoliciesTest, AJobJudgedByItsQuantizedLossStopsOnItsPatience) {
  auto spec = QuantizedSpec();
  spec.mutable_early_stopping()->set_patience(2);
  const int64_t id = Start(spec);
  QuantizedEval(id, 0, 5.0, 5.5);
  clock_.Advance(absl::Seconds(10));
  QuantizedEval(id, 100, 4.0, 4.2);
  Checkpoint(id, 100, 1000);
  clock_.Advance(absl::Seconds(10));
  QuantizedEval(id, 200, 3.5, 4.3);  // val_loss better, quantized worse
  Checkpoint(id, 200, 2000);
  EXPECT_EQ(Job(id).early_stopping().patience_left(), 1);
  EXPECT_EQ(Job(id).early_stopping().metric(), "quantized_val_loss");
  EXPECT_DOUBLE_EQ(Job(id).early_stopping().best_val_loss(), 4.2);
  QuantizedEval(id, 300, 3.0, 4.25);
  EXPECT_EQ(Job(id).pending_stop().rule(), "patience");
  EXPECT_DOUBLE_EQ(Job(id).pending_stop().quantized_val_loss(), 4.25);
  EXPECT_DOUBLE_EQ(Job(id).val_loss(), 3.0);
  EXPECT_DOUBLE_EQ(Job(id).quantized_val_loss(), 4.25);
  ExitStopped(id);
  const auto j = Job(id);
  EXPECT_EQ(j.state(), tally::v1::JOB_STATE_EARLY_STOPPED);
  EXPECT_THAT(j.state_reason(),
              HasSubstr("2 evaluations without improving on the best quantized_val_loss 4.2000 "
                        "(step 100)"));
  EXPECT_THAT(j.early_stopping().best_checkpoint(), testing::EndsWith("/step-00000100.ckpt"))
      << "the lowest quantized loss, not the lowest val_loss";
  auto cks = *store_.ListCheckpoints(id);
  ASSERT_EQ(cks.size(), 2u);
  EXPECT_DOUBLE_EQ(cks[0].quantized_val_loss(), 4.2);
  EXPECT_GT(cks[0].usd_per_val_loss_improvement(), 0) << "5.5 -> 4.2 quantized";
  EXPECT_DOUBLE_EQ(cks[1].usd_per_val_loss_improvement(), 0) << "4.2 -> 4.3: no gain";
  auto events = *store_.ListEvents(id, 0, 100);
  EXPECT_THAT(events.back().detail(),
              HasSubstr("best checkpoint: step 100, val_loss 4.0000, quantized_val_loss 4.2000"));
  int evals = 0;
  for (const auto& e : events) {
    if (e.type() != "eval") continue;
    ++evals;
    EXPECT_TRUE(e.has_quantized_val_loss()) << e.ShortDebugString();
  }
  EXPECT_EQ(evals, 4);
}

// And the other way: judged by val_loss (the default), the same job's
// quantized plateau stops nothing, while a val_loss plateau does although
// the quantized loss keeps improving.
TEST_F(JobPoliciesTest, AJobJudgedByValLossIgnoresItsQuantizedLoss) {
  auto spec = QuantizedSpec();
  spec.mutable_early_stopping()->clear_metric();
  spec.mutable_early_stopping()->set_patience(2);
  const int64_t id = Start(spec);
  QuantizedEval(id, 0, 5.0, 5.5);
  QuantizedEval(id, 100, 4.0, 4.2);
  QuantizedEval(id, 200, 3.5, 4.3);
  QuantizedEval(id, 300, 3.0, 4.25);
  EXPECT_FALSE(Job(id).has_pending_stop());
  EXPECT_EQ(Job(id).early_stopping().metric(), "val_loss");
  QuantizedEval(id, 400, 3.0, 3.5);
  QuantizedEval(id, 500, 3.0, 3.0);
  EXPECT_EQ(Job(id).pending_stop().rule(), "patience");
  EXPECT_THAT(Job(id).pending_stop().reason(), HasSubstr("best validation loss 3.0000"));
}

// An evaluation of a job evaluated quantized that lacks the quantized loss
// (a worker that did not compute it) is refused and counted, and changes
// nothing.
TEST_F(JobPoliciesTest, AnEvaluationWithoutTheQuantizedLossIsRefused) {
  const int64_t id = Start(QuantizedSpec());
  tally::v1::WorkerMessage m;
  m.mutable_eval()->set_job("jobs/" + std::to_string(id));
  m.mutable_eval()->set_attempt(1);
  m.mutable_eval()->set_step(0);
  m.mutable_eval()->set_val_loss(5.0);
  const absl::Status s = sched_->OnMessage("w0", m);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("eval.quantized_val_loss: missing"));
  EXPECT_EQ(MetricValues(*registries_.back())["tally_worker_reports_refused_total,kind=invalid"],
            1);
  EXPECT_EQ(Job(id).curve_size(), 0);
  EXPECT_EQ(Job(id).early_stopping().evals(), 0);
}

}  // namespace
}  // namespace tally::sched
