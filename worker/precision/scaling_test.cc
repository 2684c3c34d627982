#include "worker/precision/scaling.h"

#include <limits>

#include "gtest/gtest.h"

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
}

TEST(ScaleTest, DelayedScalingAdvancesOncePerOptimizerStep) {
  RecipeConfig c;
  c.history_len = 2;
  TensorScaling s(Fp8Format::kE4M3, c);
  // First step: no history, so the tensor scales itself.
  EXPECT_DOUBLE_EQ(s.ScaleFor(at::tensor({4.0f})), 112.0);
  // Gradient accumulation: three micro-batches, one optimizer step.
  EXPECT_DOUBLE_EQ(s.ScaleFor(at::tensor({1.0f})), 448.0);  // still no history
  s.ScaleFor(at::tensor({8.0f}));
  s.Step();
  EXPECT_DOUBLE_EQ(s.scale(), 56.0);  // the step's max amax, 8
  // Delayed: this step uses the history's scale, whatever the tensor.
  EXPECT_DOUBLE_EQ(s.ScaleFor(at::tensor({1.0f})), 56.0);
  s.Step();  // history [8, 1]
  EXPECT_DOUBLE_EQ(s.scale(), 56.0);
  s.ScaleFor(at::tensor({2.0f}));
  s.Step();  // history [1, 2]: 8 has left the window
  EXPECT_DOUBLE_EQ(s.scale(), 224.0);
  // A step with only zeros keeps the scale finite.
  s.ScaleFor(at::zeros({3}));
  s.Step();
  s.ScaleFor(at::zeros({3}));
  s.Step();
  EXPECT_DOUBLE_EQ(s.scale(), 224.0);

  RecipeConfig recent = c;
  recent.history_max = false;
  TensorScaling r(Fp8Format::kE4M3, recent);
  r.ScaleFor(at::tensor({8.0f}));
  r.Step();
  r.ScaleFor(at::tensor({2.0f}));
  r.Step();
  EXPECT_DOUBLE_EQ(r.scale(), 224.0);  // most recent, not max
}

TEST(ScaleTest, CurrentScalingFollowsEachTensorAndStateRoundTrips) {
  RecipeConfig c;
  c.recipe = Recipe::kCurrent;
  TensorScaling s(Fp8Format::kE5M2, c);
  EXPECT_DOUBLE_EQ(s.ScaleFor(at::tensor({57344.0f})), 1.0);
  EXPECT_DOUBLE_EQ(s.ScaleFor(at::tensor({-2.0f})), 28672.0);

  RecipeConfig d;
  d.history_len = 4;
  TensorScaling a(Fp8Format::kE4M3, d), b(Fp8Format::kE4M3, d);
  a.ScaleFor(at::tensor({3.0f}));
  a.Step();
  a.ScaleFor(at::tensor({5.0f}));
  a.Step();
  ASSERT_TRUE(b.LoadState(a.State()));
  EXPECT_DOUBLE_EQ(b.scale(), a.scale());
  b.ScaleFor(at::tensor({1.0f}));
  a.ScaleFor(at::tensor({1.0f}));
  a.Step();
  b.Step();
  EXPECT_DOUBLE_EQ(b.scale(), a.scale());
  EXPECT_FALSE(b.LoadState(at::zeros({3}, at::kDouble)));
}

}  // namespace
}  // namespace tally::precision
