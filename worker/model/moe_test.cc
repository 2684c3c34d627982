#include "worker/model/moe.h"

#include <ATen/core/grad_mode.h>

#include "common/model_flops.h"
#include "gtest/gtest.h"
#include "worker/model/transformer.h"

namespace tally::model {
namespace {

struct Experts {
  at::Tensor router, w1, w3, w2;
};

Experts Make(int64_t E, int64_t D, int64_t F, uint64_t seed) {
  at::manual_seed(seed);
  Experts x{at::randn({E, D}), at::randn({E, F, D}) * 0.3, at::randn({E, F, D}) * 0.3,
            at::randn({E, D, F}) * 0.3};
  for (at::Tensor* t : {&x.router, &x.w1, &x.w3, &x.w2}) t->set_requires_grad(true);
  return x;
}

// Token by token, expert by expert: what MoeForward must compute.
at::Tensor Naive(const at::Tensor& x_ND, const Experts& ex, const MoeConfig& c) {
  std::vector<at::Tensor> rows;
  for (int64_t n = 0; n < x_ND.size(0); ++n) {
    at::Tensor xn = x_ND[n];
    at::Tensor p = at::softmax(at::matmul(ex.router, xn), -1);
    auto [vals, idx] = at::topk(p, c.top_k);
    at::Tensor gates = c.top_k == 1 ? vals : vals / vals.sum();
    at::Tensor y = at::zeros_like(xn);
    for (int64_t k = 0; k < c.top_k; ++k) {
      const int64_t e = idx[k].item<int64_t>();
      at::Tensor h = at::silu(at::matmul(ex.w1[e], xn)) * at::matmul(ex.w3[e], xn);
      y = y + gates[k] * at::matmul(ex.w2[e], h);
    }
    rows.push_back(y);
  }
  return at::stack(rows);
}

TEST(MoeTest, MatchesANaivePerTokenReferenceWithGradients) {
  MoeConfig c;
  c.num_experts = 4;
  c.top_k = 2;
  Experts a = Make(4, 8, 16, 1), b = Make(4, 8, 16, 1);
  at::Tensor x1 = at::randn({10, 8}).set_requires_grad(true);
  at::Tensor x2 = x1.detach().clone().set_requires_grad(true);
  MoeOutput out = MoeForward(x1, {}, a.router, {}, a.w1, a.w3, a.w2, c, nullptr, "l.");
  at::Tensor ref = Naive(x2, b, c);
  EXPECT_TRUE(at::allclose(out.y_ND, ref, 1e-5, 1e-6)) << (out.y_ND - ref).abs().max();
  at::Tensor g = at::randn({10, 8});
  out.y_ND.backward(g);
  ref.backward(g);
  EXPECT_TRUE(at::allclose(x1.grad(), x2.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(a.w1.grad(), b.w1.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(a.w2.grad(), b.w2.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(a.router.grad(), b.router.grad(), 1e-5, 1e-6));
  int64_t total = 0;
  for (int64_t n : ReadMoeStats(out.stats).tokens_per_expert) total += n;
  EXPECT_EQ(total, 20);
  EXPECT_EQ(ReadMoeStats(out.stats).dropped, 0);
}

TEST(MoeTest, GroupedProductsMatchTheLoopWithPaddedGroupsAndDrops) {
  MoeConfig loop;
  loop.num_experts = 6;
  loop.top_k = 2;
  loop.capacity_factor = 1.0;  // some drops, some experts short
  loop.grouped_mm = false;
  for (int64_t align : {1, 4, 16}) {
    MoeConfig grouped = loop;
    grouped.grouped_mm = true;
    grouped.group_align = align;
    Experts a = Make(6, 8, 16, 3), b = Make(6, 8, 16, 3);
    at::manual_seed(11);
    at::Tensor x1 = at::randn({29, 8}).set_requires_grad(true);
    at::Tensor x2 = x1.detach().clone().set_requires_grad(true);
    MoeOutput og = MoeForward(x1, {}, a.router, {}, a.w1, a.w3, a.w2, grouped, nullptr, "");
    MoeOutput ol = MoeForward(x2, {}, b.router, {}, b.w1, b.w3, b.w2, loop, nullptr, "");
    EXPECT_GT(ReadMoeStats(og.stats).dropped, 0);
    EXPECT_EQ(ReadMoeStats(og.stats).tokens_per_expert, ReadMoeStats(ol.stats).tokens_per_expert);
    EXPECT_TRUE(at::allclose(og.y_ND, ol.y_ND, 1e-5, 1e-6)) << align;
    at::Tensor g = at::randn({29, 8});
    og.y_ND.backward(g);
    ol.y_ND.backward(g);
    EXPECT_TRUE(at::allclose(x1.grad(), x2.grad(), 1e-5, 1e-6)) << align;
    EXPECT_TRUE(at::allclose(a.w2.grad(), b.w2.grad(), 1e-5, 1e-6)) << align;
    EXPECT_TRUE(at::allclose(a.w3.grad(), b.w3.grad(), 1e-5, 1e-6)) << align;
    EXPECT_FALSE(at::isnan(a.w1.grad()).any().item<bool>());
  }
}

TEST(MoeTest, PaddedGroupsAreAligned) {
  // [2, 3, 0, 2] assignments aligned to 4: group ends 4, 8, 8, 12.
  std::vector<int64_t> starts;
  EXPECT_EQ(PaddedGroupEnds({2, 3, 0, 2}, 4, &starts), (std::vector<int64_t>{4, 8, 8, 12}));
  EXPECT_EQ(starts, (std::vector<int64_t>{0, 4, 8, 8}));
  EXPECT_EQ(PaddedGroupEnds({2, 3, 0, 2}, 1), (std::vector<int64_t>{2, 5, 5, 7}));
}

TEST(MoeTest, TopOneMatchesTheReferenceAndTrainsTheRouter) {
  MoeConfig c;
  c.num_experts = 3;
  c.top_k = 1;
  Experts a = Make(3, 8, 16, 2), b = Make(3, 8, 16, 2);
  at::Tensor x = at::randn({7, 8});
  MoeOutput out = MoeForward(x, {}, a.router, {}, a.w1, a.w3, a.w2, c, nullptr, "");
  at::Tensor ref = Naive(x, b, c);
  EXPECT_TRUE(at::allclose(out.y_ND, ref, 1e-5, 1e-6));
  out.y_ND.sum().backward();
  ref.sum().backward();
  EXPECT_GT(a.router.grad().abs().sum().item<double>(), 0) << "the router learns";
  EXPECT_TRUE(at::allclose(a.router.grad(), b.router.grad(), 1e-5, 1e-6));
}

TEST(MoeTest, AuxLossOnHandComputedCases) {
  MoeConfig c;
  c.num_experts = 2;
  at::NoGradGuard no_grad;
  at::Tensor router = at::eye(2) * 30.0;  // probabilities ~one-hot
  at::Tensor x = at::tensor({1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f, 1.0f}).view({4, 2});
  at::Tensor w1 = at::zeros({2, 4, 2}), w2 = at::zeros({2, 2, 4});
  MoeOutput out = MoeForward(x, {}, router, {}, w1, w1, w2, c, nullptr, "");
  // f = P = (0.75, 0.25): 2 x (0.75^2 + 0.25^2) = 1.25.
  EXPECT_NEAR(out.aux_loss.item<double>(), 1.25, 1e-6);
  EXPECT_EQ(ReadMoeStats(out.stats).tokens_per_expert, (std::vector<int64_t>{3, 1}));
  // A uniform router: P = (0.5, 0.5), so the loss is 1 however tokens go.
  MoeOutput uniform = MoeForward(x, {}, at::zeros({2, 2}), {}, w1, w1, w2, c, nullptr, "");
  EXPECT_NEAR(uniform.aux_loss.item<double>(), 1.0, 1e-6);
  EXPECT_NEAR(ReadMoeStats(uniform.stats).router_entropy, std::log(2.0), 1e-6);
  // z-loss: logsumexp of (30, 0) and (0, 30) is ~30.
  EXPECT_NEAR(out.z_loss.item<double>(), 900.0, 1e-3);
  // Padding is excluded from the losses and statistics.
  MoeOutput masked = MoeForward(x, at::tensor({1, 1, 1, 0}).to(at::kBool), router, {}, w1, w1, w2,
                                c, nullptr, "");
  EXPECT_EQ(ReadMoeStats(masked.stats).tokens_per_expert, (std::vector<int64_t>{3, 0}));
  EXPECT_NEAR(masked.aux_loss.item<double>(), 2.0, 1e-6);  // all on expert 0
}

TEST(MoeTest, BiasSteersSelectionButNotGates) {
  MoeConfig c;
  c.num_experts = 2;
  at::NoGradGuard no_grad;
  at::Tensor x = at::ones({3, 2});
  at::Tensor router = at::tensor({1.0f, 1.0f, 0.0f, 0.0f}).view({2, 2});  // prefers expert 0
  Routing plain = Route(x, router, {}, c);
  EXPECT_EQ(plain.expert_NK[0][0].item<int64_t>(), 0);
  Routing biased = Route(x, router, at::tensor({0.0f, 1.0f}), c);
  EXPECT_EQ(biased.expert_NK[0][0].item<int64_t>(), 1);
  // The gate is expert 1's own (smaller) probability, not the biased score.
  EXPECT_NEAR(biased.gate_NK[0][0].item<double>(), biased.scores_NE[0][1].item<double>(), 1e-7);
  EXPECT_LT(biased.gate_NK[0][0].item<double>(), 0.5);
  at::Tensor bias = at::zeros({4});
  NudgeBias(bias, {5, 1, 3, 3}, 0.01);
  EXPECT_TRUE(at::allclose(bias, at::tensor({-0.01f, 0.01f, 0.0f, 0.0f})));
}

TEST(MoeTest, TheTestKnobRoutesEveryTokenToOneExpertWhateverScoresAndBiases) {
  MoeConfig c;
  c.num_experts = 4;
  c.top_k = 2;
  c.test_forced_expert = 3;
  at::manual_seed(4);
  at::NoGradGuard no_grad;
  at::Tensor x = at::randn({64, 8});
  at::Tensor router = at::randn({4, 8});
  router[3].fill_(0);
  Routing r = Route(x, router, at::tensor({0.0f, 0.0f, 0.0f, -5.0f}), c);
  EXPECT_TRUE(r.expert_NK.eq(3).any(1).all().item<bool>()) << "expert 3 in every token's top-k";
  // The other choice is still the router's: not always the same expert.
  at::Tensor other = at::where(r.expert_NK.select(1, 0).eq(3), r.expert_NK.select(1, 1),
                               r.expert_NK.select(1, 0));
  EXPECT_GT(std::get<0>(at::_unique(other)).numel(), 1);
  // The gates are the router's own probabilities, finite and summing to 1.
  EXPECT_TRUE(at::allclose(r.gate_NK.sum(1), at::ones({64})));
  c.test_forced_expert = -1;
  EXPECT_FALSE(Route(x, router, {}, c).expert_NK.eq(3).any(1).all().item<bool>());
}

TEST(MoeTest, CapacityDropsAndCounts) {
  MoeConfig c;
  c.num_experts = 2;
  c.capacity_factor = 1.0;  // ceil(1.0 x 8 x 1 / 2) = 4 per expert
  at::NoGradGuard no_grad;
  at::Tensor router = at::tensor({5.0f, 0.0f}).view({2, 1});
  at::Tensor x = at::ones({8, 1});  // every token prefers expert 0
  at::Tensor w1 = at::ones({2, 2, 1}), w2 = at::ones({2, 1, 2});
  MoeOutput out = MoeForward(x, {}, router, {}, w1, w1, w2, c, nullptr, "");
  EXPECT_EQ(ReadMoeStats(out.stats).tokens_per_expert, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(ReadMoeStats(out.stats).dropped, 4);
  EXPECT_GT(out.y_ND[3][0].item<float>(), 0.0f);
  EXPECT_EQ(out.y_ND[4][0].item<float>(), 0.0f);  // dropped: contributes nothing
}

TEST(MoeTest, AnExpertWithNoTokensGetsNoNaN) {
  MoeConfig c;
  c.num_experts = 3;
  Experts ex = Make(3, 4, 8, 5);
  {
    at::NoGradGuard no_grad;
    ex.router[2].fill_(-100.0);  // never chosen, for positive inputs
  }
  at::Tensor x = at::rand({6, 4}) + 0.1;
  MoeOutput out = MoeForward(x, {}, ex.router, {}, ex.w1, ex.w3, ex.w2, c, nullptr, "");
  EXPECT_EQ(ReadMoeStats(out.stats).tokens_per_expert[2], 0);
  (out.y_ND.sum() + 0.01 * out.aux_loss).backward();
  for (const at::Tensor& t : {ex.w1, ex.w2, ex.router}) {
    ASSERT_TRUE(t.grad().defined());
    EXPECT_FALSE(at::isnan(t.grad()).any().item<bool>());
  }
  EXPECT_EQ(ex.w1.grad()[2].abs().sum().item<float>(), 0.0f);
}

TEST(MoeTest, TransformerCountsActiveParameters) {
  ModelConfig cfg;
  cfg.num_layers = 2;
  cfg.d_model = 32;
  cfg.num_heads = 4;
  cfg.vocab_size = 50;
  cfg.moe.num_experts = 4;
  cfg.moe.top_k = 1;
  cfg.moe.every_n_layers = 2;  // layer 1 only
  Transformer dense_model([&] { ModelConfig d = cfg; d.moe = {}; return d; }(), 1, at::kCPU);
  Transformer moe_model(cfg, 1, at::kCPU);
  const int64_t expert = 3 * 32 * 96;
  EXPECT_EQ(moe_model.num_parameters(), dense_model.num_parameters() + 3 * expert + 4 * 32);
  // Top-1: the same active parameters as dense, plus the router.
  EXPECT_EQ(moe_model.num_active_parameters(), dense_model.num_parameters() + 4 * 32);
  // tallyd prices jobs from common/model_flops.h: the same counts.
  for (bool shared : {false, true}) {
    ModelConfig c2 = cfg;
    c2.moe.shared_expert = shared;
    c2.moe.top_k = 2;
    Transformer m2(c2, 1, at::kCPU);
    ModelShape shape{2, 32, 0, 50, 4, 2, 2, shared};
    EXPECT_EQ(ParameterCount(shape), m2.num_parameters());
    EXPECT_EQ(ParameterCount(shape, /*active=*/true), m2.num_active_parameters());
    EXPECT_DOUBLE_EQ(TrainingFlopsPerToken(shape, 64), m2.TrainingFlopsPerToken(64));
  }
  ModelInput in;
  in.tokens_BT = at::arange(8, at::kLong).view({1, 8});
  in.positions_BT = at::arange(8, at::kLong).view({1, 8});
  in.segments_BT = at::zeros({1, 8}, at::kLong);
  ForwardOutput out = moe_model.Run(in, AttentionKernel::kMaskedSdpa);
  ASSERT_EQ(out.moe.size(), 1u);
  EXPECT_EQ(out.moe[0].layer, 1);
  EXPECT_TRUE(out.aux_loss.defined());
  EXPECT_EQ(moe_model.expert_biases().size(), 1u);
}

}  // namespace
}  // namespace tally::model
