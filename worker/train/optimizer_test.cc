#include "worker/train/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tally::train {
namespace {

model::Parameter Param(const std::string& name, std::vector<float> values, bool decay,
                       bool sharded = false) {
  at::Tensor t = at::tensor(values, at::kFloat).requires_grad_(true);
  return {name, t, decay, sharded};
}

void SetGrad(model::Parameter& p, std::vector<float> g) {
  p.value.mutable_grad() = at::tensor(g, at::kFloat);
}

float At(const at::Tensor& t, int64_t i = 0) { return t[i].item<float>(); }

TEST(AdamWTest, AConstantGradientMovesEachStepByTheLearningRate) {
  // With a constant gradient the bias-corrected moments are g and g^2, so an
  // update is lr * g / |g| (up to eps): 0.1 a step here.
  std::vector<model::Parameter> params = {Param("decayed", {1.0f}, true),
                                          Param("plain", {1.0f}, false),
                                          Param("untouched", {1.0f}, true)};
  AdamWOptions o;
  o.beta1 = 0.9;
  o.beta2 = 0.95;
  o.eps = 1e-8;
  o.weight_decay = 0.1;
  AdamW opt(&params, o);
  SetGrad(params[0], {0.5f});
  SetGrad(params[1], {0.5f});
  opt.Step(0.1);
  EXPECT_EQ(opt.step(), 1);
  EXPECT_NEAR(At(params[1].value), 0.9, 1e-6);
  // Decoupled decay first: 1 * (1 - 0.1 * 0.1) = 0.99, then the update.
  EXPECT_NEAR(At(params[0].value), 0.89, 1e-6);
  EXPECT_NEAR(At(opt.m()[1]), 0.05, 1e-7);
  EXPECT_NEAR(At(opt.v()[1]), 0.0125, 1e-7);
  // No gradient: neither the value nor the moments move.
  EXPECT_EQ(At(params[2].value), 1.0f);
  EXPECT_EQ(At(opt.m()[2]), 0.0f);
  EXPECT_EQ(At(opt.v()[2]), 0.0f);

  opt.Step(0.1);
  EXPECT_EQ(opt.step(), 2);
  EXPECT_NEAR(At(params[1].value), 0.8, 1e-6);
  EXPECT_EQ(At(params[2].value), 1.0f);
}

TEST(AdamWTest, TheStepCountIsTheBiasCorrections) {
  // A resumed optimizer (set_step) corrects as the uninterrupted one would.
  std::vector<model::Parameter> a = {Param("w", {1.0f}, false)};
  std::vector<model::Parameter> b = {Param("w", {1.0f}, false)};
  AdamW first(&a, {});
  AdamW resumed(&b, {});
  SetGrad(a[0], {0.5f});
  first.Step(0.1);
  resumed.m()[0].copy_(first.m()[0]);
  resumed.v()[0].copy_(first.v()[0]);
  resumed.set_step(first.step());
  at::NoGradGuard no_grad;
  b[0].value.copy_(a[0].value);
  SetGrad(a[0], {-0.25f});
  SetGrad(b[0], {-0.25f});
  first.Step(0.1);
  resumed.Step(0.1);
  EXPECT_EQ(At(a[0].value), At(b[0].value));
  EXPECT_EQ(resumed.step(), 2);
}

TEST(GradientNormTest, ShardedSquaresJoinTheReplicatedNorm) {
  std::vector<model::Parameter> params = {Param("a", {3.0f}, false), Param("b", {4.0f}, false),
                                          Param("none", {1.0f}, false),
                                          Param("expert", {100.0f}, false, /*sharded=*/true)};
  SetGrad(params[0], {3.0f});
  SetGrad(params[1], {4.0f});
  SetGrad(params[3], {100.0f});  // counted through the sum passed in, not here
  EXPECT_NEAR(GradientNorm(params, 0), 5.0, 1e-6);
  EXPECT_NEAR(GradientNorm(params, 144), 13.0, 1e-6);
  EXPECT_TRUE(std::isnan(GradientNorm(params, std::nan(""))));
  std::vector<model::Parameter> no_grads = {Param("a", {3.0f}, false)};
  EXPECT_EQ(GradientNorm(no_grads, 0), 0.0);
}

TEST(ClipGradientsTest, ScalesOnlyAboveTheLimit) {
  std::vector<model::Parameter> params = {Param("a", {0.0f}, false), Param("b", {0.0f}, false),
                                          Param("none", {0.0f}, false)};
  SetGrad(params[0], {3.0f});
  SetGrad(params[1], {4.0f});
  ClipGradients(&params, 5.0, 10.0);  // under the limit
  EXPECT_EQ(At(params[0].value.grad()), 3.0f);
  ClipGradients(&params, 5.0, 0.0);  // 0: no clipping
  EXPECT_EQ(At(params[0].value.grad()), 3.0f);
  ClipGradients(&params, 5.0, 1.0);
  EXPECT_NEAR(At(params[0].value.grad()), 0.6, 1e-6);
  EXPECT_NEAR(At(params[1].value.grad()), 0.8, 1e-6);
  EXPECT_FALSE(params[2].value.grad().defined());
}

}  // namespace
}  // namespace tally::train

namespace tally::train {
namespace {

// The fused path (one multi-tensor kernel, CUDA's) takes the per-parameter
// path's steps, decay and no-gradient parameters included, and a step the
// device marks to skip changes nothing, its count included.
TEST(AdamWTest, TheFusedStepIsTheSameUpdateAndSkipsOnTheDevice) {
  auto make = [] {
    return std::vector<model::Parameter>{Param("decayed", {1.0f, -2.0f}, true),
                                         Param("plain", {0.5f, 3.0f}, false),
                                         Param("untouched", {1.0f}, true)};
  };
  std::vector<model::Parameter> a = make(), b = make();
  AdamWOptions o;
  o.weight_decay = 0.1;
  AdamW plain(&a, o), fused(&b, o, /*fused=*/true);
  EXPECT_TRUE(fused.fused());
  const at::Tensor go = at::zeros({}), skip = at::ones({});
  for (int step = 0; step < 5; ++step) {
    for (auto* params : {&a, &b}) {
      SetGrad((*params)[0], {0.3f * (step + 1), -0.1f});
      SetGrad((*params)[1], {-0.2f, 0.05f * step});
    }
    plain.Step(0.05);
    fused.StepFused(0.05, go);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_TRUE(at::allclose(a[i].value, b[i].value, 1e-6, 1e-7)) << a[i].name << " step "
                                                                     << step;
      EXPECT_TRUE(at::allclose(plain.v()[i], fused.v()[i], 1e-6, 1e-9));
    }
  }
  EXPECT_EQ(fused.step(), 5);
  EXPECT_EQ(At(b[2].value), 1.0f) << "no gradient: untouched";
  // A skipped step: nothing moves on the device; the host takes its count
  // back once it knows.
  const at::Tensor before = b[0].value.clone(), m_before = fused.m()[0].clone();
  SetGrad(b[0], {1.0f, 1.0f});
  fused.StepFused(0.05, skip);
  fused.Unstep();
  EXPECT_TRUE(at::equal(b[0].value, before));
  EXPECT_TRUE(at::equal(fused.m()[0], m_before));
  EXPECT_EQ(fused.step(), 5);
  // And the next step corrects for step 6, as the plain one does.
  for (auto* params : {&a, &b}) {
    SetGrad((*params)[0], {0.7f, 0.7f});
    SetGrad((*params)[1], {0.7f, 0.7f});
  }
  plain.Step(0.05);
  fused.StepFused(0.05, go);
  EXPECT_TRUE(at::allclose(a[0].value, b[0].value, 1e-6, 1e-7));
}

TEST(GradientNormTest, OnTheDeviceAsOnTheHost) {
  std::vector<model::Parameter> params = {Param("a", {3.0f}, false), Param("b", {4.0f, 0.0f}, false),
                                          Param("none", {1.0f}, false),
                                          Param("sharded", {12.0f}, false, true)};
  SetGrad(params[0], {3.0f});
  SetGrad(params[1], {4.0f, 0.0f});
  SetGrad(params[3], {12.0f});
  EXPECT_NEAR(GradientNormOnDevice(params, 144.0).item<double>(), 13.0, 1e-5);
  EXPECT_NEAR(GradientNormOnDevice(params, 0.0).item<double>(), GradientNorm(params, 0.0), 1e-6);
  // Clipping to 6.5: every gradient (the sharded one too) halves, as the
  // host's clipping does; below the bound nothing changes.
  ClipGradientsOnDevice(&params, at::full({}, 13.0f), 6.5);
  EXPECT_NEAR(At(params[0].value.grad()), 1.5, 1e-5);
  EXPECT_NEAR(At(params[3].value.grad()), 6.0, 1e-5);
  ClipGradientsOnDevice(&params, at::full({}, 6.0f), 6.5);
  EXPECT_NEAR(At(params[0].value.grad()), 1.5, 1e-6);
  // A NaN reaches the norm.
  SetGrad(params[1], {NAN, 0.0f});
  EXPECT_TRUE(std::isnan(GradientNormOnDevice(params, 0.0).item<double>()));
}

}  // namespace
}  // namespace tally::train
