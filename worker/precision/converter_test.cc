#include "worker/precision/converter.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace tally::precision {
namespace {

TEST(Fp8LinearsTest, DelayedScalingReadsTheDeviceTwiceAStep) {
  // Once the history holds an amax, nothing in the products needs a value
  // from the device (on a GPU, each read stalls the stream): counts and amax
  // stay there until the step's statistics and the history step read them.
  at::manual_seed(8);
  RecipeConfig c;  // delayed
  Fp8Linears fp8(c);
  const at::Tensor w = (at::randn({48, 32}) * 0.1).set_requires_grad(true);
  for (int step = 0; step < 3; ++step) {
    const int64_t before = Fp8HostReads();
    for (int micro = 0; micro < 2; ++micro) {
      for (const char* site : {"layers.0.wqkv", "layers.0.w1"}) {
        at::Tensor x = at::randn({2, 5, 32}) * (step == 2 ? 100 : 1);  // step 2 overflows
        fp8.Linear(x, w, site).backward(at::randn({2, 5, 48}));
      }
    }
    const int64_t during = Fp8HostReads() - before;
    const Fp8Stats stats = fp8.TakeStats();
    fp8.OnOptimizerStep();
    const int64_t after = Fp8HostReads() - before - during;
    if (step == 0) {
      EXPECT_GT(during, 0) << "the first step scales from each tensor itself";
    } else {
      EXPECT_EQ(during, 0) << "step " << step;
      EXPECT_EQ(after, 2) << "step " << step;
    }
    EXPECT_EQ(stats.fp8_products, 12);
    EXPECT_EQ(stats.elements, 4 * (10 * 32 + 48 * 32 + 10 * 48));
    EXPECT_TRUE(stats.pending_amax.empty());
    EXPECT_FALSE(stats.pending_counts.defined());
    ASSERT_EQ(stats.amax.count("attention.grad"), 1u);
    EXPECT_GT(stats.amax.at("ffn.input"), step == 2 ? 100 : 1);
    if (step == 2) EXPECT_GT(stats.overflows, 0) << "inputs 100x the history's amax";
  }
}

}  // namespace
}  // namespace tally::precision
