#include "server/sched/eval_decision.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::sched {
namespace {

using ::testing::HasSubstr;

tally::v1::Job JobWith(int patience, double divergence_factor, int64_t max_steps = 1000) {
  tally::v1::Job job;
  auto* es = job.mutable_spec()->mutable_early_stopping();
  es->set_patience(patience);
  es->set_min_rel_delta(0.01);
  es->set_divergence_factor(divergence_factor);
  job.mutable_spec()->mutable_training()->set_max_steps(max_steps);
  return job;
}

tally::v1::EvalResult Eval(int64_t step, double val) {
  tally::v1::EvalResult e;
  e.set_step(step);
  e.set_val_loss(val);
  return e;
}

// Feeds `losses` (one evaluation every 10 steps from step 0) through
// DecideEval as the scheduler does, carrying the status from one to the
// next; returns the decision of the last.
EvalDecision Feed(tally::v1::Job job, const std::vector<double>& losses,
                 bool collapsed = false) {
  EvalDecision d;
  for (size_t i = 0; i < losses.size(); ++i) {
    d = DecideEval(job, Eval(static_cast<int64_t>(10 * i), losses[i]), collapsed);
    *job.mutable_early_stopping() = d.early_stopping;
    *job.mutable_routing() = d.routing;
  }
  return d;
}

TEST(EvalDecisionTest, DecidesTheRulesInOrder) {
  struct Case {
    const char* name;
    tally::v1::Job job;
    std::vector<double> losses;
    policy::StopRule want;
    const char* reason;  // a part of the reason, when a rule fires
  };
  const Case cases[] = {
      {"improving", JobWith(2, 0), {5, 4, 3, 2}, policy::StopRule::kNone, ""},
      {"patience", JobWith(2, 0), {5, 4, 4, 4}, policy::StopRule::kPatience, "patience"},
      {"not yet patience", JobWith(3, 0), {5, 4, 4, 4}, policy::StopRule::kNone, ""},
      {"divergence", JobWith(0, 1.5), {5, 3, 5}, policy::StopRule::kDivergence, "diverg"},
      {"no rules", JobWith(0, 0), {5, 6, 7, 8}, policy::StopRule::kNone, ""},
      // At max_steps there is nothing left to save: the rule is dropped.
      {"at max_steps", JobWith(2, 0, 30), {5, 4, 4, 4}, policy::StopRule::kNone, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const EvalDecision d = Feed(c.job, c.losses);
    EXPECT_EQ(d.rule, c.want);
    if (c.want != policy::StopRule::kNone) EXPECT_THAT(d.reason, HasSubstr(c.reason));
    EXPECT_EQ(d.early_stopping.evals(), static_cast<int>(c.losses.size()));
  }
}

TEST(EvalDecisionTest, KeepsTheBestAndThePatienceLeft) {
  const EvalDecision d = Feed(JobWith(3, 0), {5, 4, 4.5});
  EXPECT_TRUE(d.early_stopping.has_best());
  EXPECT_EQ(d.early_stopping.best_val_loss(), 4);
  EXPECT_EQ(d.early_stopping.best_step(), 10);
  EXPECT_EQ(d.early_stopping.patience_left(), 2);
  EXPECT_EQ(d.early_stopping.baseline_val_loss(), 5);
}

// An evaluation of a step already counted (a resumed attempt evaluating
// its checkpoint's step again) changes nothing.
TEST(EvalDecisionTest, ARepeatedStepIsNotCountedTwice) {
  tally::v1::Job job = JobWith(2, 0);
  EvalDecision d = DecideEval(job, Eval(0, 5), false);
  *job.mutable_early_stopping() = d.early_stopping;
  d = DecideEval(job, Eval(10, 6), false);
  *job.mutable_early_stopping() = d.early_stopping;
  const EvalDecision again = DecideEval(job, Eval(10, 6), false);
  EXPECT_EQ(again.early_stopping.evals(), 2);
  EXPECT_EQ(again.rule, policy::StopRule::kNone);
}

// The routing-collapse warning comes once, after kCollapseEvals
// evaluations in a row with a collapsed layer; a healthy one resets the
// count.
TEST(EvalDecisionTest, WarnsOfRoutingCollapseOnceAfterEnoughEvaluations) {
  tally::v1::Job job = JobWith(0, 0);
  std::vector<bool> warned;
  for (bool collapsed : {true, true, false, true, true, true, true, true}) {
    const EvalDecision d =
        DecideEval(job, Eval(10 * static_cast<int64_t>(warned.size()), 5), collapsed);
    *job.mutable_routing() = d.routing;
    *job.mutable_early_stopping() = d.early_stopping;
    warned.push_back(d.warn_collapse);
  }
  EXPECT_EQ(warned, (std::vector<bool>{false, false, false, false, false, true, false, false}));
  EXPECT_TRUE(job.routing().collapse_warned());
}

TEST(EvalDecisionTest, CurveOfCarriesEveryPoint) {
  tally::v1::Job job;
  auto* p = job.add_curve();
  p->set_step(10);
  p->set_tokens(100);
  p->set_cost_usd(0.5);
  p->set_gpu_seconds(3);
  p->set_val_loss(2.5);
  const std::vector<policy::CurvePoint> c = CurveOf(job);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].step, 10);
  EXPECT_EQ(c[0].val_loss, 2.5);
}

// Feeds `losses` through DecideEval as the scheduler does (one evaluation
// every 10 steps from step 0, spending $0.01 a step); returns the outcome
// of the last, or of the first that decided a stop.
EvalOutcome FeedOutcome(tally::v1::Job job, const std::vector<double>& losses) {
  EvalOutcome o;
  for (size_t i = 0; i < losses.size(); ++i) {
    const int64_t step = static_cast<int64_t>(10 * i);
    job.mutable_cost()->set_cost_usd(0.01 * static_cast<double>(step));
    tally::v1::EvalResult ev = Eval(step, losses[i]);
    ev.set_attempt(1);
    ev.set_tokens(step * 100);
    o = DecideEval(job, ev, false, "");
    if (o.stop) return o;
    job = o.job;
  }
  return o;
}

std::vector<std::string> Types(const EvalOutcome& o) {
  std::vector<std::string> out;
  for (const auto& e : o.events) out.push_back(e.type);
  return out;
}

TEST(DecideEvalTest, TheTargetRulesAndForecastInTheirOrder) {
  struct Case {
    const char* name;
    tally::v1::Job job;
    std::vector<double> losses;
    std::optional<tally::v1::JobState> stop;  // nullopt: goes on
    std::string rule;
    std::vector<std::string> events;  // of the last evaluation
  };
  tally::v1::Job target = JobWith(0, 0);
  target.mutable_spec()->mutable_early_stopping()->set_target_val_loss(3.5);
  tally::v1::Job relative = JobWith(0, 0);
  relative.mutable_spec()->mutable_early_stopping()->set_target_rel_to_baseline(0.5);
  // 3.59 is under the target and too small a gain for patience 1: the
  // target decides.
  tally::v1::Job target_and_patience = JobWith(1, 0);
  target_and_patience.mutable_spec()->mutable_early_stopping()->set_target_val_loss(3.595);
  tally::v1::Job target_at_the_end = JobWith(0, 0, 20);
  target_at_the_end.mutable_spec()->mutable_early_stopping()->set_target_val_loss(3.5);
  tally::v1::Job forecast = JobWith(0, 0, 100000);
  forecast.mutable_spec()->mutable_early_stopping()->set_target_val_loss(1.0);
  forecast.mutable_spec()->mutable_early_stopping()->set_forecast(true);
  forecast.mutable_spec()->mutable_training()->set_global_batch_tokens(100);
  const std::vector<double> plateau = {5, 4.2, 4.0, 3.9, 3.85, 3.82, 3.81, 3.805, 3.802, 3.801};
  const Case cases[] = {
      {"improving", JobWith(0, 0), {5, 4, 3}, std::nullopt, "", {"eval"}},
      {"target", target, {5, 4, 3}, tally::v1::JOB_STATE_SUCCEEDED, "target",
       {"eval", "target_reached"}},
      {"relative target", relative, {6, 4, 2.9}, tally::v1::JOB_STATE_SUCCEEDED, "target",
       {"eval", "target_reached"}},
      // Reached at the last step: recorded, no stop (nothing left to save).
      {"target at max_steps", target_at_the_end, {5, 4, 3}, std::nullopt, "",
       {"eval", "target_reached"}},
      {"the target before patience", target_and_patience, {3.6, 3.59},
       tally::v1::JOB_STATE_SUCCEEDED, "target", {"eval", "target_reached"}},
      {"patience", JobWith(1, 0), {5, 5}, tally::v1::JOB_STATE_EARLY_STOPPED, "patience",
       {"eval"}},
      {"forecast", forecast, plateau, tally::v1::JOB_STATE_EARLY_STOPPED, "forecast", {"eval"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const EvalOutcome o = FeedOutcome(c.job, c.losses);
    ASSERT_EQ(o.stop.has_value(), c.stop.has_value());
    if (c.stop) {
      EXPECT_EQ(o.stop->state, *c.stop);
      EXPECT_EQ(o.stop->rule, c.rule);
      EXPECT_FALSE(o.stop->reason.empty());
    }
    EXPECT_EQ(Types(o), c.events);
  }
}

TEST(DecideEvalTest, ATargetReachedRecordsWhereAndWhatItCost) {
  tally::v1::Job job = JobWith(0, 0);
  job.mutable_spec()->mutable_early_stopping()->set_target_val_loss(3.5);
  const EvalOutcome o = FeedOutcome(job, {5, 4, 3});
  ASSERT_TRUE(o.job.has_target_reached());
  EXPECT_EQ(o.job.target_val_loss(), 3.5);
  EXPECT_EQ(o.job.target_reached().step(), 20);
  EXPECT_EQ(o.job.target_reached().val_loss(), 3);
  EXPECT_GT(o.job.target_reached().cost_to_target_usd(), 0.1);
  EXPECT_LT(o.job.target_reached().cost_to_target_usd(), 0.2) << "interpolated between 10 and 20";
  EXPECT_THAT(o.events[1].reason, HasSubstr("target reached: val_loss 3.0000 <= target 3.5000"));
  EXPECT_EQ(o.job.step(), 20);
  EXPECT_EQ(o.job.val_loss(), 3);
  ASSERT_EQ(o.job.curve_size(), 3);
  EXPECT_EQ(o.job.curve(2).attempt(), 1);
  EXPECT_EQ(*o.events[0].val_loss, 3);
}

TEST(DecideEvalTest, TheForecastIsShownWithTheEvaluationAndAStoppingJobIsOnlyRecorded) {
  tally::v1::Job job = JobWith(0, 0, 100000);
  job.mutable_spec()->mutable_training()->set_global_batch_tokens(100);
  EvalOutcome o = FeedOutcome(job, {5, 4.2, 4.0, 3.9, 3.85, 3.82, 3.81});
  EXPECT_FALSE(o.stop.has_value()) << "a forecast stops only with early_stopping.forecast";
  EXPECT_TRUE(o.job.forecast().valid()) << o.job.forecast().reason();
  EXPECT_EQ(o.job.forecast().step(), 60);
  EXPECT_THAT(o.events[0].detail, HasSubstr("bits/byte; forecast "));

  // Stopping already: recorded (a new best kept), nothing judged.
  tally::v1::Job stopping = o.job;
  stopping.mutable_pending_stop()->set_rule("patience");
  tally::v1::EvalResult last = Eval(70, 3.0);
  last.set_attempt(1);
  const EvalOutcome final_eval = DecideEval(stopping, last, false, "");
  EXPECT_FALSE(final_eval.stop.has_value());
  EXPECT_EQ(Types(final_eval), std::vector<std::string>{"eval"});
  EXPECT_EQ(final_eval.job.early_stopping().best_val_loss(), 3.0);
  EXPECT_EQ(final_eval.job.early_stopping().best_step(), 70);
  EXPECT_EQ(final_eval.job.early_stopping().evals(), stopping.early_stopping().evals())
      << "not counted";
  EXPECT_EQ(final_eval.job.curve_size(), stopping.curve_size() + 1);
}

TEST(DecideEvalTest, TheRoutingWarningNamesWhere) {
  tally::v1::Job job = JobWith(0, 0);
  EvalOutcome o;
  for (int i = 0; i < kCollapseEvals; ++i) {
    o = DecideEval(job, Eval(10 * i, 4.0), true, "layer 1 expert 3 took 90%");
    job = o.job;
  }
  EXPECT_EQ(Types(o), (std::vector<std::string>{"eval", "warning"}));
  EXPECT_THAT(o.events[1].reason,
              HasSubstr("routing collapse: layer 1 expert 3 took 90% for 3 evaluations"));
}

}  // namespace
}  // namespace tally::sched

namespace tally::sched {
namespace {

TEST(DecideEvalTest, AnOlderStepsEvaluationNeverMovesTheShownStepBack) {
  tally::v1::Job job;
  job.set_step(34);
  job.set_tokens(3400);
  const EvalOutcome o = DecideEval(job, Eval(11, 2.5), false, "");
  EXPECT_EQ(o.job.step(), 34);
  EXPECT_EQ(o.job.tokens(), 3400);
  EXPECT_DOUBLE_EQ(o.job.val_loss(), 2.5) << "it is still the latest evaluation";
  EXPECT_EQ(DecideEval(job, Eval(40, 2.4), false, "").job.step(), 40);
}

}  // namespace
}  // namespace tally::sched

namespace tally::sched {
namespace {

// A job judged by its quantized loss (early_stopping.metric).
tally::v1::Job QuantizedJob(int patience, int64_t max_steps = 1000) {
  tally::v1::Job job = JobWith(patience, 0, max_steps);
  job.mutable_spec()->mutable_training()->set_eval_quantized("q4_0");
  job.mutable_spec()->mutable_training()->set_eval_quantized_layers("ffn");
  job.mutable_spec()->mutable_early_stopping()->set_metric("quantized_val_loss");
  return job;
}

// Feeds (val_loss, quantized_val_loss) pairs as FeedOutcome feeds losses.
EvalOutcome FeedBoth(tally::v1::Job job, const std::vector<std::pair<double, double>>& losses) {
  EvalOutcome o;
  for (size_t i = 0; i < losses.size(); ++i) {
    const int64_t step = static_cast<int64_t>(10 * i);
    job.mutable_cost()->set_cost_usd(0.01 * static_cast<double>(step));
    tally::v1::EvalResult ev = Eval(step, losses[i].first);
    ev.set_quantized_val_loss(losses[i].second);
    ev.set_attempt(1);
    ev.set_tokens(step * 100);
    o = DecideEval(job, ev, false, "");
    if (o.stop) return o;
    job = o.job;
  }
  return o;
}

// The metric decides every rule: one loss plateaus while the other
// improves, and only the judged one stops the job.
TEST(QuantizedMetricTest, EachRuleJudgesTheMetricOnly) {
  const std::vector<std::pair<double, double>> quantized_plateau = {
      {5, 5.5}, {4, 4.2}, {3.5, 4.3}, {3, 4.25}};
  const std::vector<std::pair<double, double>> float_plateau = {
      {5, 5.5}, {4, 4.8}, {4.1, 4.2}, {4.05, 3.9}};
  tally::v1::Job by_val = QuantizedJob(2);
  by_val.mutable_spec()->mutable_early_stopping()->clear_metric();

  EvalOutcome o = FeedBoth(QuantizedJob(2), quantized_plateau);
  ASSERT_TRUE(o.stop.has_value());
  EXPECT_EQ(o.stop->rule, "patience");
  EXPECT_THAT(o.stop->reason, HasSubstr("the best quantized_val_loss 4.2000 (step 10)"));
  EXPECT_FALSE(FeedBoth(by_val, quantized_plateau).stop.has_value()) << "val_loss improves";

  EXPECT_FALSE(FeedBoth(QuantizedJob(2), float_plateau).stop.has_value())
      << "quantized_val_loss improves";
  o = FeedBoth(by_val, float_plateau);
  ASSERT_TRUE(o.stop.has_value());
  EXPECT_THAT(o.stop->reason, HasSubstr("the best validation loss 4.0000"));

  // Divergence: the quantized loss, not val_loss.
  tally::v1::Job diverging = QuantizedJob(0);
  diverging.mutable_spec()->mutable_early_stopping()->set_divergence_factor(1.5);
  o = FeedBoth(diverging, {{5, 5}, {4, 4}, {3, 7}});
  ASSERT_TRUE(o.stop.has_value());
  EXPECT_EQ(o.stop->rule, "divergence");
  EXPECT_THAT(o.stop->reason, HasSubstr("divergence: quantized_val_loss 7.0000 at step 20"));
  o = FeedBoth(diverging, {{5, 5}, {4, std::nan("")}});
  ASSERT_TRUE(o.stop.has_value());
  EXPECT_EQ(o.stop->rule, "divergence");

  // No gain over the baseline: the step-0 quantized loss is the baseline.
  tally::v1::Job baseline = QuantizedJob(0);
  baseline.mutable_spec()->mutable_early_stopping()->set_baseline_evals(2);
  baseline.mutable_spec()->mutable_early_stopping()->set_baseline_min_rel_gain(0.1);
  o = FeedBoth(baseline, {{5, 5}, {3, 4.8}, {2, 4.7}});
  ASSERT_TRUE(o.stop.has_value());
  EXPECT_EQ(o.stop->rule, "no_gain_over_baseline");
  EXPECT_THAT(o.stop->reason, HasSubstr("the best quantized_val_loss 4.7000"));
  EXPECT_EQ(o.job.early_stopping().baseline_val_loss(), 5);
}

TEST(QuantizedMetricTest, TheTargetIsReachedByTheQuantizedLoss) {
  tally::v1::Job job = QuantizedJob(0);
  job.mutable_spec()->mutable_early_stopping()->set_target_val_loss(3.5);
  // val_loss reaches 3.5 at step 10; the quantized loss only at step 20.
  const EvalOutcome o = FeedBoth(job, {{5, 5.5}, {3.4, 3.8}, {3.3, 3.4}});
  ASSERT_TRUE(o.stop.has_value());
  EXPECT_EQ(o.stop->rule, "target");
  const tally::v1::TargetReached& t = o.job.target_reached();
  EXPECT_EQ(t.step(), 20);
  EXPECT_EQ(t.metric(), "quantized_val_loss");
  EXPECT_DOUBLE_EQ(t.val_loss(), 3.3);
  EXPECT_DOUBLE_EQ(t.quantized_val_loss(), 3.4);
  // Interpolated by the quantized loss: 3.8 -> 3.4 crosses 3.5 at 3/4 of
  // the way from step 10 ($0.10) to step 20 ($0.20).
  EXPECT_NEAR(t.cost_to_target_usd(), 0.175, 1e-12);
  EXPECT_THAT(o.events[1].reason,
              HasSubstr("target reached: quantized_val_loss 3.4000 <= target 3.5000 at step 20"));
  EXPECT_DOUBLE_EQ(*o.events[0].quantized_val_loss, 3.4);
  EXPECT_DOUBLE_EQ(o.job.quantized_val_loss(), 3.4);
  EXPECT_DOUBLE_EQ(o.job.curve(1).quantized_val_loss(), 3.8);

  // A target relative to the baseline is of the step-0 quantized loss.
  tally::v1::Job relative = QuantizedJob(0);
  relative.mutable_spec()->mutable_early_stopping()->set_target_rel_to_baseline(0.5);
  const EvalOutcome r = FeedBoth(relative, {{4, 6}, {2.9, 3.5}, {2.5, 2.9}});
  EXPECT_DOUBLE_EQ(r.job.target_val_loss(), 3.0);
  ASSERT_TRUE(r.stop.has_value());
  EXPECT_EQ(r.job.target_reached().step(), 20);
}

// The forecast is of the quantized curve and says so; an evaluation
// without the quantized loss is recorded and not judged.
TEST(QuantizedMetricTest, TheForecastAndAnUnjudgedEvaluation) {
  tally::v1::Job job = QuantizedJob(0, 100000);
  job.mutable_spec()->mutable_training()->set_global_batch_tokens(100);
  std::vector<std::pair<double, double>> losses;
  for (double l : {5.0, 4.2, 4.0, 3.9, 3.85, 3.82, 3.81}) losses.push_back({l - 1, l});
  EvalOutcome o = FeedBoth(job, losses);
  ASSERT_TRUE(o.job.forecast().valid()) << o.job.forecast().reason();
  EXPECT_EQ(o.job.forecast().metric(), "quantized_val_loss");
  EXPECT_GT(o.job.forecast().final_val_loss(), 3.0) << "of the quantized curve, not val_loss's";
  EXPECT_THAT(o.job.forecast().reason(), HasSubstr("final quantized_val_loss"));

  tally::v1::Job before = o.job;
  const EvalOutcome unjudged = DecideEval(before, Eval(70, 2.0), false, "");
  EXPECT_EQ(unjudged.job.early_stopping().evals(), before.early_stopping().evals());
  EXPECT_FALSE(unjudged.job.has_quantized_val_loss());
  EXPECT_EQ(unjudged.job.curve_size(), before.curve_size() + 1);
  EXPECT_FALSE(unjudged.stop.has_value());
  const std::vector<policy::CurvePoint> c = CurveOf(unjudged.job);
  EXPECT_TRUE(std::isnan(c.back().val_loss)) << "no quantized loss: no point of the metric";
  EXPECT_EQ(CurveOf(unjudged.job, policy::LossMetric::kValLoss).back().val_loss, 2.0);
}

}  // namespace
}  // namespace tally::sched
