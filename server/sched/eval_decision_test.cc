#include "server/sched/eval_decision.h"

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

}  // namespace
}  // namespace tally::sched
