#include "worker/precision/fp8.h"

#include <ATen/core/grad_mode.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/fp8_cast.h"
#include "worker/model/moe.h"

namespace tally::precision {
namespace {

// Every finite value of a format, from its 256 bit patterns.
std::vector<double> Grid(Fp8Format f) {
  at::Tensor bits = at::arange(256, at::kInt).to(at::kByte);
  at::Tensor v = bits.view(Fp8Dtype(f)).to(at::kDouble);
  std::vector<double> out;
  for (int i = 0; i < 256; ++i) {
    const double x = v[i].item<double>();
    if (std::isfinite(x)) out.push_back(x);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Round to nearest; ties to the value whose bit pattern is even.
double Reference(double x, Fp8Format f, const std::vector<double>& grid) {
  const double max = Fp8Max(f);
  x = std::clamp(x, -max, max);
  auto hi = std::lower_bound(grid.begin(), grid.end(), x);
  if (hi == grid.end()) return grid.back();
  if (*hi == x || hi == grid.begin()) return *hi;
  const double a = *(hi - 1), b = *hi;
  if (x - a < b - x) return a;
  if (b - x < x - a) return b;
  auto even = [&](double v) {
    const uint8_t byte =
        at::tensor(v, at::kDouble).to(Fp8Dtype(f)).view(at::kByte).item<uint8_t>();
    return (byte & 1) == 0;
  };
  return even(a) ? a : b;
}

class QuantizeTest : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(QuantizeTest, MatchesTheReferenceWithinHalfAnUlp) {
  const Fp8Format f = GetParam();
  const auto grid = Grid(f);
  at::manual_seed(1);
  // Across the range: normals, subnormals, values at the edges.
  at::Tensor x = at::cat({at::randn({4000}) * (f == Fp8Format::kE4M3 ? 100 : 10000),
                          at::randn({1000}) * 1e-3, at::tensor({0.0f, -0.0f})});
  QuantStats stats;
  at::Tensor q = QuantizeScaled(x, 1.0, f, &stats).to(at::kDouble);
  const int mantissa_bits = f == Fp8Format::kE4M3 ? 3 : 2;
  const double min_normal = f == Fp8Format::kE4M3 ? std::ldexp(1.0, -6) : std::ldexp(1.0, -14);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xi = x[i].item<double>(), qi = q[i].item<double>();
    ASSERT_EQ(qi, Reference(xi, f, grid)) << "x=" << xi;
    const double ax = std::min(std::abs(xi), Fp8Max(f));
    // Half a unit in the last place: relative for normals, absolute below.
    const double half_ulp = ax >= min_normal
                                ? std::ldexp(1.0, static_cast<int>(std::floor(std::log2(ax))) -
                                                      mantissa_bits - 1)
                                : std::ldexp(min_normal, -mantissa_bits - 1);
    ASSERT_LE(std::abs(qi - std::clamp(xi, -Fp8Max(f), Fp8Max(f))), half_ulp) << xi;
  }
  EXPECT_EQ(stats.elements, x.numel());
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeTest,
                         ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2),
                         [](const auto& i) {
                           return std::string(i.param == Fp8Format::kE4M3 ? "E4M3" : "E5M2");
                         });

TEST(QuantizeTest, ClampsInsteadOfNaNAndCountsOverAndUnderflow) {
  QuantStats s;
  at::Tensor q = QuantizeScaled(at::tensor({1000.0f, -1e9f, 1e-12f, 0.0f}), 1.0,
                                Fp8Format::kE4M3, &s);
  EXPECT_EQ(q[0].item<float>(), 448.0f);
  EXPECT_EQ(q[1].item<float>(), -448.0f);
  EXPECT_FALSE(at::isnan(q).any().item<bool>());
  EXPECT_EQ(s.overflows, 2);
  EXPECT_EQ(s.underflows, 1);  // 1e-12 became 0; a true 0 is not an underflow
  at::Tensor back = QuantizeDequantize(at::tensor({3.0f}), 100.0, Fp8Format::kE4M3, nullptr);
  EXPECT_NEAR(back.item<float>(), 3.0f, 3.0 / 16);
}

// The LibTorch-free reference in kernels/ (the CUDA kernel's oracle) agrees
// with LibTorch's own cast, value for value.
TEST(QuantizeTest, KernelReferenceAgreesWithLibTorch) {
  at::manual_seed(4);
  at::Tensor x = at::cat({at::randn({20000}) * 60, at::randn({5000}) * 1e-2,
                          at::tensor({448.0f, -448.0f, 1e4f, 0.0f})});
  at::Tensor bits = x.clamp(-448, 448).to(at::kFloat8_e4m3fn).view(at::kByte);
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(kernels::FloatToE4M3(x[i].item<float>()), bits[i].item<uint8_t>())
        << x[i].item<float>();
  }
}

// The fused cast's reference (what the CUDA kernel is held to, bit for bit,
// in kernels/fp8_cast_test.cc) against the trainer's CPU path where the two
// could part: NaN, infinities, |x * scale| at the overflow bound and a few
// ulps either side (directly and through scales whose product rounds),
// denormals, signed zeros. The same E4M3 bytes (any NaN for a NaN), the same
// clamped and flushed counts, and the amax ATen's max gives: NaN when any
// value is NaN, else +Inf when any is infinite.
TEST(QuantizeTest, FusedCastReferenceAgreesWithTheCpuPath) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float bound = kernels::kE4M3OverflowBound;
  auto around = [](float centre, int ulps) {
    std::vector<float> v;
    float lo = centre;
    for (int i = 0; i < ulps; ++i) lo = std::nextafter(lo, 0.0f);
    for (int i = 0; i <= 2 * ulps; ++i, lo = std::nextafter(lo, 1e9f)) {
      v.push_back(lo);
      v.push_back(-lo);
    }
    return v;
  };
  struct Case {
    std::string name;
    std::vector<float> x;
    float scale;
  };
  std::vector<Case> cases;
  cases.push_back({"the bound, scale 1", around(bound, 20), 1.0f});
  cases.push_back({"448, scale 1", around(448.0f, 3), 1.0f});
  cases.push_back({"the bound, scale 3", around(bound / 3, 20), 3.0f});
  cases.push_back({"the bound, scale 0.7", around(bound / 0.7f, 20), 0.7f});
  cases.push_back({"specials",
                   {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -1e-40f,
                    std::ldexp(1.0f, -10), std::ldexp(1.0f, -9), 1e30f, -1e30f, inf, -inf, 2.5f},
                   1.0f});
  cases.push_back({"NaN among them", {1.0f, nan, -inf, 3.0f, -nan, 1e-40f}, 1.0f});
  cases.push_back({"NaN only", {nan}, 1.0f});
  at::manual_seed(7);
  at::Tensor r = at::randn({4096}) * 3;
  cases.push_back({"random, scale 37.5",
                   std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + r.numel()),
                   37.5f});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t n = static_cast<int64_t>(c.x.size());
    std::vector<uint8_t> y(n);
    float amax = 0;
    uint64_t counts[2] = {0, 0};
    kernels::CastToE4M3Reference(c.x.data(), n, c.scale, y.data(), &amax, counts);

    at::Tensor x = at::tensor(c.x);
    QuantStats stats;
    at::Tensor bytes =
        QuantizeScaled(x, c.scale, Fp8Format::kE4M3, &stats).to(at::kFloat8_e4m3fn).view(at::kByte);
    const float want_amax = x.abs().max().item<float>();  // as ScaleFor takes it
    EXPECT_EQ(counts[0], static_cast<uint64_t>(stats.overflows));
    EXPECT_EQ(counts[1], static_cast<uint64_t>(stats.underflows));
    if (std::isnan(want_amax)) {
      EXPECT_TRUE(std::isnan(amax)) << amax;
    } else {
      EXPECT_EQ(amax, want_amax);
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t want = bytes[i].item<uint8_t>();
      if (std::isnan(c.x[i])) {
        EXPECT_EQ(y[i] & 0x7f, 0x7f) << i;
        EXPECT_EQ(want & 0x7f, 0x7f) << i;
      } else {
        EXPECT_EQ(y[i], want) << "x = " << c.x[i] << " x " << c.scale;
      }
    }
  }
  // The cases reach both sides of the bound.
  QuantStats near;
  QuantizeScaled(at::tensor(around(bound, 20)), 1.0, Fp8Format::kE4M3, &near);
  EXPECT_EQ(near.overflows, 40);  // 20 ulps above, each sign
}

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

TEST(Fp8LinearsTest, ProductsUseFp8OperandsAndFp32Accumulation) {
  at::manual_seed(2);
  RecipeConfig c;
  c.recipe = Recipe::kCurrent;
  Fp8Linears fp8(c);
  at::Tensor x = at::randn({2, 5, 32}).set_requires_grad(true);
  at::Tensor w = (at::randn({48, 32}) * 0.1).set_requires_grad(true);
  at::Tensor y = fp8.Linear(x, w, "layers.0.w1");
  ASSERT_EQ(y.sizes(), (at::IntArrayRef{2, 5, 48}));
  at::Tensor g = at::randn({2, 5, 48});
  y.backward(g);

  // The same numerics by hand.
  auto qdq = [](const at::Tensor& t, Fp8Format f) {
    const double s = ScaleForAmax(t.abs().max().item<double>(), f, 0, 1.0);
    return QuantizeDequantize(t, s, f, nullptr);
  };
  at::NoGradGuard no_grad;
  at::Tensor x2 = x.detach().reshape({10, 32});
  at::Tensor xq = qdq(x2, Fp8Format::kE4M3), wq = qdq(w.detach(), Fp8Format::kE4M3);
  at::Tensor gq = qdq(g.reshape({10, 48}), Fp8Format::kE5M2);
  EXPECT_TRUE(at::allclose(y.reshape({10, 48}), xq.matmul(wq.t()), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(x.grad().reshape({10, 32}), gq.matmul(wq), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(w.grad(), gq.t().matmul(xq), 1e-5, 1e-6));
  // And close to FP32, as FP8 is.
  const double rel = ((y - at::linear(x, w)).norm() / at::linear(x, w).norm()).item<double>();
  EXPECT_LT(rel, 0.1);
  EXPECT_GT(rel, 0.0);
  Fp8Stats stats = fp8.TakeStats();
  EXPECT_EQ(stats.fp8_products, 3);
  EXPECT_EQ(stats.total_products, 3);
  EXPECT_GT(stats.amax.at("ffn.input"), 0);
  EXPECT_GT(stats.amax.at("ffn.grad"), 0);
  EXPECT_EQ(fp8.State().size(), 3u);
}

TEST(Fp8LinearsTest, RowwiseScalesEachRowAndRescalesForTheBackward) {
  at::manual_seed(3);
  RecipeConfig c;
  c.recipe = Recipe::kRowwise;
  Fp8Linears fp8(c);
  // Rows of very different magnitudes: per-tensor scaling would crush the
  // small ones; per-row keeps each to FP8's relative precision.
  at::Tensor x = (at::randn({6, 32}) * at::logspace(-3, 3, 6).unsqueeze(1)).set_requires_grad(true);
  at::Tensor w = (at::randn({16, 32}) * 0.1).set_requires_grad(true);
  at::Tensor y = fp8.Linear(x, w, "layers.0.wqkv");
  at::Tensor g = at::randn({6, 16});
  y.backward(g);
  at::NoGradGuard no_grad;
  auto q = [](const at::Tensor& t, int64_t dim, Fp8Format f) {
    return QuantizeDequantizeAlong(t, dim, f, 0, nullptr);
  };
  at::Tensor xd = x.detach(), wd = w.detach();
  EXPECT_TRUE(at::allclose(y, q(xd, 1, Fp8Format::kE4M3).matmul(q(wd, 1, Fp8Format::kE4M3).t()),
                           1e-5, 1e-7));
  EXPECT_TRUE(at::allclose(x.grad(), q(g, 1, Fp8Format::kE5M2).matmul(q(wd, 0, Fp8Format::kE4M3)),
                           1e-5, 1e-7));
  EXPECT_TRUE(at::allclose(w.grad(), q(g, 0, Fp8Format::kE5M2).t().matmul(q(xd, 0, Fp8Format::kE4M3)),
                           1e-5, 1e-7));
  // Every row keeps its relative precision, the smallest included.
  at::Tensor rel = ((y - at::linear(xd, wd)).norm(2, 1) / at::linear(xd, wd).norm(2, 1));
  EXPECT_LT(rel.max().item<double>(), 0.1);
  Fp8Stats s = fp8.TakeStats();
  EXPECT_EQ(s.fp8_products, 3);
  EXPECT_EQ(s.overflows, 0);
  EXPECT_TRUE(fp8.State().empty()) << "row-wise keeps no history";
}

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

TEST(Fp8LinearsTest, TheTestKnobForcesAFractionOfTheInputsToOverflowInTrainingOnly) {
  // The same input and gradient every step, so delayed scaling's history
  // fits them: without the knob nothing overflows.
  for (Recipe recipe : {Recipe::kDelayed, Recipe::kCurrent}) {
    std::vector<at::Tensor> evaluated;
    for (double fraction : {0.0, 0.1}) {
      SCOPED_TRACE(absl::StrCat(static_cast<int>(recipe), " ", fraction));
      at::manual_seed(5);
      RecipeConfig c;
      c.recipe = recipe;
      c.test_overflow_fraction = fraction;
      Fp8Linears fp8(c);
      const at::Tensor w = (at::randn({48, 32}) * 0.1).set_requires_grad(true);
      const at::Tensor x0 = at::randn({2, 5, 32}), g = at::randn({2, 5, 48});
      for (int step = 0; step < 3; ++step) {
        const at::Tensor x = x0.clone().set_requires_grad(true);
        const at::Tensor y = fp8.Linear(x, w, "layers.0.w1");
        y.backward(g);
        EXPECT_TRUE(at::isfinite(y).all().item<bool>());
        EXPECT_TRUE(at::isfinite(x.grad()).all().item<bool>());
        const Fp8Stats stats = fp8.TakeStats();
        fp8.OnOptimizerStep();
        // Every 10th of the 320 input values (32 of them), nothing else;
        // the count of values cast is unchanged.
        EXPECT_EQ(stats.overflows, fraction > 0 ? 32 : 0) << "step " << step;
        EXPECT_EQ(stats.elements, 10 * 32 + 48 * 32 + 10 * 48);
        // The amax (and so the scales) never see the forced values.
        EXPECT_LT(stats.amax.at("ffn.input"), 10);
      }
      // Evaluation passes are left alone: the same output as without it.
      at::NoGradGuard no_grad;
      fp8.SetTraining(false);
      evaluated.push_back(fp8.Linear(at::randn({2, 5, 32}), w, "layers.0.w1"));
      fp8.SetTraining(true);
      EXPECT_EQ(fp8.TakeStats().overflows, 0);
    }
    EXPECT_TRUE(at::equal(evaluated[0], evaluated[1]));
  }
}

TEST(Fp8LinearsTest, GroupedExpertsMatchTheLoopOnTheSameFp8Operands) {
  // CPU emulates the grouped product from the FP8 operands and the scales
  // spread over rows and channels that CUDA hands at::_scaled_grouped_mm.
  const int64_t E = 6, D = 32, F = 48, N = 29;
  model::MoeConfig moe;
  moe.num_experts = E;
  moe.top_k = 2;
  moe.capacity_factor = 1.0;  // drops, and short groups
  for (Recipe recipe : {Recipe::kCurrent, Recipe::kDelayed}) {
    for (int64_t align : {1, 4}) {
      moe.group_align = align;
      RecipeConfig grouped_config;
      grouped_config.recipe = recipe;
      grouped_config.grouped_on_cpu = true;
      RecipeConfig loop_config = grouped_config;
      loop_config.grouped_experts = false;
      Fp8Linears grouped(grouped_config), loop(loop_config);
      ASSERT_TRUE(grouped.Groups(at::zeros({1}), F, D));
      ASSERT_FALSE(loop.Groups(at::zeros({1}), F, D));
      at::manual_seed(5);
      at::Tensor router = at::randn({E, D});
      at::Tensor bias = at::zeros({E});
      bias[E - 1] = -1e4;  // an expert no token reaches
      std::vector<at::Tensor> ws = {at::randn({E, F, D}) * 0.2, at::randn({E, F, D}) * 0.2,
                                    at::randn({E, D, F}) * 0.2};
      at::Tensor x = at::randn({N, D});
      at::Tensor g = at::randn({N, D});
      struct Run {
        at::Tensor y, gx;
        std::vector<at::Tensor> gw;
        Fp8Stats stats;
      };
      auto run = [&](Fp8Linears* fp8) {
        std::vector<at::Tensor> w;
        for (const at::Tensor& t : ws) w.push_back(t.clone().set_requires_grad(true));
        at::Tensor xi = x.clone().set_requires_grad(true);
        model::MoeOutput out =
            model::MoeForward(xi, {}, router, bias, w[0], w[1], w[2], moe, fp8, "layers.0.");
        out.y_ND.backward(g);
        return Run{out.y_ND.detach(), xi.grad(), {w[0].grad(), w[1].grad(), w[2].grad()},
                   fp8->TakeStats()};
      };
      const Run a = run(&grouped), b = run(&loop);
      const std::string what = absl::StrCat(recipe == Recipe::kCurrent ? "current" : "delayed",
                                            ", align ", align);
      EXPECT_TRUE(at::allclose(a.y, b.y, 1e-5, 1e-6)) << what << (a.y - b.y).abs().max();
      EXPECT_TRUE(at::allclose(a.gx, b.gx, 1e-5, 1e-6)) << what;
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(at::allclose(a.gw[i], b.gw[i], 1e-5, 1e-6)) << what << " w" << i;
        EXPECT_EQ(a.gw[i][E - 1].abs().sum().item<double>(), 0.0) << "the idle expert";
      }
      EXPECT_EQ(a.stats.overflows, b.stats.overflows) << what;
      EXPECT_EQ(a.stats.underflows, b.stats.underflows) << what;
      EXPECT_EQ(a.stats.elements, b.stats.elements) << what;
      EXPECT_EQ(a.stats.fp8_products, b.stats.fp8_products) << what;
      EXPECT_EQ(a.stats.total_products, b.stats.total_products) << what;
      // Three weights' forward products for each of the five busy experts.
      EXPECT_EQ(a.stats.grouped_products, 3 * (E - 1)) << what;
      EXPECT_EQ(b.stats.grouped_products, 0);
      EXPECT_EQ(a.stats.total_products, 9 * (E - 1)) << "forward and two backward each";
      EXPECT_TRUE(grouped.grouped_off().empty());
    }
  }
  // A batch of padding only: no expert runs, nothing is turned off.
  RecipeConfig rc;
  rc.grouped_on_cpu = true;
  Fp8Linears fp8(rc);
  at::Tensor x = at::randn({N, D}).set_requires_grad(true);
  at::Tensor w = (at::randn({E, F, D}) * 0.2).set_requires_grad(true);
  model::MoeOutput out = model::MoeForward(x, at::zeros({N}, at::kBool), at::randn({E, D}), {},
                                           w, w, at::randn({E, D, F}), moe, &fp8, "layers.0.");
  EXPECT_EQ(out.y_ND.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(fp8.TakeStats().total_products, 0);
  EXPECT_TRUE(fp8.grouped_off().empty());
}

}  // namespace
}  // namespace tally::precision
