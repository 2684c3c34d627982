#include "worker/precision/scaling.h"

#include <limits>

#include "gtest/gtest.h"
#include "worker/precision/fp8_recipe.h"

namespace tally::precision {
namespace {

TEST(ScaleTest, ZeroAndHugeAmax) {
  EXPECT_DOUBLE_EQ(ScaleForAmax(2.0, Fp8Format::kE4M3, 0, 1.0), 224.0);
  EXPECT_DOUBLE_EQ(ScaleForAmax(2.0, Fp8Format::kE4M3, 1, 1.0), 112.0);
  EXPECT_DOUBLE_EQ(ScaleForAmax(0.0, Fp8Format::kE4M3, 0, 7.0), 7.0);  // never infinite
  EXPECT_DOUBLE_EQ(ScaleForAmax(std::numeric_limits<double>::infinity(), Fp8Format::kE5M2, 0,
                                7.0),
                   7.0);
  EXPECT_DOUBLE_EQ(ScaleForAmax(std::nan(""), Fp8Format::kE5M2, 0, 7.0), 7.0);
  const double tiny = ScaleForAmax(1e30, Fp8Format::kE4M3, 0, 1.0);
  EXPECT_GT(tiny, 0);
  EXPECT_TRUE(std::isfinite(tiny));
  // FP32 would hold neither an infinite nor a zero scale.
  EXPECT_DOUBLE_EQ(ScaleForAmax(1e-45, Fp8Format::kE4M3, 0, 7.0), 7.0);
}

// A recipe and its table, as the converter drives them: a scale per cast
// (recording the amax), the step's finite amax observed, then the step.
struct Driver {
  explicit Driver(RecipeConfig c) : recipe(MakeFp8Recipe(c)), table(c, at::kCPU) {
    t = table.Add(Fp8Format::kE4M3);
  }
  double Cast(float value) {
    const at::Tensor x = at::full({1, 1}, value);
    bool cast_records = false;
    const Scale s = recipe->ScaleFor(&table, t, x, true, &cast_records);
    if (cast_records) {
      CastFp8(x, s.scale, Fp8Format::kE4M3, true, false,
              {table.step_amax(t), table.step_finite(t), {}});
    }
    EXPECT_NEAR(s.inv_scale.item<double>() * s.scale.item<double>(), 1.0, 1e-6);
    return s.scale.item<double>();
  }
  void Step() { recipe->OnOptimizerStep(&table); }
  double scale() const { return table.scale(t).scale.item<double>(); }
  std::unique_ptr<Fp8Recipe> recipe;
  ScalingTable table;
  int64_t t;
};

TEST(ScaleTest, DelayedScalingAdvancesOncePerOptimizerStep) {
  RecipeConfig c;
  c.history_len = 2;
  Driver d(c);
  // First step: no history, so the tensor scales itself.
  EXPECT_DOUBLE_EQ(d.Cast(4.0f), 112.0);
  // Gradient accumulation: three micro-batches, one optimizer step.
  EXPECT_DOUBLE_EQ(d.Cast(1.0f), 448.0);  // still no history
  d.Cast(8.0f);
  EXPECT_FALSE(d.table.has_history(d.t));
  d.Step();
  EXPECT_TRUE(d.table.has_history(d.t));
  EXPECT_DOUBLE_EQ(d.scale(), 56.0);  // the step's max amax, 8
  // Delayed: this step uses the history's scale, whatever the tensor.
  EXPECT_DOUBLE_EQ(d.Cast(1.0f), 56.0);
  d.Step();  // history [8, 1]
  EXPECT_DOUBLE_EQ(d.scale(), 56.0);
  d.Cast(2.0f);
  d.Step();  // history [1, 2]: 8 has left the window
  EXPECT_DOUBLE_EQ(d.scale(), 224.0);
  // A step with only zeros keeps the scale finite.
  d.Cast(0.0f);
  d.Step();
  d.Cast(0.0f);
  d.Step();
  EXPECT_DOUBLE_EQ(d.scale(), 224.0);

  RecipeConfig recent = c;
  recent.history_max = false;
  Driver r(recent);
  r.Cast(8.0f);
  r.Step();
  r.Cast(2.0f);
  r.Step();
  EXPECT_DOUBLE_EQ(r.scale(), 224.0);  // most recent, not max
}

TEST(ScaleTest, CurrentScalingFollowsEachTensorAndStateRoundTrips) {
  RecipeConfig c;
  c.recipe = Recipe::kCurrent;
  Driver cur(c);
  EXPECT_DOUBLE_EQ(cur.Cast(448.0f), 1.0);
  EXPECT_DOUBLE_EQ(cur.Cast(-2.0f), 224.0);
  cur.Step();
  EXPECT_FALSE(cur.table.has_history(cur.t)) << "current scaling keeps no history";

  RecipeConfig d;
  d.history_len = 4;
  Driver a(d), b(d);
  a.Cast(3.0f);
  a.Step();
  a.Cast(5.0f);
  a.Step();
  const std::vector<at::Tensor> state = a.table.State();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].size(0), 4 + 3);
  EXPECT_EQ(a.table.Check(state[0], 2), "");
  ASSERT_TRUE(b.table.LoadState(b.t, state[0]));
  EXPECT_DOUBLE_EQ(b.scale(), a.scale());
  EXPECT_TRUE(b.table.has_history(b.t));
  b.Cast(1.0f);
  a.Cast(1.0f);
  a.Step();
  b.Step();
  EXPECT_DOUBLE_EQ(b.scale(), a.scale());
  EXPECT_TRUE(at::equal(a.table.State()[0], b.table.State()[0]));
  EXPECT_FALSE(b.table.LoadState(b.t, at::zeros({3}, at::kDouble)));
  // A scale FP32 cannot hold, a history longer than the recipe's, steps
  // past the checkpoint's: refused, naming what.
  at::Tensor bad = state[0].clone();
  bad[4] = 1e300;
  EXPECT_NE(a.table.Check(bad, 2).find("scale is 1e+300"), std::string::npos);
  EXPECT_FALSE(b.table.LoadState(b.t, bad));
  bad = state[0].clone();
  bad[5] = 5;
  EXPECT_NE(a.table.Check(bad, 2).find("history length is 5"), std::string::npos);
  EXPECT_NE(a.table.Check(state[0], 1).find("steps is 2"), std::string::npos);
}

}  // namespace
}  // namespace tally::precision
