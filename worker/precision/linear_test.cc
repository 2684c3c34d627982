#include "worker/precision/linear.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/model/fused_ops.h"
#include "worker/precision/converter.h"
#include "worker/precision/held_bytes_testing.h"

namespace tally::precision {
namespace {

// The FP8 linear through the converter, as a model calls it.
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


// What one FP8 linear leaves allocated after its forward pass, for its
// backward (the autograd graph's saved tensors and the converter's caches
// together): x's FP8 bytes (CPU: row-major, from which the backward
// dequantizes; CUDA: the transpose) and a scale, never a full-precision copy
// of x. The weight's cast is the optimizer step's, made before the count.
TEST(Fp8LinearsTest, TheForwardKeepsOnlyFp8CopiesOfItsInput) {
  const int64_t M = 256, K = 512, N = 384;
  for (Recipe recipe : {Recipe::kDelayed, Recipe::kCurrent, Recipe::kRowwise}) {
    SCOPED_TRACE(RecipeName(recipe));
    at::manual_seed(7);
    RecipeConfig c;
    c.recipe = recipe;
    Fp8Linears fp8(c);
    const at::Tensor w = (at::randn({N, K}) * 0.1).set_requires_grad(true);
    for (int step = 0; step < 2; ++step) {
      // The step's weight cast (and, step 1, the delayed scales' history).
      fp8.Linear(at::randn({M, K}).set_requires_grad(true), w, "layers.0.wo").sum().backward();
      const at::Tensor leaf = at::randn({M, K}).set_requires_grad(true);
      at::Tensor y;
      const int64_t held = testing::BytesHeldAfter([&] {
        // x is made here (as a norm makes it), so a copy kept alive counts.
        const at::Tensor x = leaf * 1.0;
        y = fp8.Linear(x, w, "layers.0.wo");
      });
      const int64_t kept = held - y.nbytes();
      std::cout << RecipeName(recipe) << " step " << step << ": " << kept
                << " bytes held for the backward of a [" << M << ", " << K << "] input ("
                << static_cast<double>(kept) / (M * K) << " per element)\n";
      EXPECT_LE(kept, M * K + 64 * K) << "more than x's FP8 bytes and its scales";
      y.sum().backward();
      fp8.TakeStats();
      fp8.OnOptimizerStep();
    }
  }
}

// w1 and w3 as one product compute what the two FP8 linears compute: one
// cast of x, each weight under its own scale, each half of the gradient
// under its own layer's; the same statistics and scaling state. The
// forward keeps x's FP8 bytes once for both.
TEST(Fp8LinearsTest, TheJointGateUpProductIsTheTwoLinears) {
  const int64_t M = 64, K = 96, F = 80;
  for (Recipe recipe : {Recipe::kDelayed, Recipe::kCurrent, Recipe::kRowwise}) {
    SCOPED_TRACE(RecipeName(recipe));
    at::manual_seed(11);
    RecipeConfig c;
    c.recipe = recipe;
    Fp8Linears joint(c), apart(c);
    const at::Tensor w1 = (at::randn({F, K}) * 0.1).set_requires_grad(true);
    const at::Tensor w3 = (at::randn({F, K}) * 0.3).set_requires_grad(true);
    const at::Tensor w1b = w1.detach().clone().set_requires_grad(true);
    const at::Tensor w3b = w3.detach().clone().set_requires_grad(true);
    for (int step = 0; step < 3; ++step) {
      const at::Tensor x = (at::randn({2, M / 2, K}) * (1 + step)).set_requires_grad(true);
      const at::Tensor xb = x.detach().clone().set_requires_grad(true);
      const at::Tensor g = at::randn({2, M / 2, 2 * F});
      // The step's weight casts first (an earlier micro-batch's), in both.
      joint.GateUpLinear(x.detach(), w1, w3, "layers.0.w1", "layers.0.w3");
      apart.Linear(xb.detach(), w1b, "layers.0.w1");
      apart.Linear(xb.detach(), w3b, "layers.0.w3");
      at::Tensor y;
      const int64_t held = testing::BytesHeldAfter([&] {
        y = joint.GateUpLinear(x * 1.0, w1, w3, "layers.0.w1", "layers.0.w3");
      });
      const at::Tensor yb = at::cat({apart.Linear(xb, w1b, "layers.0.w1"),
                                     apart.Linear(xb, w3b, "layers.0.w3")},
                                    -1);
      ASSERT_EQ(y.sizes(), yb.sizes());
      EXPECT_TRUE(at::allclose(y, yb, 1e-5, 1e-6)) << (y - yb).abs().max();
      // Row-wise takes the two products, each keeping x's column-scaled
      // image.
      const int64_t images = recipe == Recipe::kRowwise ? 2 : 1;
      EXPECT_LE(held - y.nbytes(), images * (M * K + 64 * K)) << "x's FP8 bytes";
      y.backward(g);
      yb.backward(g);
      EXPECT_TRUE(at::allclose(x.grad(), xb.grad(), 1e-5, 1e-6));
      EXPECT_TRUE(at::allclose(w1.grad(), w1b.grad(), 1e-5, 1e-6));
      EXPECT_TRUE(at::allclose(w3.grad(), w3b.grad(), 1e-5, 1e-6));
      const Fp8Stats a = joint.TakeStats(), b = apart.TakeStats();
      EXPECT_EQ(a.elements, b.elements) << "x cast once in both";
      EXPECT_EQ(a.fp8_products, b.fp8_products);
      EXPECT_EQ(a.total_products, b.total_products);
      EXPECT_EQ(a.overflows, b.overflows);
      EXPECT_EQ(a.underflows, b.underflows);
      EXPECT_EQ(a.amax, b.amax);
      joint.OnOptimizerStep();
      apart.OnOptimizerStep();
    }
    const auto sa = joint.State(), sb = apart.State();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_TRUE(at::equal(sa[i].second, sb[i].second)) << sa[i].first;
    }
  }
}

// Once delayed scaling knows w2's input scale (a step has passed), the
// SwiGLU and the FP8 cast of its output are one pass (kernels/fused_cast.h):
// the same products, statistics and gradients as the fused SwiGLU followed
// by the FP8 linear, up to the last place of the SwiGLU's exp.
TEST(Fp8LinearsTest, TheSwiGluCastIsFusedOnceTheScaleIsKnownAhead) {
  const int64_t M = 48, F = 64, N = 32;
  at::manual_seed(12);
  RecipeConfig c;  // delayed
  Fp8Linears fused(c), apart(c);
  const at::Tensor w = (at::randn({N, F}) * 0.1).set_requires_grad(true);
  const at::Tensor wb = w.detach().clone().set_requires_grad(true);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    const at::Tensor y13 = at::randn({2, M / 2, 2 * F}).set_requires_grad(true);
    const at::Tensor y13b = y13.detach().clone().set_requires_grad(true);
    const at::Tensor g = at::randn({2, M / 2, N});
    const at::Tensor out = fused.SwiGluLinear(y13, w, "layers.0.w2");
    const at::Tensor outb = apart.Linear(model::FusedSwiGlu(y13b), wb, "layers.0.w2");
    const std::string node = out.grad_fn()->name();
    EXPECT_EQ(node.find("Fp8SwiGluLinearFunction") != std::string::npos, step > 0) << node;
    const double scale = outb.abs().max().item<double>();
    const double diff = (out - outb).abs().max().item<double>();
    std::cout << "step " << step << ": fused SwiGLU cast vs SwiGLU then cast, max |diff| "
              << diff / scale << " of the largest output\n";
    EXPECT_LT(diff, 1e-2 * scale);
    out.backward(g);
    outb.backward(g);
    EXPECT_LT((y13.grad() - y13b.grad()).abs().max().item<double>(),
              1e-2 * y13b.grad().abs().max().item<double>());
    EXPECT_LT((w.grad() - wb.grad()).abs().max().item<double>(),
              1e-2 * wb.grad().abs().max().item<double>());
    const Fp8Stats a = fused.TakeStats(), b = apart.TakeStats();
    EXPECT_EQ(a.elements, b.elements);
    EXPECT_EQ(a.fp8_products, b.fp8_products);
    EXPECT_EQ(a.total_products, b.total_products);
    EXPECT_NEAR(a.amax.at("ffn.input"), b.amax.at("ffn.input"),
                1e-5 * b.amax.at("ffn.input"));
    fused.OnOptimizerStep();
    apart.OnOptimizerStep();
  }
}

}  // namespace
}  // namespace tally::precision
