#include "worker/precision/autocast.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

#include "gtest/gtest.h"

namespace tally::precision {
namespace {

// A weight that requires grad (a leaf, as the model's are) and an input.
struct Linear {
  at::Tensor w = at::full({1, 2}, 1.0f).set_requires_grad(true);
  at::Tensor x = at::full({1, 2}, 2.0f);
  double Run() const { return at::linear(x, w).item<double>(); }
  void Double() {
    at::NoGradGuard no_grad;
    w.mul_(2);
  }
};

TEST(AutocastRegion, ComputesInBf16AndRestoresTheState) {
  ASSERT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  Linear l;
  {
    AutocastRegion region(at::kCPU, true);
    EXPECT_TRUE(at::autocast::is_autocast_enabled(at::kCPU));
    EXPECT_EQ(at::linear(l.x, l.w).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(at::linear(l.x, l.w).scalar_type(), at::kFloat);
  {
    AutocastRegion off(at::kCPU, false);
    EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  }
}

// The weight is read again once the outermost region has ended (and only
// then: inside one region its cast is reused, which is why the trainer's
// region is one optimizer step).
TEST(AutocastRegion, EveryRegionReadsTheCurrentWeights) {
  Linear l;
  {
    AutocastRegion step(at::kCPU, true);
    EXPECT_EQ(l.Run(), 4.0);
    l.Double();
    EXPECT_EQ(l.Run(), 4.0) << "within a region the cached cast is reused";
    {
      AutocastRegion inner(at::kCPU, true);
      EXPECT_EQ(l.Run(), 4.0);
    }
    EXPECT_EQ(l.Run(), 4.0) << "an inner region's end keeps the cache";
  }
  {
    AutocastRegion next_step(at::kCPU, true);
    EXPECT_EQ(l.Run(), 8.0) << "the next region casts the doubled weight";
  }
}

// What the region prevents: autocast turned on once and left on (the cache
// never cleared) keeps computing with the weight as first cast, while the
// optimizer moves the FP32 master weight.
TEST(AutocastRegion, WithoutRegionsTheFirstCastIsServedForever) {
  Linear stale;
  at::autocast::set_autocast_enabled(at::kCPU, true);
  const double before = stale.Run();
  stale.Double();
  const double after = stale.Run();
  at::autocast::set_autocast_enabled(at::kCPU, false);
  at::autocast::clear_cache();
  EXPECT_EQ(before, 4.0);
  EXPECT_EQ(after, 4.0) << "the doubled weight was never read";

  // Under regions gradients reach the weight, step after step.
  Linear l;
  for (int step = 0; step < 2; ++step) {
    AutocastRegion region(at::kCPU, true);
    at::linear(l.x, l.w).sum().backward();
  }
  ASSERT_TRUE(l.w.grad().defined());
  EXPECT_EQ(l.w.grad()[0][0].item<double>(), 4.0);  // 2 + 2
}

}  // namespace
}  // namespace tally::precision
