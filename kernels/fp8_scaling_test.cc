// Delayed scaling on the device: the reference against the recipe's
// definition, and the kernels against the reference (skipped where there is
// no GPU).
#include "kernels/fp8_scaling.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing.h"

namespace tally::kernels {
namespace {

TEST(ScaleForAmax, ZeroHugeAndTinyAmaxKeepThePreviousScale) {
  EXPECT_EQ(ScaleForAmax(2.0f, Fp8Kind::kE4M3, 0, 1.0f), 224.0f);
  EXPECT_EQ(ScaleForAmax(2.0f, Fp8Kind::kE4M3, 1, 1.0f), 112.0f);
  EXPECT_EQ(ScaleForAmax(2.0f, Fp8Kind::kE5M2, 0, 1.0f), 28672.0f);
  EXPECT_EQ(ScaleForAmax(0.0f, Fp8Kind::kE4M3, 0, 7.0f), 7.0f);  // never infinite
  EXPECT_EQ(ScaleForAmax(std::numeric_limits<float>::infinity(), Fp8Kind::kE5M2, 0, 7.0f), 7.0f);
  EXPECT_EQ(ScaleForAmax(std::nanf(""), Fp8Kind::kE5M2, 0, 7.0f), 7.0f);
  // FP32 cannot hold 448 / 1e-45: the scale would be infinite.
  EXPECT_EQ(ScaleForAmax(1e-45f, Fp8Kind::kE4M3, 0, 7.0f), 7.0f);
  const float tiny = ScaleForAmax(1e38f, Fp8Kind::kE4M3, 0, 1.0f);
  EXPECT_GT(tiny, 0);
  EXPECT_TRUE(std::isfinite(tiny));
  // Computed in FP64 and rounded once: 448 / 3 is not FP32 448 / FP32 3.
  EXPECT_EQ(ScaleForAmax(3.0f, Fp8Kind::kE4M3, 0, 1.0f), static_cast<float>(448.0 / 3.0));
}

// State for T tensors on the host.
struct HostState {
  HostState(int64_t t, int h, std::vector<uint8_t> f)
      : history(t * h), count(t), scale(t, 1.0f), inv_scale(t, 1.0f), step_amax(t),
        step_finite(t), formats(std::move(f)) {
    s.tensors = t;
    s.history_len = h;
    s.history = history.data();
    s.count = count.data();
    s.scale = scale.data();
    s.inv_scale = inv_scale.data();
    s.step_amax = step_amax.data();
    s.step_finite = step_finite.data();
    s.formats = formats.data();
  }
  std::vector<float> history;
  std::vector<int32_t> count;
  std::vector<float> scale, inv_scale, step_amax, step_finite;
  std::vector<uint8_t> formats;
  ScalingState s;
};

TEST(DelayedScalingStep, AdvancesTheHistoryAndTheScales) {
  HostState st(3, 2, {0, 0, 1});
  const ScalingRecipe max_recipe;
  // Step 1: tensor 0 saw 8 (and NaN in its raw amax), tensor 1 nothing,
  // tensor 2 (E5M2) saw 2.
  st.step_amax = {std::nanf(""), 0, 2};
  st.step_finite = {8, 0, 2};
  DelayedScalingStepReference(st.s, max_recipe);
  EXPECT_EQ(st.count, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(st.scale[0], 56.0f);
  EXPECT_EQ(st.inv_scale[0], 1.0f / 56.0f);
  EXPECT_EQ(st.scale[1], 1.0f) << "a tensor that saw nothing keeps its scale";
  EXPECT_EQ(st.scale[2], 28672.0f);
  EXPECT_EQ(st.step_amax, (std::vector<float>{0, 0, 0})) << "zeroed for the next step";
  EXPECT_EQ(st.step_finite, (std::vector<float>{0, 0, 0}));
  // Step 2: history [8, 1] -> the max, 8. Step 3: [1, 2] -> 2 (8 has left).
  st.step_finite = {1, 0, 0};
  DelayedScalingStepReference(st.s, max_recipe);
  EXPECT_EQ(st.scale[0], 56.0f);
  st.step_finite = {2, 0, 0};
  DelayedScalingStepReference(st.s, max_recipe);
  EXPECT_EQ(st.scale[0], 224.0f);
  EXPECT_EQ(st.history[0], 1.0f);
  EXPECT_EQ(st.history[1], 2.0f);
  // Steps that saw only zeros push zeros, never an infinite scale.
  st.step_finite = {0, 0, 0};
  DelayedScalingStepReference(st.s, max_recipe);
  DelayedScalingStepReference(st.s, max_recipe);
  EXPECT_EQ(st.scale[0], 224.0f);
  EXPECT_EQ(st.count[2], 2) << "a tensor with a history records its zero steps";

  // The most recent amax instead of the history's maximum; a margin.
  HostState recent(1, 4, {0});
  ScalingRecipe latest;
  latest.history_max = false;
  latest.margin = 1;
  recent.step_finite = {8};
  DelayedScalingStepReference(recent.s, latest);
  recent.step_finite = {2};
  DelayedScalingStepReference(recent.s, latest);
  EXPECT_EQ(recent.scale[0], 112.0f);
}

TEST(ScaleFromAmax, ScalesEachEntryFromItsAmax) {
  std::vector<float> amax = {4.0f, 0.0f, 2.0f};
  std::vector<uint8_t> formats = {0, 0, 1};
  std::vector<float> scale = {1.0f, 3.0f, 1.0f}, inv(3);
  ScaleFromAmaxReference(amax.data(), formats.data(), 3, 0, scale.data(), inv.data());
  EXPECT_EQ(scale, (std::vector<float>{112.0f, 3.0f, 28672.0f}));
  EXPECT_EQ(inv[1], 1.0f / 3.0f);
}

#ifdef TALLY_HAVE_CUDA
using test_support::Download;
using test_support::HaveGpu;
using test_support::Upload;

// Many tensors over many steps with random amaxes (zeros, NaN raw amaxes,
// tensors that start late): the kernel's state equals the reference's, bit
// for bit, after every step.
TEST(DelayedScalingGpu, MatchesTheReferenceBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  const int64_t T = 1000;
  const int H = 16;
  std::vector<uint8_t> formats(T);
  for (int64_t t = 0; t < T; ++t) formats[t] = t % 3 == 2;
  HostState ref(T, H, formats);
  float* history = Upload(ref.history);
  int32_t* count = Upload(ref.count);
  float* scale = Upload(ref.scale);
  float* inv = Upload(ref.inv_scale);
  uint8_t* fmt = Upload(formats);
  std::mt19937 rng(11);
  std::lognormal_distribution<float> amax(0.0f, 3.0f);
  for (ScalingRecipe recipe : {ScalingRecipe{0, true}, ScalingRecipe{2, false}}) {
    for (int step = 0; step < 40; ++step) {
      for (int64_t t = 0; t < T; ++t) {
        const bool idle = (t % 7 == 0 && step < 20) || rng() % 10 == 0;
        ref.step_finite[t] = idle ? 0.0f : amax(rng);
        ref.step_amax[t] = rng() % 50 == 0 ? std::nanf("") : ref.step_finite[t];
      }
      float* step_amax = Upload(ref.step_amax);
      float* step_finite = Upload(ref.step_finite);
      ScalingState dev = ref.s;
      dev.history = history;
      dev.count = count;
      dev.scale = scale;
      dev.inv_scale = inv;
      dev.step_amax = step_amax;
      dev.step_finite = step_finite;
      dev.formats = fmt;
      ASSERT_EQ(DelayedScalingStepCuda(dev, recipe, nullptr), "");
      DelayedScalingStepReference(ref.s, recipe);
      ASSERT_EQ(Download(count, T), ref.count) << "step " << step;
      ASSERT_EQ(Download(history, T * H), ref.history) << "step " << step;
      ASSERT_EQ(0, std::memcmp(Download(scale, T).data(), ref.scale.data(), T * 4));
      ASSERT_EQ(0, std::memcmp(Download(inv, T).data(), ref.inv_scale.data(), T * 4));
      ASSERT_EQ(Download(step_finite, T), std::vector<float>(T, 0.0f));
      cudaFree(step_amax);
      cudaFree(step_finite);
    }
  }
  std::vector<float> a = {4.0f, 0.0f, 3.0f}, s = {1.0f, 3.0f, 1.0f}, i(3);
  std::vector<uint8_t> f = {0, 0, 1};
  float *da = Upload(a), *ds = Upload(s), *di = Upload(i);
  uint8_t* df = Upload(f);
  ASSERT_EQ(ScaleFromAmaxCuda(da, df, 3, 1, ds, di, nullptr), "");
  ScaleFromAmaxReference(a.data(), f.data(), 3, 1, s.data(), i.data());
  EXPECT_EQ(Download(ds, 3), s);
  EXPECT_EQ(Download(di, 3), i);
  for (void* p : std::vector<void*>{history, count, scale, inv, fmt, da, ds, di, df}) cudaFree(p);
}
#endif

}  // namespace
}  // namespace tally::kernels
