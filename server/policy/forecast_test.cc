#include "server/policy/forecast.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::policy {
namespace {

using ::testing::HasSubstr;

const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();

// A run of 2000 steps of 8192 tokens, 50 warm-up steps, evaluated every 50
// steps; the forecast is made at 30% (step 600).
constexpr int64_t kMaxSteps = 2000;
constexpr double kTokensPerStep = 8192;
constexpr int64_t kWarmup = 50;
constexpr int64_t kInterval = 50;
constexpr int64_t kForecastAt = 600;

double PowerLaw(double a, double b, double c, double tokens) {
  return a + b * std::pow(tokens, -c);
}

// The learning rate relative to its peak, as worker/train/lr_schedule.h
// computes it (the server does not include worker code).
double LrRatio(int64_t step, int64_t warmup, int64_t max_steps, double min_ratio) {
  if (warmup > 0 && step <= warmup) return static_cast<double>(step) / warmup;
  const double p = std::clamp(static_cast<double>(step - warmup) / (max_steps - warmup), 0.0, 1.0);
  return min_ratio + 0.5 * (1 - min_ratio) * (1 + std::cos(M_PI * p));
}

// Evaluations at 0, kInterval, ... up to `until`, loss = f(step, tokens).
std::vector<ForecastPoint> Curve(const std::function<double(int64_t, double)>& f,
                                 int64_t until = kForecastAt, int64_t interval = kInterval,
                                 double tokens_per_step = kTokensPerStep) {
  std::vector<ForecastPoint> curve;
  for (int64_t s = 0; s <= until; s += interval) {
    const double t = static_cast<double>(s) * tokens_per_step;
    curve.push_back({s, static_cast<int64_t>(t), f(s, t)});
  }
  return curve;
}

// Power law in tokens with seeded relative Gaussian noise.
std::function<double(int64_t, double)> NoisyPowerLaw(double a, double b, double c, double rel_noise,
                                                     uint32_t seed) {
  auto gen = std::make_shared<std::mt19937>(seed);
  return [=](int64_t s, double t) {
    std::normal_distribution<double> noise(0, rel_noise);
    const double clean = s == 0 ? a + b : PowerLaw(a, b, c, t);
    return clean * (1 + noise(*gen));
  };
}

ForecastRun MakeRun(double min_lr_ratio = 1.0) {
  ForecastRun r;
  r.max_steps = kMaxSteps;
  r.tokens_per_step = kTokensPerStep;
  r.warmup_steps = kWarmup;
  r.min_lr_ratio = min_lr_ratio;
  return r;
}

const double kFinalTokens = kMaxSteps * kTokensPerStep;

struct Case {
  const char* name;
  std::vector<ForecastPoint> curve;
  ForecastRun run;
  ForecastOptions options;
  ForecastStatus want_status;
  double truth;        // the final loss; NaN: no forecast expected
  double max_rel_err;  // |predicted - truth| / truth at most this
  bool band_contains_truth;
  const char* reason_has;
};

class ForecastTable : public ::testing::TestWithParam<Case> {};

TEST_P(ForecastTable, PredictsWhatItShould) {
  const Case& c = GetParam();
  const LossForecast f = ForecastFinalLoss(c.curve, c.run, c.options);
  EXPECT_EQ(f.status, c.want_status) << f.reason;
  EXPECT_THAT(f.reason, HasSubstr(c.reason_has));
  if (std::isnan(c.truth)) return;
  ASSERT_TRUE(f.ok()) << f.reason;
  EXPECT_LE(std::abs(f.predicted - c.truth) / c.truth, c.max_rel_err)
      << "predicted " << f.predicted << " truth " << c.truth << ": " << f.reason;
  EXPECT_LE(f.low, f.predicted);
  EXPECT_GE(f.high, f.predicted);
  if (c.band_contains_truth) {
    EXPECT_LE(f.low, c.truth) << f.reason;
    EXPECT_GE(f.high, c.truth) << f.reason;
  }
  EXPECT_EQ(f.at_step, kMaxSteps);
}

// A late drop from the cosine decay: the loss carries a term proportional
// to the learning rate (the optimizer's noise floor) that the decay removes.
std::vector<ForecastPoint> DecayCurve(int64_t until, double floor_term) {
  return Curve(
      [=](int64_t s, double t) {
        return (s == 0 ? 5.0 : PowerLaw(2.0, 40.0, 0.35, t)) +
               floor_term * LrRatio(s, kWarmup, kMaxSteps, 0.1);
      },
      until);
}
const double kDecayTruth = PowerLaw(2.0, 40.0, 0.35, kFinalTokens) + 0.12 * 0.1;

std::vector<ForecastPoint> WithLossAt(std::vector<ForecastPoint> c, int64_t step, double v) {
  for (ForecastPoint& p : c) {
    if (p.step == step) p.val_loss = v;
  }
  return c;
}

std::vector<ForecastPoint> WithOutlierAt(std::vector<ForecastPoint> c, int64_t step) {
  for (ForecastPoint& p : c) {
    if (p.step == step) p.val_loss *= 1.3;
  }
  return c;
}

std::vector<ForecastPoint> Scaled(std::vector<ForecastPoint> c, double k) {
  for (ForecastPoint& p : c) p.val_loss *= k;
  return c;
}

ForecastOptions NoDecayAllowance() {
  ForecastOptions o;
  o.lr_decay_allowance = 0;
  return o;
}

const double kPlTruth = PowerLaw(2.0, 40.0, 0.35, kFinalTokens);

INSTANTIATE_TEST_SUITE_P(
    Curves, ForecastTable,
    ::testing::Values(
        Case{"exact_power_law", Curve([](int64_t s, double t) {
               return s == 0 ? 5.0 : PowerLaw(2.0, 40.0, 0.35, t);
             }),
             MakeRun(), {}, ForecastStatus::kOk, kPlTruth, 1e-6, true, "from 10 evals"},
        Case{"power_law_with_noise", Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 7)), MakeRun(), {},
             ForecastStatus::kOk, kPlTruth, 0.03, true, "band"},
        Case{"power_law_with_noise_other_seed", Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 11)),
             MakeRun(), {}, ForecastStatus::kOk, kPlTruth, 0.03, true, "band"},
        Case{"fast_power_law", Curve([](int64_t s, double t) {
               return s == 0 ? 5.0 : PowerLaw(1.5, 3e4, 0.9, t);
             }),
             MakeRun(), {}, ForecastStatus::kOk, PowerLaw(1.5, 3e4, 0.9, kFinalTokens), 1e-4, true,
             "evals"},
        // Flattened by 30%: the forecast stays on the plateau.
        Case{"plateau", Curve([](int64_t s, double) {
               return 3.0 + 2.0 * std::exp(-static_cast<double>(s) / 40.0);
             }),
             MakeRun(), {}, ForecastStatus::kOk, 3.0, 0.01, true, "evals"},
        Case{"constant", Curve([](int64_t, double) { return 2.5; }), MakeRun(), {},
             ForecastStatus::kOk, 2.5, 1e-9, true, "final val_loss 2.5 "},
        // The decay's late drop is not in the first 30%; the low edge covers it.
        Case{"late_lr_decay_drop", DecayCurve(kForecastAt, 0.12), MakeRun(0.1), {},
             ForecastStatus::kOk, kDecayTruth, 0.06, true, "evals"},
        Case{"nan_in_the_middle",
             WithLossAt(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.003, 3)), 300, kNaN), MakeRun(), {},
             ForecastStatus::kOk, kPlTruth, 0.03, true, "1 non-finite excluded (step 300)"},
        Case{"inf_in_the_middle",
             WithLossAt(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.003, 3)), 300, kInf), MakeRun(), {},
             ForecastStatus::kOk, kPlTruth, 0.03, true, "non-finite"},
        Case{"one_outlier_is_down_weighted",
             WithOutlierAt(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.002, 5)), 450), MakeRun(), {},
             ForecastStatus::kOk, kPlTruth, 0.02, true, "outlier(s) down-weighted"},
        Case{"huge_magnitudes",
             Scaled(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 7)), 1e6), MakeRun(), {},
             ForecastStatus::kOk, kPlTruth * 1e6, 0.03, true, "evals"},
        Case{"small_magnitudes",
             Scaled(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 7)), 1e-6), MakeRun(), {},
             ForecastStatus::kOk, kPlTruth * 1e-6, 0.03, true, "evals"},
        Case{"huge_token_counts",
             Curve([](int64_t s, double t) { return s == 0 ? 5.0 : PowerLaw(2.0, 4e4, 0.35, t); },
                   kForecastAt, kInterval, 1e9),
             [] { ForecastRun r = MakeRun(); r.tokens_per_step = 1e9; return r; }(), {},
             ForecastStatus::kOk, PowerLaw(2.0, 4e4, 0.35, kMaxSteps * 1e9), 1e-6, true,
             "evals"},
        Case{"only_two_evals", Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 7), 200), MakeRun(), {},
             ForecastStatus::kTooFewEvals, kNaN, 0, false,
             "needs 4 evaluations after warm-up (step > 100), has 2 (3 in warm-up"},
        Case{"warmup_evals_do_not_count",
             Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 7), 600, 25),
             [] { ForecastRun r = MakeRun(); r.warmup_steps = 530; return r; }(),
             [] { ForecastOptions o; o.settle_warmups = 1; return o; }(),
             ForecastStatus::kTooFewEvals, kNaN, 0, false, "has 3 (22 in warm-up"},
        Case{"diverging", Curve([](int64_t s, double) { return 2.0 + 0.002 * s; }), MakeRun(), {},
             ForecastStatus::kRising, kNaN, 0, false, "rises"},
        Case{"step_past_max_steps", Curve([](int64_t, double) { return 2.0; }, 2100), MakeRun(), {},
             ForecastStatus::kInvalidInput, kNaN, 0, false, "step 2050 is past max_steps 2000"},
        Case{"negative_loss", Curve([](int64_t, double) { return -1.0; }), MakeRun(), {},
             ForecastStatus::kInvalidInput, kNaN, 0, false, "negative"},
        Case{"no_max_steps", Curve([](int64_t, double) { return 2.0; }),
             [] { ForecastRun r = MakeRun(); r.max_steps = 0; return r; }(), {},
             ForecastStatus::kInvalidInput, kNaN, 0, false, "max_steps must be positive"},
        Case{"no_tokens_per_step", Curve([](int64_t, double) { return 2.0; }),
             [] { ForecastRun r = MakeRun(); r.tokens_per_step = kNaN; return r; }(), {},
             ForecastStatus::kInvalidInput, kNaN, 0, false, "tokens_per_step"},
        Case{"bad_settle_warmups", Curve([](int64_t, double) { return 2.0; }), MakeRun(),
             [] { ForecastOptions o; o.settle_warmups = 0.5; return o; }(),
             ForecastStatus::kInvalidInput, kNaN, 0, false, "settle_warmups must be in [1, 100]"},
        Case{"bad_band_k", Curve([](int64_t, double) { return 2.0; }), MakeRun(),
             [] { ForecastOptions o; o.band_k = -1; return o; }(),
             ForecastStatus::kInvalidInput, kNaN, 0, false, "band_k"}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

TEST(Forecast, LateDecayDropEscapesTheBandWithoutTheAllowance) {
  // The same curve as late_lr_decay_drop: without the allowance the band
  // sits above the final loss, so the allowance is what keeps it honest.
  const LossForecast with = ForecastFinalLoss(DecayCurve(kForecastAt, 0.12), MakeRun(0.1));
  const LossForecast without =
      ForecastFinalLoss(DecayCurve(kForecastAt, 0.12), MakeRun(0.1), NoDecayAllowance());
  ASSERT_TRUE(with.ok() && without.ok());
  EXPECT_GT(without.low, kDecayTruth) << without.reason;
  EXPECT_LE(with.low, kDecayTruth) << with.reason;
  EXPECT_GT(with.decay_allowance, 0);
  EXPECT_EQ(without.decay_allowance, 0);
  // Made early under decay, the point forecast sits above the truth, as the
  // header says.
  EXPECT_GT(with.predicted, kDecayTruth);
}

TEST(Forecast, SettlingAfterWarmupKeepsTheEarlyTransientOut) {
  // A fast transient (token frequencies) on top of the power law, gone by
  // ~2 warm-ups: fitted, it bends the curve flat and the forecast high.
  const auto curve = Curve([](int64_t s, double t) {
    return (s == 0 ? 5.0 : PowerLaw(2.0, 40.0, 0.35, t)) +
           1.5 * std::exp(-static_cast<double>(s) / 25.0);
  });
  ForecastOptions right_after_warmup;
  right_after_warmup.settle_warmups = 1;
  const LossForecast settled = ForecastFinalLoss(curve, MakeRun());
  const LossForecast early = ForecastFinalLoss(curve, MakeRun(), right_after_warmup);
  ASSERT_TRUE(settled.ok() && early.ok());
  EXPECT_EQ(early.evals_used, settled.evals_used + 1);  // step 100
  EXPECT_LT(std::abs(settled.predicted - kPlTruth), std::abs(early.predicted - kPlTruth));
  EXPECT_LT(std::abs(settled.predicted - kPlTruth) / kPlTruth, 0.01);
}

TEST(Forecast, DecayAllowanceVanishesAtTheEndAndWithoutDecay) {
  const LossForecast at_end = ForecastFinalLoss(DecayCurve(kMaxSteps, 0.12), MakeRun(0.1));
  ASSERT_TRUE(at_end.ok()) << at_end.reason;
  EXPECT_NEAR(at_end.decay_allowance, 0, 1e-12);
  // At the end the forecast is the last evaluation.
  EXPECT_NEAR(at_end.predicted, kDecayTruth, 0.01);
  const LossForecast constant_lr =
      ForecastFinalLoss(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 7)), MakeRun(1.0));
  EXPECT_EQ(constant_lr.decay_allowance, 0);
}

TEST(Forecast, BandCoversTheTruthForMostSeeds) {
  int covered = 0;
  double worst_rel_err = 0;
  constexpr int kSeeds = 50;
  for (uint32_t seed = 0; seed < kSeeds; ++seed) {
    const LossForecast f =
        ForecastFinalLoss(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 100 + seed)), MakeRun());
    ASSERT_TRUE(f.ok()) << f.reason;
    covered += f.low <= kPlTruth && kPlTruth <= f.high;
    worst_rel_err = std::max(worst_rel_err, std::abs(f.predicted - kPlTruth) / kPlTruth);
  }
  EXPECT_GE(covered, 45) << "of " << kSeeds;
  EXPECT_LT(worst_rel_err, 0.05);
}

TEST(Forecast, BandNarrowsAsTheRunGoesOn) {
  const auto noisy = NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 9);
  const std::vector<ForecastPoint> full = Curve(noisy, kMaxSteps);
  std::vector<ForecastPoint> early(full.begin(), full.begin() + 9);  // to step 400
  std::vector<ForecastPoint> late(full.begin(), full.begin() + 33);  // to step 1600
  const LossForecast fe = ForecastFinalLoss(early, MakeRun());
  const LossForecast fl = ForecastFinalLoss(late, MakeRun());
  ASSERT_TRUE(fe.ok() && fl.ok());
  EXPECT_LT(fl.high - fl.low, fe.high - fe.low);
}

TEST(Forecast, ReportsTheFitAndTheCounts) {
  std::vector<ForecastPoint> curve =
      Curve([](int64_t s, double t) { return s == 0 ? 5.0 : PowerLaw(2.0, 40.0, 0.35, t); });
  curve[5].val_loss = kNaN;     // step 250
  curve.push_back(curve[3]);    // step 150 again, from a resumed attempt
  curve.back().val_loss = 100;  // ignored: the first evaluation of a step counts
  const LossForecast f = ForecastFinalLoss(curve, MakeRun());
  ASSERT_TRUE(f.ok()) << f.reason;
  EXPECT_NEAR(f.a, 2.0, 1e-4);
  EXPECT_NEAR(f.b, 40.0, 40.0 * 1e-3);
  EXPECT_NEAR(f.c, 0.35, 1e-4);
  EXPECT_EQ(f.evals_used, 9);        // steps 150..600 but 250
  EXPECT_EQ(f.evals_before_fit, 3);  // steps 0, 50 and 100: warm-up and settling
  EXPECT_EQ(f.evals_non_finite, 1);
  EXPECT_EQ(f.evals_outliers, 0);
  EXPECT_DOUBLE_EQ(f.at_tokens, kFinalTokens);
}

TEST(Forecast, OrderOfPointsDoesNotMatter) {
  std::vector<ForecastPoint> curve = Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.005, 7));
  const LossForecast in_order = ForecastFinalLoss(curve, MakeRun());
  std::reverse(curve.begin(), curve.end());
  const LossForecast reversed = ForecastFinalLoss(curve, MakeRun());
  EXPECT_EQ(in_order.predicted, reversed.predicted);
  EXPECT_EQ(in_order.low, reversed.low);
}

TEST(Forecast, EmptyCurveHasNoForecast) {
  const LossForecast f = ForecastFinalLoss({}, MakeRun());
  EXPECT_EQ(f.status, ForecastStatus::kTooFewEvals);
  EXPECT_THAT(f.reason, HasSubstr("has 0"));
  EXPECT_FALSE(CannotReach(f, 1.0).stop);
  EXPECT_FALSE(CannotImproveBy(f, 1.0, 0.03).stop);
}

LossForecast Made(double predicted, double low, double high) {
  LossForecast f;
  f.status = ForecastStatus::kOk;
  f.predicted = predicted;
  f.low = low;
  f.high = high;
  f.at_step = 2000;
  f.evals_used = 6;
  return f;
}

struct DecisionCase {
  const char* name;
  LossForecast forecast;
  double target;  // NaN: CannotImproveBy with best/min_rel_delta
  double best;
  double min_rel_delta;
  bool want_stop;
  const char* reason_has;
};

class ForecastDecisions : public ::testing::TestWithParam<DecisionCase> {};

TEST_P(ForecastDecisions, DecidesWhatItShould) {
  const DecisionCase& c = GetParam();
  const ForecastDecision d = std::isnan(c.best)
                                 ? CannotReach(c.forecast, c.target)
                                 : CannotImproveBy(c.forecast, c.best, c.min_rel_delta);
  EXPECT_EQ(d.stop, c.want_stop) << d.reason;
  EXPECT_THAT(d.reason, HasSubstr(c.reason_has));
}

INSTANTIATE_TEST_SUITE_P(
    Decisions, ForecastDecisions,
    ::testing::Values(
        DecisionCase{"low_edge_above_target", Made(2.91, 2.85, 2.97), 2.5, kNaN, 0, true,
                     "forecast: final val_loss 2.91 (2.85 to 2.97) at step 2000 from 6 evals "
                     "cannot reach the target 2.5"},
        DecisionCase{"target_inside_band", Made(2.91, 2.85, 2.97), 2.9, kNaN, 0, false,
                     "may reach the target 2.9"},
        DecisionCase{"target_at_low_edge_may_be_reached", Made(2.91, 2.85, 2.97), 2.85, kNaN, 0,
                     false, "may reach"},
        DecisionCase{"target_above_band", Made(2.91, 2.85, 2.97), 3.5, kNaN, 0, false, "may reach"},
        DecisionCase{"infinite_target", Made(2.91, 2.85, 2.97), kInf, kNaN, 0, false, "not finite"},
        DecisionCase{"no_forecast_no_reach_decision", LossForecast{}, 0.1, kNaN, 0, false, ""},
        // best 3.0, 3%: the threshold is 2.91; equal to it is not an improvement.
        DecisionCase{"low_edge_at_threshold_cannot_improve", Made(2.95, 2.91, 3.0), 0, 3.0, 0.03,
                     true, "cannot improve on the best 3 by 3% (below 2.91)"},
        DecisionCase{"low_edge_below_threshold_may_improve", Made(2.95, 2.9099, 3.0), 0, 3.0, 0.03,
                     false, "may improve on the best 3"},
        DecisionCase{"no_forecast_no_improve_decision", LossForecast{}, 0, 3.0, 0.03, false, ""},
        DecisionCase{"bad_min_rel_delta", Made(2.95, 2.93, 3.0), 0, 3.0, 1.5, false,
                     "min_rel_delta"}),
    [](const ::testing::TestParamInfo<DecisionCase>& info) {
      return std::string(info.param.name);
    });

TEST(Forecast, DecisionsOnARealForecast) {
  // A curve heading for ~2.12 with a band of about 1.95 to 2.15: 1.9 is out of
  // reach, 2.4 is not.
  const LossForecast f =
      ForecastFinalLoss(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.003, 21)), MakeRun(0.1));
  ASSERT_TRUE(f.ok()) << f.reason;
  EXPECT_TRUE(CannotReach(f, 1.9).stop) << f.reason;
  EXPECT_FALSE(CannotReach(f, 2.4).stop) << f.reason;
  // The last evaluation (step 600) is ~2.6: a 3% gain on it is within reach,
  // a 30% one is not.
  EXPECT_FALSE(CannotImproveBy(f, f.high, 0.03).stop) << f.reason;
  EXPECT_TRUE(CannotImproveBy(f, 2.6, 0.3).stop) << f.reason;
}

// A curve of the quantized loss is fitted the same; its reasons name it.
TEST(Forecast, ReasonsNameTheMetric) {
  ForecastOptions options;
  options.metric = "quantized_val_loss";
  const LossForecast f = ForecastFinalLoss(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.003, 21)),
                                           MakeRun(0.1), options);
  ASSERT_TRUE(f.ok()) << f.reason;
  EXPECT_EQ(f.metric, "quantized_val_loss");
  EXPECT_THAT(f.reason, HasSubstr("forecast: final quantized_val_loss "));
  EXPECT_THAT(CannotReach(f, 1.9).reason, HasSubstr("final quantized_val_loss"));
  const LossForecast plain =
      ForecastFinalLoss(Curve(NoisyPowerLaw(2.0, 40.0, 0.35, 0.003, 21)), MakeRun(0.1));
  EXPECT_THAT(plain.reason, HasSubstr("forecast: final val_loss "));
}

}  // namespace
}  // namespace tally::policy
