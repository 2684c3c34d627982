#include "server/policy/early_stopping.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/policy/loss_metric.h"
#include "server/policy/stop_rules.h"

namespace tally::policy {
namespace {

using ::testing::HasSubstr;

struct Case {
  const char* name;
  EarlyStoppingRules rules;
  std::vector<std::pair<int64_t, double>> evals;  // (step, val_loss)
  StopRule want_rule;
  int want_stop_at;  // index of the eval that stops; -1 none
};

EarlyStoppingRules Patience(int p, double rel = 0.03, int min_evals = 0) {
  EarlyStoppingRules r;
  r.patience = p;
  r.min_rel_delta = rel;
  r.min_evals = min_evals;
  return r;
}

class EarlyStoppingTable : public ::testing::TestWithParam<Case> {};

TEST_P(EarlyStoppingTable, StopsWhereItShould) {
  const Case& c = GetParam();
  EarlyStoppingState s;
  int stopped_at = -1;
  StopRule rule = StopRule::kNone;
  for (size_t i = 0; i < c.evals.size(); ++i) {
    auto d = ObserveEval(c.rules, &s, c.evals[i].first, c.evals[i].second);
    if (d.rule != StopRule::kNone) {
      stopped_at = static_cast<int>(i);
      rule = d.rule;
      EXPECT_THAT(d.reason, HasSubstr(StopRuleName(rule) == std::string("no_gain_over_baseline")
                                          ? "no gain over baseline"
                                          : StopRuleName(rule)));
      break;
    }
  }
  EXPECT_EQ(stopped_at, c.want_stop_at);
  EXPECT_EQ(rule, c.want_rule);
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

INSTANTIATE_TEST_SUITE_P(
    Rules, EarlyStoppingTable,
    ::testing::Values(
        Case{"improving_never_stops", Patience(2), {{0, 5}, {10, 4}, {20, 3}, {30, 2}},
             StopRule::kNone, -1},
        Case{"plateau_stops_after_patience", Patience(2),
             {{0, 5}, {10, 4}, {20, 3.99}, {30, 3.98}}, StopRule::kPatience, 3},
        // 4 * 0.97 = 3.88: exactly at the threshold is not an improvement.
        Case{"exactly_at_threshold_is_not_improvement", Patience(1),
             {{0, 4}, {10, 3.88}}, StopRule::kPatience, 1},
        Case{"just_below_threshold_improves", Patience(1),
             {{0, 4}, {10, 3.8799}}, StopRule::kNone, -1},
        Case{"min_evals_delays_patience", Patience(1, 0.03, 4),
             {{0, 4}, {10, 4}, {20, 4}, {30, 4}}, StopRule::kPatience, 3},
        Case{"nan_at_first_eval_diverges", Patience(5), {{0, kNaN}}, StopRule::kDivergence, 0},
        Case{"inf_diverges_even_without_rules", EarlyStoppingRules{}, {{0, 5}, {10, kInf}},
             StopRule::kDivergence, 1},
        Case{"above_factor_of_best_diverges",
             [] { EarlyStoppingRules r; r.divergence_factor = 1.5; return r; }(),
             {{0, 5}, {10, 2}, {20, 2.9}, {30, 3.1}}, StopRule::kDivergence, 3},
        Case{"no_gain_over_baseline",
             [] { EarlyStoppingRules r; r.baseline_evals = 2; r.baseline_min_rel_gain = 0.1;
                  return r; }(),
             {{0, 5}, {10, 4.8}, {20, 4.6}}, StopRule::kNoGainOverBaseline, 2},
        Case{"beats_baseline_keeps_going",
             [] { EarlyStoppingRules r; r.baseline_evals = 2; r.baseline_min_rel_gain = 0.1;
                  return r; }(),
             {{0, 5}, {10, 4.8}, {20, 4.4}, {30, 4.3}}, StopRule::kNone, -1},
        Case{"absolute_min_delta_counts_as_improvement",
             [] { EarlyStoppingRules r = Patience(1, 0.5); r.min_delta = 0.01; return r; }(),
             {{0, 4}, {10, 3.98}, {20, 3.96}}, StopRule::kNone, -1},
        Case{"repeated_step_after_resume_is_ignored", Patience(2),
             {{0, 5}, {10, 5}, {10, 5}, {10, 5}, {20, 4}}, StopRule::kNone, -1}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(EarlyStoppingTest, PatienceLeftCountsDownAndResets) {
  const auto r = Patience(3);
  EarlyStoppingState s;
  EXPECT_EQ(ObserveEval(r, &s, 0, 5).patience_left, 3);
  EXPECT_EQ(ObserveEval(r, &s, 1, 5).patience_left, 2);
  EXPECT_EQ(ObserveEval(r, &s, 2, 5).patience_left, 1);
  EXPECT_EQ(ObserveEval(r, &s, 3, 4).patience_left, 3);
  EXPECT_EQ(s.best_step, 3);
  EXPECT_EQ(ObserveEval(EarlyStoppingRules{}, &s, 4, 4).patience_left, -1);
}

// State is plain data: a copy taken mid-window (as tallyd stores it) resumes
// the same count.
TEST(EarlyStoppingTest, RestartInTheMiddleOfThePatienceWindow) {
  const auto r = Patience(3);
  EarlyStoppingState s;
  ObserveEval(r, &s, 0, 5);
  ObserveEval(r, &s, 10, 5);
  ObserveEval(r, &s, 20, 5);
  EarlyStoppingState restored = s;  // what the store kept
  // The resumed attempt re-evaluates step 20, then goes on.
  EXPECT_FALSE(ObserveEval(r, &restored, 20, 5).counted);
  auto d = ObserveEval(r, &restored, 30, 5);
  EXPECT_EQ(d.rule, StopRule::kPatience);
}

// The rules judge whatever loss they are given; their reasons name it.
TEST(EarlyStoppingTest, ReasonsNameTheMetricJudged) {
  EarlyStoppingRules r = Patience(1);
  r.metric_name = kQuantizedValLossMetric;
  EarlyStoppingState s;
  ObserveEval(r, &s, 0, 5);
  auto d = ObserveEval(r, &s, 10, 5);
  ASSERT_EQ(d.rule, StopRule::kPatience);
  EXPECT_THAT(d.reason, HasSubstr("best quantized_val_loss 5.0000 (step 0)"));
  r.divergence_factor = 1.5;
  EarlyStoppingState t;
  ObserveEval(r, &t, 0, 2);
  d = ObserveEval(r, &t, 10, 3.5);
  ASSERT_EQ(d.rule, StopRule::kDivergence);
  EXPECT_THAT(d.reason, HasSubstr("divergence: quantized_val_loss 3.5000 at step 10"));
  EarlyStoppingState u;
  d = ObserveEval(r, &u, 0, kNaN);
  EXPECT_THAT(d.reason, HasSubstr("divergence: quantized_val_loss is nan"));
  EarlyStoppingState v;
  d = ObserveEval(Patience(1), &v, 0, kNaN);
  EXPECT_THAT(d.reason, HasSubstr("divergence: validation loss is nan"));
}

// A point with val_loss() and an optional quantized_val_loss(), as the
// protos have them.
struct FakePoint {
  double val = 0;
  bool has_quantized = false;
  double quantized = 0;
  double val_loss() const { return val; }
  bool has_quantized_val_loss() const { return has_quantized; }
  double quantized_val_loss() const { return quantized; }
};

TEST(LossMetricTest, NamesParseAndValues) {
  EXPECT_EQ(ParseLossMetric(""), LossMetric::kValLoss);
  EXPECT_EQ(ParseLossMetric("val_loss"), LossMetric::kValLoss);
  EXPECT_EQ(ParseLossMetric("quantized_val_loss"), LossMetric::kQuantizedValLoss);
  EXPECT_STREQ(LossMetricName(LossMetric::kValLoss), "val_loss");
  EXPECT_STREQ(LossMetricName(LossMetric::kQuantizedValLoss), "quantized_val_loss");
  const FakePoint both{2.0, true, 2.5};
  const FakePoint float_only{2.0, false, 0};
  EXPECT_EQ(LossOf(LossMetric::kValLoss, both), 2.0);
  EXPECT_EQ(LossOf(LossMetric::kQuantizedValLoss, both), 2.5);
  EXPECT_EQ(LossOf(LossMetric::kValLoss, float_only), 2.0);
  EXPECT_TRUE(std::isnan(LossOf(LossMetric::kQuantizedValLoss, float_only)))
      << "absent is no evaluation, never 0";
}

// Every rule the early-stopping policy decides is one tally_early_stops_total
// and tally_job_ends_total{state="early_stopped"} are labelled with, and no
// rule is listed under two terminal states.
TEST(StopRulesTest, EveryPolicyRuleIsALabelOfItsTerminalState) {
  std::vector<std::string> early(rules::EarlyStopRules().begin(), rules::EarlyStopRules().end());
  for (StopRule r : {StopRule::kPatience, StopRule::kDivergence, StopRule::kNoGainOverBaseline}) {
    EXPECT_THAT(early, ::testing::Contains(std::string(StopRuleName(r))));
  }
  std::vector<std::string> all;
  for (const auto& [state, names] : rules::JobEndRules()) {
    if (std::string(state) == "early_stopped") {
      EXPECT_EQ(std::vector<std::string>(names.begin(), names.end()), early);
    }
    for (const char* n : names) {
      EXPECT_THAT(all, ::testing::Not(::testing::Contains(std::string(n)))) << n;
      all.push_back(n);
    }
  }
  EXPECT_EQ(all.size(), 12u);
}

}  // namespace
}  // namespace tally::policy
