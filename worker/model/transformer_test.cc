// The packing guarantee, checked on the model itself: a document packed among
// others computes exactly what it computes alone, and its loss does not depend
// on the other documents at all.
#include "worker/model/transformer.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

#include "gtest/gtest.h"

namespace tally::model {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.num_layers = 2;
  c.d_model = 32;
  c.num_heads = 4;
  c.vocab_size = 50;
  return c;
}

ModelInput Input(const std::vector<std::vector<int64_t>>& docs, int64_t width) {
  std::vector<int64_t> tok, pos, seg;
  int64_t s = 0;
  for (const auto& d : docs) {
    for (size_t i = 0; i < d.size(); ++i) {
      tok.push_back(d[i]);
      pos.push_back(static_cast<int64_t>(i));
      seg.push_back(s);
    }
    ++s;
  }
  for (int64_t i = 0; static_cast<int64_t>(tok.size()) < width; ++i) {
    tok.push_back(0), pos.push_back(i), seg.push_back(s);
  }
  ModelInput in;
  auto t = [&](std::vector<int64_t>& v) {
    return at::tensor(v, at::kLong).view({1, width});
  };
  in.tokens_BT = t(tok);
  in.positions_BT = t(pos);
  in.segments_BT = t(seg);
  return in;
}

TEST(TransformerTest, PackedLogitsEqualLogitsAlone) {
  Transformer model(Tiny(), /*seed=*/3, at::kCPU);
  const std::vector<int64_t> a = {1, 5, 9, 2, 7}, b = {4, 4, 8, 13, 21, 3, 6},
                             c = {11, 12};
  at::Tensor packed = model.Forward(Input({a, b, c}, 16), AttentionKernel::kMaskedSdpa);
  at::Tensor alone = model.Forward(Input({b}, 7), AttentionKernel::kMaskedSdpa);
  at::Tensor b_in_pack = packed.narrow(1, a.size(), b.size());
  EXPECT_TRUE(at::allclose(b_in_pack, alone, /*rtol=*/1e-5, /*atol=*/1e-6))
      << (b_in_pack - alone).abs().max().item<float>();
  // And the mask matters: without it, b would see a.
  ModelInput unmasked = Input({a, b, c}, 16);
  unmasked.segments_BT.zero_();
  unmasked.positions_BT = at::arange(16, at::kLong).view({1, 16});
  at::Tensor leaky = model.Forward(unmasked, AttentionKernel::kMaskedSdpa)
                         .narrow(1, a.size(), b.size());
  EXPECT_FALSE(at::allclose(leaky, alone, 1e-3, 1e-3));
}

TEST(TransformerTest, LossHasNoGradientThroughOtherDocuments) {
  Transformer model(Tiny(), /*seed=*/4, at::kCPU);
  const std::vector<int64_t> a = {1, 5, 9, 2, 7}, b = {4, 4, 8, 13, 21, 3, 6};
  ModelInput in = Input({a, b}, 12);
  // Differentiate with respect to the input embeddings themselves.
  at::Tensor embed = model.parameters()[0].value;
  at::Tensor x = at::embedding(embed, in.tokens_BT).detach().set_requires_grad(true);
  // Re-run the forward from `x` by swapping the embedding for an identity
  // lookup: tokens index rows of x.
  ModelInput via_x = in;
  via_x.tokens_BT = at::arange(12, at::kLong).view({1, 12});
  at::Tensor saved = embed.detach().clone();
  {
    at::NoGradGuard no_grad;
    embed.narrow(0, 0, 12).copy_(x.detach()[0]);
  }
  at::Tensor logits = model.Forward(via_x, AttentionKernel::kMaskedSdpa);
  // Loss of document b only (positions 5..10 predict 6..11).
  at::Tensor loss = at::cross_entropy_loss(logits[0].narrow(0, 5, 6),
                                           at::tensor(std::vector<int64_t>(b.begin() + 1, b.end()), at::kLong));
  loss.backward();
  at::Tensor g = embed.grad();
  ASSERT_TRUE(g.defined());
  EXPECT_EQ(g.narrow(0, 0, 5).abs().max().item<float>(), 0.0f);  // document a
  EXPECT_GT(g.narrow(0, 5, 7).abs().max().item<float>(), 0.0f);  // document b
  {
    at::NoGradGuard no_grad;
    embed.copy_(saved);
  }
}

TEST(TransformerTest, ShapesParametersAndFlops) {
  Transformer model(Tiny(), 1, at::kCPU);
  EXPECT_EQ(model.config().d_ff, 96);  // 8/3 * 32 = 85.3 -> 96
  const int64_t D = 32, F = 96, V = 50, L = 2;
  const int64_t expected = 2 * V * D + D + L * (2 * D + 3 * D * D + D * D + 3 * D * F);
  EXPECT_EQ(model.num_parameters(), expected);
  EXPECT_DOUBLE_EQ(model.TrainingFlopsPerToken(64),
                   6.0 * (expected - V * D) + 12.0 * L * D * 64);
  at::Tensor logits = model.Forward(Input({{1, 2, 3}}, 8), AttentionKernel::kMaskedSdpa);
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{1, 8, V}));
}

TEST(TransformerTest, SameSeedSameModel) {
  Transformer a(Tiny(), 7, at::kCPU), b(Tiny(), 7, at::kCPU), c(Tiny(), 8, at::kCPU);
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    EXPECT_TRUE(at::equal(a.parameters()[i].value, b.parameters()[i].value));
  }
  EXPECT_EQ(a.parameters()[2].name, "layers.0.wqkv");
  EXPECT_FALSE(at::equal(a.parameters()[2].value, c.parameters()[2].value));
}

// The fused forms (BF16 runs') compute what the composite ones compute:
// logits and every parameter's gradient, in FP32 to rounding, and under CPU
// autocast to BF16 rounding; w1 and w3 are row blocks of one storage.
TEST(TransformerTest, FusedOpsComputeTheSame) {
  for (const bool autocast : {false, true}) {
    SCOPED_TRACE(autocast ? "BF16 autocast" : "FP32");
    Transformer plain(Tiny(), 5, at::kCPU), fused(Tiny(), 5, at::kCPU);
    fused.SetFusedOps(true);
    const ModelInput in = Input({{1, 5, 9, 2, 7}, {4, 4, 8, 13, 21, 3, 6}}, 16);
    at::autocast::set_autocast_enabled(at::kCPU, autocast);
    const at::Tensor a = plain.Forward(in, AttentionKernel::kMaskedSdpa).to(at::kFloat);
    const at::Tensor b = fused.Forward(in, AttentionKernel::kMaskedSdpa).to(at::kFloat);
    a.square().sum().backward();
    b.square().sum().backward();
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    const double tol = autocast ? 2e-2 : 1e-5;
    EXPECT_LT((a - b).abs().max().item<double>(), tol * a.abs().max().item<double>());
    for (size_t i = 0; i < plain.parameters().size(); ++i) {
      const at::Tensor& ga = plain.parameters()[i].value.grad();
      const at::Tensor& gb = fused.parameters()[i].value.grad();
      ASSERT_TRUE(gb.defined()) << plain.parameters()[i].name;
      EXPECT_LT((ga - gb).abs().max().item<double>(),
                tol * std::max(1e-6, ga.abs().max().item<double>()))
          << plain.parameters()[i].name;
    }
  }
  Transformer m(Tiny(), 5, at::kCPU);
  const at::Tensor& w1 = m.parameters()[5].value;
  const at::Tensor& w3 = m.parameters()[6].value;
  ASSERT_EQ(m.parameters()[5].name, "layers.0.w1");
  ASSERT_EQ(m.parameters()[6].name, "layers.0.w3");
  EXPECT_TRUE(w1.storage().is_alias_of(w3.storage()));
  EXPECT_TRUE(w1.is_leaf() && w3.is_leaf());
}

}  // namespace
}  // namespace tally::model
