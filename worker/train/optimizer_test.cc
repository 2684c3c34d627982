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
