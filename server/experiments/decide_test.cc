#include "server/experiments/decide.h"

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::experiments {
namespace {

using ::testing::HasSubstr;
using tally::v1::Job;
using tally::v1::JobState;

const absl::Time kNow = absl::FromUnixSeconds(1'800'000'000);

store::ExperimentRecord Record(const std::vector<std::string>& variants,
                               const std::string& from_variant = "", double val_loss = 0) {
  store::ExperimentRecord rec;
  rec.set_id(7);
  tally::v1::Experiment& e = *rec.mutable_experiment();
  e.set_name("experiments/7");
  e.set_state(tally::v1::EXPERIMENT_STATE_RUNNING);
  e.set_last_event_sequence(1);
  tally::v1::ExperimentSpec& spec = *e.mutable_spec();
  for (const auto& v : variants) {
    spec.add_variants()->set_name(v);
    e.add_variants()->set_name(v);
    tally::v1::JobSpec& js = *rec.add_resolved();
    js.set_display_name(v);
    js.mutable_training()->set_max_steps(1000);
  }
  if (!from_variant.empty()) spec.mutable_target()->set_from_variant(from_variant);
  if (val_loss > 0) spec.mutable_target()->set_val_loss(val_loss);
  return rec;
}

// A job with evaluations (step, loss) costing $0.001 a step.
Job MakeJob(int id, JobState state, const std::vector<std::pair<int64_t, double>>& evals) {
  Job j;
  j.set_name("jobs/" + std::to_string(id));
  j.set_state(state);
  j.mutable_spec()->mutable_training()->set_max_steps(1000);
  for (auto [step, loss] : evals) {
    auto* p = j.add_curve();
    p->set_step(step);
    p->set_tokens(step * 100);
    p->set_cost_usd(step * 0.001);
    p->set_gpu_seconds(step * 1.0);
    p->set_val_loss(loss);
    j.set_step(step);
    j.set_val_loss(loss);
    j.mutable_cost()->set_cost_usd(step * 0.001);
  }
  return j;
}

// The record as the manager commits it after each variant got its job.
store::ExperimentRecord WithJobs(store::ExperimentRecord rec, const std::vector<Job>& jobs) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    rec.mutable_experiment()->mutable_variants(i)->set_job(jobs[i].name());
    rec.mutable_experiment()->mutable_variants(i)->set_state(tally::v1::JOB_STATE_RUNNING);
  }
  return rec;
}

std::vector<std::optional<Job>> Opt(const std::vector<Job>& jobs) {
  return {jobs.begin(), jobs.end()};
}

int Count(const Plan& p, Action::Kind kind) {
  int n = 0;
  for (const auto& a : p.actions) n += a.kind == kind;
  return n;
}

const tally::v1::ExperimentEvent* Event(const Plan& p, const std::string& type) {
  for (const auto& e : p.events) {
    if (e.type() == type) return &e;
  }
  return nullptr;
}

// A job evaluated quantized: evaluations (step, val_loss, quantized loss)
// costing $0.001 a step.
Job MakeQuantizedJob(int id, JobState state,
                     const std::vector<std::tuple<int64_t, double, double>>& evals) {
  std::vector<std::pair<int64_t, double>> plain;
  for (const auto& [step, loss, q] : evals) plain.push_back({step, loss});
  Job j = MakeJob(id, state, plain);
  j.mutable_spec()->mutable_early_stopping()->set_metric("quantized_val_loss");
  for (size_t i = 0; i < evals.size(); ++i) {
    j.mutable_curve(static_cast<int>(i))->set_quantized_val_loss(std::get<2>(evals[i]));
    j.set_quantized_val_loss(std::get<2>(evals[i]));
  }
  return j;
}

// target.metric quantized_val_loss: the reference's final quantized loss
// is the target, every variant's figures to it are where its quantized curve
// crosses it, and the verdict names the metric.
TEST(DecideTest, AQuantizedTargetJudgesAndPricesByTheQuantizedCurve) {
  // naive ends at val_loss 2.0, quantized 2.6: the target is 2.6.
  Job naive = MakeQuantizedJob(1, tally::v1::JOB_STATE_SUCCEEDED,
                               {{0, 5.0, 5.6}, {100, 3.0, 3.5}, {200, 2.0, 2.6}});
  // qat's val_loss passes 2.6 at step 50, its quantized loss between 50
  // (2.8) and 60 (2.4): at 55.
  Job qat = MakeQuantizedJob(2, tally::v1::JOB_STATE_RUNNING,
                             {{0, 5.0, 5.2}, {50, 2.5, 2.8}, {60, 2.3, 2.4}});
  auto rec = WithJobs(Record({"naive", "qat"}, "naive"), {naive, qat});
  rec.mutable_experiment()->mutable_spec()->mutable_target()->set_metric("quantized_val_loss");
  Plan p = Decide(rec, Opt({naive, qat}), kNow);
  const auto& e = p.rec.experiment();
  EXPECT_DOUBLE_EQ(e.target_val_loss(), 2.6);
  EXPECT_THAT(Event(p, "target")->reason(),
              HasSubstr("target quantized_val_loss 2.6000: the final quantized_val_loss of "
                        "naive (jobs/1)"));
  ASSERT_EQ(Count(p, Action::kSetTarget), 1);
  EXPECT_DOUBLE_EQ(p.actions.back().target_val_loss, 2.6);
  const auto& n = e.variants(0);
  EXPECT_DOUBLE_EQ(n.final_val_loss(), 2.0);
  EXPECT_DOUBLE_EQ(n.final_quantized_val_loss(), 2.6);
  EXPECT_DOUBLE_EQ(n.best_quantized_val_loss(), 2.6);
  const auto& v = e.variants(1);
  EXPECT_DOUBLE_EQ(v.quantized_val_loss(), 2.4);
  EXPECT_DOUBLE_EQ(v.best_quantized_val_loss(), 2.4);
  EXPECT_FALSE(v.has_final_quantized_val_loss()) << "still running";
  ASSERT_TRUE(v.reached_target());
  EXPECT_EQ(v.target_step(), 60);
  EXPECT_NEAR(v.steps_to_target(), 55, 1e-9);
  EXPECT_NEAR(v.cost_to_target_usd(), 0.055, 1e-12);

  qat.set_state(tally::v1::JOB_STATE_SUCCEEDED);
  Plan ended = Decide(p.rec, Opt({naive, qat}), kNow);
  EXPECT_EQ(ended.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(ended.rec.experiment().state_reason(),
              HasSubstr("cheapest to the target quantized_val_loss 2.6000: qat at $0.0550"));
  EXPECT_THAT(Event(ended, "variant_ended")->detail(),
              HasSubstr("final val_loss 2.3000, final quantized_val_loss 2.4000"));
}

// Without a quantized evaluation a variant has no figure to a quantized
// target, and halving ranks variants by their quantized losses.
TEST(DecideTest, AQuantizedTargetRanksAndNotesByTheQuantizedLoss) {
  std::vector<Job> jobs = {
      MakeQuantizedJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5, 5}, {250, 3.0, 3.2}}),
      MakeQuantizedJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5, 5}, {250, 2.0, 3.9}}),
      MakeQuantizedJob(3, tally::v1::JOB_STATE_RUNNING, {{0, 5, 5}, {250, 3.5, 3.3}}),
  };
  auto rec = WithJobs(Record({"ref", "a", "b"}, "", 1.0), jobs);
  rec.mutable_experiment()->mutable_spec()->set_strategy(
      tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  rec.mutable_experiment()->mutable_spec()->mutable_target()->set_metric("quantized_val_loss");
  rec.mutable_experiment()->set_target_val_loss(1.0);
  for (auto& j : jobs) j.set_target_val_loss(1.0);
  Plan p = Decide(rec, Opt(jobs), kNow);
  ASSERT_EQ(Count(p, Action::kStop), 1);
  for (const auto& a : p.actions) {
    if (a.kind == Action::kStop) EXPECT_EQ(a.variant, 1) << "a's val_loss is the best of all";
  }
  EXPECT_THAT(Event(p, "halving")->reason(), HasSubstr("a (latest quantized_val_loss 3.9000)"));
  EXPECT_THAT(Event(p, "halving")->detail(), HasSubstr("ranked by its forecast final "
                                                       "quantized_val_loss"));

  Job plain = MakeJob(4, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 0.5}});
  auto rec2 = WithJobs(Record({"plain"}, "", 1.0), {plain});
  rec2.mutable_experiment()->mutable_spec()->mutable_target()->set_metric("quantized_val_loss");
  const Plan ended = Decide(rec2, Opt({plain}), kNow);
  const auto& v = ended.rec.experiment().variants(0);
  EXPECT_FALSE(v.reached_target()) << "its val_loss reached 1.0, it has no quantized loss";
  EXPECT_EQ(v.note(), "never evaluated quantized: no figure to the target");
  EXPECT_FALSE(v.has_quantized_val_loss());
}

TEST(DecideTest, SubmitsEveryVariantReferenceFirstWithLabelsAndStableRequestIds) {
  const auto rec = Record({"packed", "naive", "moe"}, "naive");
  Plan p = Decide(rec, {std::nullopt, std::nullopt, std::nullopt}, kNow);
  ASSERT_EQ(p.actions.size(), 3u);
  EXPECT_EQ(p.actions[0].variant, 1);  // naive, the reference
  for (const auto& a : p.actions) {
    EXPECT_EQ(a.kind, Action::kSubmit);
    EXPECT_EQ(a.spec.labels().at("experiment"), "experiments/7");
    EXPECT_EQ(a.spec.labels().at("variant"), rec.experiment().variants(a.variant).name());
    EXPECT_EQ(a.request_id, VariantRequestId("experiments/7",
                                             rec.experiment().variants(a.variant).name()));
  }
  EXPECT_FALSE(p.commit) << "nothing to store before the jobs exist";
  // The same record decides the same submits again (a crash before the jobs
  // were recorded): the request ids make them find the same jobs.
  Plan again = Decide(rec, {std::nullopt, std::nullopt, std::nullopt}, kNow);
  ASSERT_EQ(again.actions.size(), 3u);
  EXPECT_EQ(again.actions[2].request_id, p.actions[2].request_id);
}

TEST(DecideTest, ReferenceFinalLossBecomesTheTargetOfTheOthers) {
  Job naive = MakeJob(1, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 3.0}, {200, 2.0}});
  Job packed = MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}, {50, 2.5}});
  // Ended before the target was known: judged on its curve, 2.4 -> 1.6
  // straddles 2.0 halfway between steps 100 and 200.
  Job done = MakeJob(3, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 2.4}, {200, 1.6}});
  const auto rec = WithJobs(Record({"naive", "packed", "done"}, "naive"), {naive, packed, done});
  Plan p = Decide(rec, Opt({naive, packed, done}), kNow);
  const auto& e = p.rec.experiment();
  EXPECT_DOUBLE_EQ(e.target_val_loss(), 2.0);
  ASSERT_NE(Event(p, "target"), nullptr);
  EXPECT_THAT(Event(p, "target")->reason(), HasSubstr("final validation loss of naive"));
  ASSERT_EQ(Count(p, Action::kSetTarget), 1);
  EXPECT_EQ(p.actions[0].variant, 1);
  EXPECT_DOUBLE_EQ(p.actions[0].target_val_loss, 2.0);
  // The reference reaches its own final loss at its last evaluation.
  EXPECT_TRUE(e.variants(0).reached_target());
  EXPECT_NEAR(e.variants(0).cost_to_target_usd(), 0.2, 1e-12);
  EXPECT_TRUE(e.variants(2).reached_target());
  EXPECT_NEAR(e.variants(2).cost_to_target_usd(), 0.15, 1e-12);
  EXPECT_NEAR(e.variants(2).tokens_to_target(), 15000, 1e-6);
  EXPECT_NEAR(e.variants(2).ratio_to_reference(), 0.75, 1e-12);
  EXPECT_EQ(e.variants(2).target_step(), 200);
  EXPECT_FALSE(e.variants(1).reached_target());
  EXPECT_DOUBLE_EQ(e.variants(1).ratio_to_reference(), 0);
  EXPECT_EQ(e.state(), tally::v1::EXPERIMENT_STATE_RUNNING);
  EXPECT_TRUE(p.commit);
}

TEST(DecideTest, TheReferenceRunsWithoutATargetAndATargetInForceIsNotSetAgain) {
  Job naive = MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}});
  Job packed = MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}});
  auto rec = WithJobs(Record({"naive", "packed"}, "naive"), {naive, packed});
  EXPECT_TRUE(Decide(rec, Opt({naive, packed}), kNow).actions.empty());
  rec.mutable_experiment()->set_target_val_loss(2.0);
  packed.set_target_val_loss(2.0);
  EXPECT_TRUE(Decide(rec, Opt({naive, packed}), kNow).actions.empty());
}

TEST(DecideTest, AnAbsoluteTargetIsEveryVariantsIncludingTheFirst) {
  Job a = MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}});
  Job b = MakeJob(2, tally::v1::JOB_STATE_QUEUED, {});
  const auto rec = WithJobs(Record({"a", "b"}, "", 2.5), {a, b});
  Plan p = Decide(rec, Opt({a, b}), kNow);
  EXPECT_EQ(Count(p, Action::kSetTarget), 2);
  EXPECT_DOUBLE_EQ(p.rec.experiment().target_val_loss(), 2.5);
}

// The recipe cost prices a variant's steps to the target at its own
// steady-state step time (the median), so a variant that ran through a busy
// stretch is not judged by it; billed dollars stay beside it.
TEST(DecideTest, TheVerdictIsByRecipeCostNotByWhenAVariantRan) {
  auto timed = [](Job j, int quiet, int busy) {
    j.mutable_cost()->set_usd_per_gpu_hour(3.6);  // $0.001 a GPU-second
    j.mutable_spec()->mutable_model()->set_num_layers(2);
    j.mutable_spec()->mutable_model()->set_d_model(64);
    j.mutable_spec()->mutable_data()->set_seq_len(128);
    for (int i = 0; i < quiet; ++i) j.mutable_step_times()->add_seconds(1.0);
    for (int i = 0; i < busy; ++i) j.mutable_step_times()->add_seconds(3.0);
    return j;
  };
  // naive: 100 steps at 1 s, billed as it ran.
  Job naive = timed(MakeJob(1, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 2.0}}), 200, 0);
  // packed: the target between steps 50 and 60 (58.33), a quarter of its
  // steps three times slower (another job shared the machine), billed
  // accordingly: at $0.001 a second, 1.5 x what its steps cost quiet.
  Job packed = timed(MakeJob(2, tally::v1::JOB_STATE_EARLY_STOPPED, {{0, 5.0}, {50, 2.5}, {60, 1.9}}),
                     150, 50);
  for (auto& pt : *packed.mutable_curve()) pt.set_cost_usd(pt.step() * 0.0015);
  auto rec = WithJobs(Record({"naive", "packed"}, "naive"), {naive, packed});
  Plan p = Decide(rec, Opt({naive, packed}), kNow);
  const auto& e = p.rec.experiment();
  const auto& n = e.variants(0);
  const auto& v = e.variants(1);
  ASSERT_TRUE(v.reached_target());
  EXPECT_NEAR(v.steps_to_target(), 58.333, 1e-3);
  EXPECT_DOUBLE_EQ(v.step_seconds(), 1.0);
  EXPECT_NEAR(v.recipe_cost_to_target_usd(), 0.058333, 1e-6);
  EXPECT_NEAR(v.recipe_cost_low_usd(), 0.058333, 1e-6);
  EXPECT_NEAR(v.recipe_cost_high_usd(), 0.175, 1e-6);
  EXPECT_TRUE(v.step_time_varied());
  EXPECT_NEAR(v.step_seconds_spread(), 2.0, 1e-9);
  EXPECT_NEAR(n.recipe_cost_to_target_usd(), 0.1, 1e-9);
  EXPECT_FALSE(n.step_time_varied());
  EXPECT_NEAR(v.recipe_ratio_to_reference(), 0.58333, 1e-5);
  EXPECT_NEAR(v.ratio_to_reference(), 0.0875 / 0.1, 1e-6) << "billed stays what was billed";
  EXPECT_GT(v.flops_to_target(), 0);
  EXPECT_THAT(e.state_reason(), HasSubstr("packed at $0.0583 by recipe cost ($0.0875 billed)"));
  EXPECT_THAT(e.state_reason(), HasSubstr("0.58x naive's"));
}

TEST(DecideTest, AFailedVariantDoesNotFailTheExperimentAndHasNoMadeUpFigures) {
  Job naive = MakeJob(1, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 2.0}});
  Job broken = MakeJob(2, tally::v1::JOB_STATE_FAILED, {{0, 5.0}});
  broken.set_state_reason("attempt 3 of 3 failed: out of memory");
  Job none = MakeJob(3, tally::v1::JOB_STATE_FAILED, {});
  Job stopped = MakeJob(4, tally::v1::JOB_STATE_EARLY_STOPPED, {{0, 5.0}});
  auto rec = WithJobs(Record({"naive", "broken", "none", "stopped"}, "naive"),
                      {naive, broken, none, stopped});
  Plan p = Decide(rec, Opt({naive, broken, none, stopped}), kNow);
  const auto& e = p.rec.experiment();
  EXPECT_EQ(e.state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(e.state_reason(), HasSubstr("cheapest to the target val_loss 2.0000: naive"));
  EXPECT_FALSE(e.variants(1).reached_target());
  // A failed variant says so (not "no evaluations yet", which reads as
  // pending), with the job's reason.
  EXPECT_EQ(e.variants(1).note(), "failed: attempt 3 of 3 failed: out of memory");
  EXPECT_EQ(e.variants(2).note(), "failed: no reason recorded");
  EXPECT_EQ(e.variants(3).note(), "never reached the target");
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(e.variants(i).cost_to_target_usd(), 0);
    EXPECT_EQ(e.variants(i).ratio_to_reference(), 0);
    EXPECT_FALSE(std::isnan(e.variants(i).ratio_to_reference()));
  }
  int ended = 0;
  for (const auto& ev : p.events) ended += ev.type() == "variant_ended";
  EXPECT_EQ(ended, 4);
}

TEST(DecideTest, AReferenceWithoutAnEvaluationLeavesNoTarget) {
  Job naive = MakeJob(1, tally::v1::JOB_STATE_FAILED, {});
  Job packed = MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}, {100, 1.0}});
  auto rec = WithJobs(Record({"naive", "packed"}, "naive"), {naive, packed});
  Plan p = Decide(rec, Opt({naive, packed}), kNow);
  EXPECT_TRUE(p.rec.target_unavailable());
  EXPECT_EQ(p.rec.experiment().target_val_loss(), 0);
  EXPECT_THAT(p.rec.experiment().variants(1).note(), HasSubstr("no target"));
  EXPECT_EQ(Count(p, Action::kSetTarget), 0);
  ASSERT_NE(Event(p, "target"), nullptr);
  // Decided once: the next pass says nothing more about it.
  Plan next = Decide(p.rec, Opt({naive, packed}), kNow);
  EXPECT_EQ(Event(next, "target"), nullptr);
}

TEST(DecideTest, ARefusedReferenceLeavesNoTargetAndTheExperimentCanEnd) {
  Job packed = MakeJob(2, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 1.0}});
  auto rec = Record({"naive", "packed"}, "naive");
  Plan refused = DecideSubmitRefused(rec, 0, "no such gpu type", kNow);
  EXPECT_EQ(refused.rec.experiment().variants(0).state(), tally::v1::JOB_STATE_FAILED);
  auto rec2 = refused.rec;
  rec2.mutable_experiment()->mutable_variants(1)->set_job("jobs/2");
  Plan p = Decide(rec2, {std::nullopt, packed}, kNow);
  EXPECT_EQ(Count(p, Action::kSubmit), 0) << "a refused variant is not submitted again";
  EXPECT_TRUE(p.rec.target_unavailable());
  EXPECT_EQ(p.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(p.rec.experiment().state_reason(), HasSubstr("no target was known"));
}

TEST(DecideTest, TheBudgetStopsEveryRunningVariant) {
  Job a = MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}, {300, 3.0}});
  Job b = MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}, {250, 3.0}});
  Job c = MakeJob(3, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 3.0}});
  auto rec = WithJobs(Record({"a", "b", "c"}, "a"), {a, b, c});
  rec.mutable_experiment()->mutable_spec()->mutable_budget()->set_max_dollars(0.6);
  Plan p = Decide(rec, Opt({a, b, c}), kNow);  // 0.3 + 0.25 + 0.1 >= 0.6
  EXPECT_EQ(p.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_BUDGET_EXHAUSTED);
  EXPECT_THAT(p.rec.experiment().state_reason(), HasSubstr("budget spent: $0.6500 of $0.6000"));
  ASSERT_EQ(Count(p, Action::kStop), 2);
  for (const auto& act : p.actions) {
    EXPECT_EQ(act.state, tally::v1::JOB_STATE_BUDGET_EXHAUSTED);
    EXPECT_EQ(act.rule, "experiment_budget");
  }
  // Ended: a later pass repeats the stops of jobs still running (a crash
  // may have come between the commit and them), and nothing else.
  Plan again = Decide(p.rec, Opt({a, b, c}), kNow);
  EXPECT_EQ(Count(again, Action::kStop), 2);
  EXPECT_FALSE(again.commit);
}

TEST(DecideTest, TheCalibrationCountsAgainstTheBudgetAndStopsWithTheVariants) {
  Job a = MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}, {300, 3.0}});
  Job b = MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}, {250, 3.0}});
  Job cal = MakeJob(3, tally::v1::JOB_STATE_RUNNING, {});
  cal.mutable_cost()->set_cost_usd(0.1);
  auto rec = WithJobs(Record({"a", "b"}, "a"), {a, b});
  rec.mutable_calibration_spec()->mutable_calibration()->set_rounds(3);
  rec.mutable_experiment()->mutable_calibration()->set_enabled(true);
  rec.mutable_experiment()->mutable_calibration()->set_job(cal.name());
  rec.mutable_experiment()->mutable_spec()->mutable_budget()->set_max_dollars(0.6);
  Plan p = Decide(rec, Opt({a, b}), kNow, cal);  // 0.3 + 0.25 + 0.1 >= 0.6
  EXPECT_EQ(p.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_BUDGET_EXHAUSTED);
  EXPECT_NEAR(p.rec.experiment().cost_usd(), 0.65, 1e-9);
  ASSERT_EQ(Count(p, Action::kStop), 3);
  EXPECT_EQ(p.actions.front().variant, kCalibration);
  // A later pass stops it again if it still runs.
  Plan again = Decide(p.rec, Opt({a, b}), kNow, cal);
  EXPECT_EQ(Count(again, Action::kStop), 3);
}

TEST(DecideTest, TheCalibrationIsSubmittedAfterTheVariantsOnce) {
  auto rec = Record({"a", "b"}, "a");
  rec.mutable_calibration_spec()->mutable_calibration()->set_rounds(3);
  rec.mutable_experiment()->mutable_calibration()->set_enabled(true);
  Plan p = Decide(rec, Opt({}), kNow);
  ASSERT_EQ(Count(p, Action::kSubmit), 3);
  const Action& last = p.actions.back();
  EXPECT_EQ(last.variant, kCalibration);
  EXPECT_EQ(last.request_id, "experiments/7/timing");
  EXPECT_EQ(last.spec.labels().at("calibration"), "timing");
  EXPECT_EQ(last.spec.labels().at("experiment"), "experiments/7");
  // Once it has its job, it is not submitted again, and the experiment
  // waits for it after the variants end.
  Job a = MakeJob(1, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 3.0}});
  Job b = MakeJob(2, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 3.0}});
  Job cal = MakeJob(3, tally::v1::JOB_STATE_RUNNING, {});
  auto with = WithJobs(rec, {a, b});
  with.mutable_experiment()->mutable_calibration()->set_job(cal.name());
  Plan waiting = Decide(with, Opt({a, b}), kNow, cal);
  EXPECT_EQ(Count(waiting, Action::kSubmit), 0);
  EXPECT_EQ(waiting.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_RUNNING);
  cal.set_state(tally::v1::JOB_STATE_SUCCEEDED);
  Plan done = Decide(waiting.rec, Opt({a, b}), kNow, cal);
  EXPECT_EQ(done.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
}

TEST(DecideTest, ACalibrationNeverAcceptedEndsFailedOnceTheVariantsHaveEnded) {
  Job a = MakeJob(1, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 3.0}});
  Job b = MakeJob(2, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 3.0}});
  auto rec = WithJobs(Record({"a", "b"}, "a"), {a, b});
  rec.mutable_calibration_spec()->mutable_calibration()->set_rounds(3);
  rec.mutable_experiment()->mutable_calibration()->set_enabled(true);
  Plan p = Decide(rec, Opt({a, b}), kNow);
  EXPECT_EQ(Count(p, Action::kSubmit), 0) << "nothing left to time against";
  EXPECT_EQ(p.rec.experiment().calibration().state(), tally::v1::JOB_STATE_FAILED);
  EXPECT_EQ(p.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(p.rec.experiment().state_reason(),
              HasSubstr("timing not calibrated: the calibration never ran"));
}

TEST(DecideTest, UnderBudgetNothingStops) {
  Job a = MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}, {300, 3.0}});
  auto rec = WithJobs(Record({"a"}, "a"), {a});
  rec.mutable_experiment()->mutable_spec()->mutable_budget()->set_max_dollars(0.31);
  EXPECT_EQ(Count(Decide(rec, Opt({a}), kNow), Action::kStop), 0);
}

Job WithForecast(Job j, double final_loss) {
  j.mutable_forecast()->set_valid(true);
  j.mutable_forecast()->set_final_val_loss(final_loss);
  return j;
}

TEST(DecideTest, SuccessiveHalvingStopsTheWorseHalfByForecastAfterEachRung) {
  // 4 variants: 2 rungs; without dollars the first ends at 1/4 of max_steps.
  // a is the reference (the first variant of a val_loss target): never
  // halved, whatever its forecast, so every ratio has its denominator.
  std::vector<Job> jobs = {
      WithForecast(MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {250, 3.0}}), 9.0),
      WithForecast(MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {250, 3.0}}), 2.5),
      WithForecast(MakeJob(3, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {250, 3.0}}), 1.5),
      MakeJob(4, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {200, 3.1}}),
  };
  auto rec = WithJobs(Record({"a", "b", "c", "d"}, "", 1.0), jobs);
  rec.mutable_experiment()->mutable_spec()->set_strategy(
      tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  rec.mutable_experiment()->set_target_val_loss(1.0);
  for (auto& j : jobs) j.set_target_val_loss(1.0);
  Plan early = Decide(rec, Opt(jobs), kNow);
  EXPECT_EQ(Count(early, Action::kStop), 0) << "d has not reached the rung yet";

  jobs[3] = MakeJob(4, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {260, 3.1}});
  jobs[3].set_target_val_loss(1.0);  // no forecast yet: ranked by its latest loss
  Plan p = Decide(rec, Opt(jobs), kNow);
  ASSERT_EQ(Count(p, Action::kStop), 1);
  for (const auto& a : p.actions) {
    EXPECT_EQ(a.state, tally::v1::JOB_STATE_EARLY_STOPPED);
    EXPECT_EQ(a.rule, "experiment_halving");
    EXPECT_EQ(a.variant, 3);  // 3.1, the worst of b, c and d
  }
  EXPECT_EQ(p.rec.experiment().rung(), 1);
  EXPECT_TRUE(p.rec.experiment().variants(3).halted());
  EXPECT_FALSE(p.rec.experiment().variants(0).halted());
  ASSERT_NE(Event(p, "halving"), nullptr);
  EXPECT_THAT(Event(p, "halving")->reason(), HasSubstr("rung 1 of 2"));
  EXPECT_THAT(Event(p, "halving")->reason(), ::testing::Not(HasSubstr("a (")));

  // The next rung (1/2 of max_steps) between the two left.
  jobs[3].set_state(tally::v1::JOB_STATE_EARLY_STOPPED);
  jobs[0] = WithForecast(MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {500, 4.0}}), 9.0);
  jobs[1] = WithForecast(MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {500, 2.0}}), 1.8);
  jobs[2] = WithForecast(MakeJob(3, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {500, 2.0}}), 1.2);
  for (auto& j : jobs) j.set_target_val_loss(1.0);
  Plan p2 = Decide(p.rec, Opt(jobs), kNow);
  ASSERT_EQ(Count(p2, Action::kStop), 1);
  EXPECT_EQ(p2.actions[0].variant, 1);
  EXPECT_EQ(p2.rec.experiment().rung(), 2);
  // No third rung.
  Plan p3 = Decide(p2.rec, Opt(jobs), kNow);
  EXPECT_EQ(Count(p3, Action::kStop), 0);
}

// Fewer slots than variants: a variant at the mark while another waits
// for a slot is held (its slot goes to the waiting one); the rung is judged
// only once every variant has reached it; the kept are released, and a hold
// or release decided but not yet in force is asked for again.
TEST(DecideTest, HalvingHoldsAVariantAtTheMarkWhileAnotherWaits) {
  // ref, the reference, races no one: it is neither held nor judged.
  std::vector<Job> jobs = {
      MakeJob(9, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {300, 3.9}}),  // the reference
      MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {250, 3.0}}),  // at the mark
      MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {100, 4.0}}),  // on its way
      MakeJob(3, tally::v1::JOB_STATE_QUEUED, {}),                     // no slot yet
  };
  auto rec = WithJobs(Record({"ref", "a", "b", "c"}, "", 1.0), jobs);
  rec.mutable_experiment()->mutable_spec()->set_strategy(
      tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  rec.mutable_experiment()->set_target_val_loss(1.0);
  for (auto& j : jobs) j.set_target_val_loss(1.0);
  Plan p = Decide(rec, Opt(jobs), kNow);
  ASSERT_EQ(Count(p, Action::kHold), 1);
  EXPECT_EQ(Count(p, Action::kStop), 0) << "c has not started: nothing is judged";
  EXPECT_EQ(p.rec.experiment().variants(1).held_at_rung(), 1);
  EXPECT_EQ(p.rec.experiment().variants(0).held_at_rung(), 0) << "the reference is never held";
  ASSERT_NE(Event(p, "held"), nullptr);
  EXPECT_EQ(Event(p, "held")->variant(), "a");
  // The hold lost to a crash before it was made: asked for again.
  Plan again = Decide(p.rec, Opt(jobs), kNow);
  EXPECT_EQ(Count(again, Action::kHold), 1);
  EXPECT_EQ(Event(again, "held"), nullptr) << "one event per hold";

  // a is held (preempted, queued); b and c reach the mark.
  jobs[1].set_state(tally::v1::JOB_STATE_QUEUED);
  jobs[1].set_hold("experiments/7 holds a");
  jobs[2] = MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {250, 2.5}});
  jobs[3] = MakeJob(3, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {250, 3.5}});
  for (auto& j : jobs) j.set_target_val_loss(1.0);
  Plan judged = Decide(p.rec, Opt(jobs), kNow);
  ASSERT_EQ(Count(judged, Action::kStop), 1);
  EXPECT_EQ(judged.rec.experiment().rung(), 1);
  // c (3.5) is worse than a (3.0) and b (2.5): kept are a and b; a, held,
  // is released. ref (3.9) is not ranked.
  for (const auto& a : judged.actions) {
    if (a.kind == Action::kStop) EXPECT_EQ(a.variant, 3);
    if (a.kind == Action::kRelease) EXPECT_EQ(a.variant, 1);
  }
  EXPECT_EQ(Count(judged, Action::kRelease), 1);
  EXPECT_EQ(judged.rec.experiment().variants(1).held_at_rung(), 0);
  EXPECT_THAT(Event(judged, "halving")->reason(), HasSubstr("latest val_loss 3.5000"));
  // The release lost to a crash: asked for again.
  Plan released = Decide(judged.rec, Opt(jobs), kNow);
  EXPECT_EQ(Count(released, Action::kRelease), 1);
}

TEST(DecideTest, AHoldEndsWhenTheRaceDoes) {
  // Two variants racing on one worker (beside the reference): a is held at
  // the mark while b runs; b then ends below the mark (it reached the
  // target). a is alone in the race: released, not held for a rung that
  // will never be judged.
  std::vector<Job> jobs = {
      MakeJob(9, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5}, {1000, 2.0}}),  // the reference
      MakeJob(1, tally::v1::JOB_STATE_QUEUED, {{0, 5}, {500, 3.0}}),
      MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {100, 4.0}}),
  };
  jobs[1].set_hold("experiments/7 holds a");
  auto rec = WithJobs(Record({"ref", "a", "b"}, "", 1.0), jobs);
  rec.mutable_experiment()->mutable_spec()->set_strategy(
      tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  rec.mutable_experiment()->mutable_variants(1)->set_held_at_rung(1);
  Plan running = Decide(rec, Opt(jobs), kNow);
  EXPECT_EQ(Count(running, Action::kRelease), 0) << "b is still on its way to the mark";
  EXPECT_EQ(running.rec.experiment().variants(1).held_at_rung(), 1);

  jobs[2] = MakeJob(2, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5}, {150, 0.9}});
  Plan p = Decide(running.rec, Opt(jobs), kNow);
  ASSERT_EQ(Count(p, Action::kRelease), 1);
  EXPECT_EQ(p.actions.back().variant, 1);
  EXPECT_EQ(p.rec.experiment().variants(1).held_at_rung(), 0);
  EXPECT_EQ(Count(p, Action::kStop), 0);
  EXPECT_NE(p.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED)
      << "a still has to run";
}

TEST(DecideTest, NoHoldFreesASlotAWaitingVariantCannotUse) {
  std::vector<Job> jobs = {
      MakeJob(9, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5}, {1000, 2.0}}),  // the reference
      MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {500, 3.0}}),     // at the mark
      MakeJob(2, tally::v1::JOB_STATE_QUEUED, {}),                        // waits for an h100
  };
  jobs[1].mutable_spec()->mutable_resources()->set_gpu_type("cpu");
  jobs[2].mutable_spec()->mutable_resources()->set_gpu_type("h100");
  auto rec = WithJobs(Record({"ref", "a", "b"}, "", 1.0), jobs);
  rec.mutable_experiment()->mutable_spec()->set_strategy(
      tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  EXPECT_EQ(Count(Decide(rec, Opt(jobs), kNow), Action::kHold), 0)
      << "a's cpu slot cannot run b: holding a would only stop it";
  jobs[2].mutable_spec()->mutable_resources()->set_gpu_type("cpu");
  jobs[2].mutable_spec()->mutable_resources()->set_gpu_count(2);
  EXPECT_EQ(Count(Decide(rec, Opt(jobs), kNow), Action::kHold), 0)
      << "b needs two GPUs, a frees one";
  jobs[2].mutable_spec()->mutable_resources()->set_gpu_count(1);
  EXPECT_EQ(Count(Decide(rec, Opt(jobs), kNow), Action::kHold), 1);
}

TEST(DecideTest, HalvingRungsInDollarsAndTheReferenceIsNeverHalved) {
  std::vector<Job> jobs = {
      MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {100, 9.0}}),  // reference
      WithForecast(MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {100, 3.0}}), 2.0),
      WithForecast(MakeJob(3, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {100, 3.0}}), 2.2),
  };
  auto rec = WithJobs(Record({"naive", "b", "c"}, "naive"), jobs);
  auto& spec = *rec.mutable_experiment()->mutable_spec();
  spec.set_strategy(tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  spec.set_rung_dollars(0.2);  // each has spent $0.1
  EXPECT_EQ(Count(Decide(rec, Opt(jobs), kNow), Action::kStop), 0);
  spec.set_rung_dollars(0.1);
  Plan p = Decide(rec, Opt(jobs), kNow);
  ASSERT_EQ(Count(p, Action::kStop), 1);
  EXPECT_EQ(p.actions[0].variant, 2);
}

TEST(DecideTest, CancelCancelsOnlyWhatIsStillRunning) {
  Job a = MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}});
  Job b = MakeJob(2, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}});
  auto rec = WithJobs(Record({"a", "b", "c"}, "a"), {a, b});
  Plan p = DecideCancel(rec, {a, b, std::nullopt}, "enough", kNow);
  EXPECT_EQ(p.rec.experiment().state(), tally::v1::EXPERIMENT_STATE_CANCELLED);
  EXPECT_EQ(p.rec.experiment().state_reason(), "cancelled: enough");
  ASSERT_EQ(p.actions.size(), 1u);
  EXPECT_EQ(p.actions[0].kind, Action::kCancel);
  EXPECT_EQ(p.actions[0].variant, 0);
  Plan again = Decide(p.rec, {a, b, std::nullopt}, kNow);
  EXPECT_EQ(Count(again, Action::kSubmit), 0) << "a cancelled experiment submits nothing";
  EXPECT_EQ(Count(again, Action::kCancel), 1);
}

TEST(DecideTest, EventsFollowTheLastSequence) {
  Job naive = MakeJob(1, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5.0}, {100, 2.0}});
  Job b = MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5.0}});
  auto rec = WithJobs(Record({"naive", "b"}, "naive"), {naive, b});
  rec.mutable_experiment()->set_last_event_sequence(4);
  Plan p = Decide(rec, Opt({naive, b}), kNow);
  ASSERT_GE(p.events.size(), 2u);
  for (size_t i = 0; i < p.events.size(); ++i) {
    EXPECT_EQ(p.events[i].sequence(), 5 + static_cast<int64_t>(i));
    EXPECT_EQ(p.events[i].experiment(), "experiments/7");
  }
  EXPECT_EQ(p.rec.experiment().last_event_sequence(), 4 + static_cast<int64_t>(p.events.size()));
}

}  // namespace
}  // namespace tally::experiments

namespace tally::experiments {
namespace {

// An experiment of `variants` x `replicates` runs, as the manager stores it.
store::ExperimentRecord Replicated(const std::vector<std::string>& variants, int replicates,
                                   const std::string& from_variant, double val_loss = 0) {
  store::ExperimentRecord rec = Record(variants, from_variant, val_loss);
  tally::v1::Experiment& e = *rec.mutable_experiment();
  e.mutable_spec()->set_replicates(replicates);
  e.clear_variants();
  rec.clear_resolved();
  for (const auto& v : variants) {
    for (int r = 1; r <= replicates; ++r) {
      auto* s = e.add_variants();
      s->set_name(v);
      s->set_replicate(r);
      s->set_seed(r - 1);
      tally::v1::JobSpec& js = *rec.add_resolved();
      js.set_display_name(v);
      js.mutable_training()->set_max_steps(1000);
      js.mutable_training()->set_seed(r - 1);
    }
  }
  return rec;
}

// A run reaching loss 2.0 at step `steps`, its steps timed at 1 s ($0.001).
Job ReachedAt(int id, double steps) {
  Job j = MakeJob(id, tally::v1::JOB_STATE_SUCCEEDED,
                  {{0, 5.0}, {static_cast<int64_t>(steps), 2.0}});
  j.mutable_cost()->set_usd_per_gpu_hour(3.6);
  for (int i = 0; i < 20; ++i) j.mutable_step_times()->add_seconds(1.0);
  return j;
}

TEST(DecideTest, ReplicatesPairRunsBySeedAndJudgeByTheInterval) {
  // naive (the reference) and two recipes, three replicates each. "steady"
  // is ~0.6x naive on every seed; "noisy" is 0.4x on one seed and 1.4x on
  // another: its mean is below 1 but its interval is not.
  auto rec = Replicated({"naive", "steady", "noisy"}, 3, "", 2.0);
  const std::vector<Job> jobs = {
      ReachedAt(1, 100), ReachedAt(2, 120), ReachedAt(3, 90),   // naive
      ReachedAt(4, 60),  ReachedAt(5, 74),  ReachedAt(6, 55),   // steady
      ReachedAt(7, 40),  ReachedAt(8, 168), ReachedAt(9, 80)};  // noisy
  rec = WithJobs(rec, jobs);
  Plan p = Decide(rec, Opt(jobs), kNow);
  const auto& e = p.rec.experiment();
  ASSERT_EQ(e.variants_size(), 9);
  // Each run against the reference's run of its replicate.
  EXPECT_NEAR(e.variants(4).recipe_ratio_to_reference(), 74.0 / 120, 1e-9);
  EXPECT_NEAR(e.variants(8).recipe_ratio_to_reference(), 80.0 / 90, 1e-9);
  ASSERT_EQ(e.summaries_size(), 3);
  const auto& naive = e.summaries(0);
  EXPECT_EQ(naive.name(), "naive");
  EXPECT_EQ(naive.verdict(), "reference");
  EXPECT_EQ(naive.replicates(), 3);
  EXPECT_EQ(naive.reached_target(), 3);
  EXPECT_NEAR(naive.steps_to_target(), 310.0 / 3, 1e-9);
  EXPECT_NEAR(naive.recipe_cost_to_target_usd(), 0.310 / 3, 1e-9);
  EXPECT_LT(naive.recipe_cost_ci90_low_usd(), naive.recipe_cost_to_target_usd());
  EXPECT_GT(naive.recipe_cost_ci90_high_usd(), naive.recipe_cost_to_target_usd());
  const auto& steady = e.summaries(1);
  EXPECT_EQ(steady.verdict(), "cheaper");
  EXPECT_EQ(steady.ratio_pairs(), 3);
  EXPECT_LT(steady.recipe_ratio_ci90_high(), 1);
  EXPECT_GT(steady.recipe_ratio_ci90_low(), 0.5);
  EXPECT_NEAR(steady.recipe_ratio_to_reference(),
              std::cbrt(60.0 / 100 * 74.0 / 120 * 55.0 / 90), 1e-9);
  const auto& noisy = e.summaries(2);
  EXPECT_LT(noisy.recipe_ratio_to_reference(), 1);
  EXPECT_LT(noisy.recipe_ratio_ci90_low(), 1);
  EXPECT_GT(noisy.recipe_ratio_ci90_high(), 1);
  EXPECT_EQ(noisy.verdict(), "no clear difference");
  // The experiment's verdict: the lowest mean, with its interval.
  EXPECT_EQ(e.state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(e.state_reason(), HasSubstr("lowest mean recipe cost to the target val_loss 2.0000: "));
  EXPECT_THAT(e.state_reason(), HasSubstr("90% interval"));
}

TEST(DecideTest, ReplicatesGetTheirOwnRequestIdsAndTheReferenceRunsFirst) {
  auto rec = Replicated({"packed", "naive"}, 2, "naive");
  Plan p = Decide(rec, std::vector<std::optional<Job>>(4), kNow);
  ASSERT_EQ(Count(p, Action::kSubmit), 4);
  std::vector<std::string> ids;
  for (const auto& a : p.actions) ids.push_back(a.request_id);
  EXPECT_EQ(ids, (std::vector<std::string>{
                     "experiments/7/variants/naive", "experiments/7/variants/naive/replicates/2",
                     "experiments/7/variants/packed",
                     "experiments/7/variants/packed/replicates/2"}));
  EXPECT_EQ(p.actions[1].spec.training().seed(), 1u);
}

TEST(DecideTest, AFromVariantTargetWithReplicatesIsTheReferencesWorstFinalLoss) {
  auto rec = Replicated({"naive", "packed"}, 2, "naive");
  std::vector<Job> jobs = {MakeJob(1, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5}, {100, 2.0}}),
                           MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {50, 2.5}}),
                           MakeJob(3, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {50, 2.4}}),
                           MakeJob(4, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {50, 2.6}})};
  rec = WithJobs(rec, jobs);
  Plan running = Decide(rec, Opt(jobs), kNow);
  EXPECT_EQ(running.rec.experiment().target_val_loss(), 0) << "one reference run still runs";
  jobs[1] = MakeJob(2, tally::v1::JOB_STATE_SUCCEEDED, {{0, 5}, {100, 2.2}});
  Plan p = Decide(running.rec, Opt(jobs), kNow);
  // The highest of 2.0 and 2.2: both reference runs reached it.
  EXPECT_NEAR(p.rec.experiment().target_val_loss(), 2.2, 1e-12);
  ASSERT_NE(Event(p, "target"), nullptr);
  EXPECT_THAT(Event(p, "target")->reason(), HasSubstr("highest final validation loss of naive's 2"));
  // Both of packed's runs get it; neither of naive's.
  int targets = 0;
  for (const auto& a : p.actions) {
    if (a.kind != Action::kSetTarget) continue;
    ++targets;
    EXPECT_GE(a.variant, 2);
  }
  EXPECT_EQ(targets, 2);
}

TEST(DecideTest, HalvingRanksAVariantByItsReplicatesMean) {
  // 3 variants x 2 runs, a the reference: b's runs forecast 2.0 and 3.0
  // (mean 2.5), c's 2.2 and 2.6 (mean 2.4). By the mean c goes on and both
  // of b's runs stop, though b's best run is the best of all.
  auto rec = Replicated({"a", "b", "c"}, 2, "", 1.0);
  rec.mutable_experiment()->mutable_spec()->set_strategy(
      tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
  rec.mutable_experiment()->set_target_val_loss(1.0);
  std::vector<Job> jobs = {
      WithForecast(MakeJob(1, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {600, 3.0}}), 9.0),
      WithForecast(MakeJob(2, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {600, 3.0}}), 9.0),
      WithForecast(MakeJob(3, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {600, 3.0}}), 2.0),
      WithForecast(MakeJob(4, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {600, 3.0}}), 3.0),
      WithForecast(MakeJob(5, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {600, 3.0}}), 2.2),
      WithForecast(MakeJob(6, tally::v1::JOB_STATE_RUNNING, {{0, 5}, {600, 3.0}}), 2.6),
  };
  for (auto& j : jobs) j.set_target_val_loss(1.0);
  rec = WithJobs(rec, jobs);
  Plan p = Decide(rec, Opt(jobs), kNow);
  std::vector<int> stopped;
  for (const auto& a : p.actions) {
    if (a.kind == Action::kStop) stopped.push_back(a.variant);
  }
  EXPECT_THAT(stopped, ::testing::UnorderedElementsAre(2, 3));
  ASSERT_NE(Event(p, "halving"), nullptr);
  EXPECT_THAT(Event(p, "halving")->reason(), HasSubstr("b (mean over 2 runs of its forecast"));
}

}  // namespace
}  // namespace tally::experiments
