#include "worker/model/ggml_quant.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "worker/model/transformer.h"

namespace tally::model {
namespace {

// llama.cpp's reference quantizers, transcribed loop by loop from
// ggml-quants.c (quantize_row_q8_0_ref, quantize_row_q4_0_ref), with the
// FP16 scale rounded to nearest even as GGML_FP32_TO_FP16 does.
struct ScalarBlock {
  float d = 0;  // after the FP16 round trip
  std::vector<int> q;
};

float ToHalfAndBack(float x) {
  return at::Half(x);  // round to nearest even, as F16C and ggml do
}

ScalarBlock ReferenceQ8(const float* x) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / ((1 << 7) - 1);
  const float id = d ? 1.0f / d : 0.0f;
  ScalarBlock b;
  b.d = ToHalfAndBack(d);
  for (int j = 0; j < 32; ++j) {
    const float x0 = x[j] * id;
    b.q.push_back(static_cast<int>(std::roundf(x0)));
  }
  return b;
}

ScalarBlock ReferenceQ4(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    const float v = x[j];
    if (amax < std::fabs(v)) {
      amax = std::fabs(v);
      max = v;
    }
  }
  const float d = max / -8;
  const float id = d ? 1.0f / d : 0.0f;
  ScalarBlock b;
  b.d = ToHalfAndBack(d);
  for (int j = 0; j < 32; ++j) {
    volatile float x0 = x[j] * id;  // no fused multiply-add
    volatile float shifted = x0 + 8.5f;
    b.q.push_back(std::min(15, static_cast<int>(static_cast<int8_t>(shifted))));
  }
  return b;
}

// Weights with the cases that decide a quantizer: ties at .5 after
// scaling, equal magnitudes of both signs, a zero block, tiny and large
// values.
at::Tensor Awkward(int64_t rows, int64_t cols, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor w = at::normal(0.0, 0.02, {rows, cols}, gen, at::TensorOptions().dtype(at::kFloat));
  w[0].narrow(0, 0, 32).zero_();
  // Block 1 of row 0: a +-1 pair of equal magnitude (Q4_0 takes the first).
  w[0].narrow(0, 32, 32).fill_(0.25f);
  w[0][32] = -1.0f;
  w[0][40] = 1.0f;
  // Row 1: multiples of max/127 / 2, so x * id lands on halves.
  for (int64_t j = 0; j < std::min<int64_t>(cols, 64); ++j) {
    w[1][j] = static_cast<float>(j % 32) * 0.5f * (j % 2 ? -1.0f : 1.0f);
  }
  w[2].mul_(1e4);
  w[3].mul_(1e-6);
  return w;
}

void ExpectMatchesReference(GgmlQuant q) {
  const at::Tensor w = Awkward(6, 96, 7);
  const GgmlBlocks b = QuantizeBlocks(w, q);
  const at::Tensor deq = DequantizeBlocks(b, q);
  const float* x = w.data_ptr<float>();
  for (int64_t blk = 0; blk < w.numel() / 32; ++blk) {
    const ScalarBlock ref = q == GgmlQuant::kQ8_0 ? ReferenceQ8(x + blk * 32)
                                                  : ReferenceQ4(x + blk * 32);
    const float d = static_cast<float>(b.scale.reshape({-1})[blk].item<at::Half>());
    ASSERT_EQ(std::memcmp(&d, &ref.d, 4), 0) << "block " << blk << ": " << d << " vs " << ref.d;
    for (int j = 0; j < 32; ++j) {
      const int code = b.codes.reshape({-1})[blk * 32 + j].item<int8_t>();
      ASSERT_EQ(code, ref.q[j]) << "block " << blk << " weight " << j;
      const float want = q == GgmlQuant::kQ8_0 ? ref.q[j] * ref.d : (ref.q[j] - 8) * ref.d;
      const float got = deq.reshape({-1})[blk * 32 + j].item<float>();
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0) << "block " << blk << " weight " << j;
    }
  }
}

TEST(GgmlQuantTest, Q8MatchesTheReferenceBitForBit) { ExpectMatchesReference(GgmlQuant::kQ8_0); }
TEST(GgmlQuantTest, Q4MatchesTheReferenceBitForBit) { ExpectMatchesReference(GgmlQuant::kQ4_0); }

TEST(GgmlQuantTest, HalvesRoundAwayFromZeroAndTheFirstOfEqualMagnitudesSetsQ4Sign) {
  at::Tensor w = at::zeros({32});
  w[0] = 127.0f;  // d = 1
  w[1] = 2.5f;
  w[2] = -2.5f;
  w[3] = 0.49999997f;
  const GgmlBlocks q8 = QuantizeBlocks(w, GgmlQuant::kQ8_0);
  EXPECT_EQ(q8.codes[1].item<int8_t>(), 3);
  EXPECT_EQ(q8.codes[2].item<int8_t>(), -3);
  EXPECT_EQ(q8.codes[3].item<int8_t>(), 0);
  at::Tensor v = at::zeros({32});
  v[0] = -2.0f;
  v[5] = 2.0f;
  const GgmlBlocks q4 = QuantizeBlocks(v, GgmlQuant::kQ4_0);
  EXPECT_EQ(static_cast<float>(q4.scale[0].item<at::Half>()), 0.25f);  // -2 / -8
  EXPECT_EQ(q4.codes[0].item<int8_t>(), 0);   // -2 -> -8
  EXPECT_EQ(q4.codes[5].item<int8_t>(), 15);  // +2 -> +8, clamped to 7
}

TEST(GgmlQuantTest, FakeQuantizeIsTheDequantizedValueWithAStraightThroughGradient) {
  at::Tensor w = Awkward(4, 64, 3).requires_grad_(true);
  for (GgmlQuant q : {GgmlQuant::kQ8_0, GgmlQuant::kQ4_0}) {
    const at::Tensor y = FakeQuantize(w, q);
    EXPECT_TRUE(at::equal(y.detach(), QuantizeDequantize(w, q)));
    const at::Tensor g = at::randn({4, 64});
    w.mutable_grad() = at::Tensor();
    (y * g).sum().backward();
    EXPECT_TRUE(at::equal(w.grad(), g));
  }
}

TEST(GgmlQuantTest, PacksBlocksAsGgufLaysThemOut) {
  at::Tensor w = at::zeros({1, 32});
  for (int j = 0; j < 32; ++j) w[0][j] = static_cast<float>(j - 16);  // max |w| 16 at j = 0
  const std::string q8 = PackGgmlBlocks(w, GgmlQuant::kQ8_0);
  ASSERT_EQ(q8.size(), 34u);
  uint16_t half;
  std::memcpy(&half, q8.data(), 2);
  EXPECT_EQ(half, at::Half(16.0f / 127).x);
  EXPECT_EQ(static_cast<int8_t>(q8[2]), -127);
  const std::string q4 = PackGgmlBlocks(w, GgmlQuant::kQ4_0);
  ASSERT_EQ(q4.size(), 18u);
  std::memcpy(&half, q4.data(), 2);
  EXPECT_EQ(half, at::Half(2.0f).x);  // -16 / -8
  // Weight 0 (-16 -> code 0) low nibble, weight 16 (0 -> code 8) high.
  EXPECT_EQ(static_cast<uint8_t>(q4[2]), 0x80);
}

TEST(GgmlQuantTest, NamesTheLayersEachChoiceQuantizes) {
  EXPECT_TRUE(QuantizesParameter("layers.0.w1", QuantLayers::kFfn));
  EXPECT_TRUE(QuantizesParameter("layers.3.experts.w2", QuantLayers::kFfn));
  EXPECT_FALSE(QuantizesParameter("layers.0.wqkv", QuantLayers::kFfn));
  EXPECT_TRUE(QuantizesParameter("layers.0.wqkv", QuantLayers::kAllLinear));
  EXPECT_TRUE(QuantizesParameter("layers.0.wo", QuantLayers::kAllLinear));
  for (const char* never : {"embed", "head", "final_norm", "layers.0.router",
                            "layers.0.attn_norm", "layers.0.ffn_norm"}) {
    EXPECT_FALSE(QuantizesParameter(never, QuantLayers::kAllLinear)) << never;
  }
  EXPECT_FALSE(ParseGgmlQuant("q4_1").has_value());
  EXPECT_FALSE(ParseQuantLayers("attention").has_value());
}

// The model under QAT computes exactly what a model holding the quantized
// weights (an export's) computes, dense and MoE, for each choice of layers.
TEST(GgmlQuantTest, AQuantizingModelComputesWithTheExportedWeights) {
  for (int64_t experts : {0, 4}) {
    for (QuantLayers layers : {QuantLayers::kFfn, QuantLayers::kAllLinear}) {
      ModelConfig c;
      c.num_layers = 2;
      c.d_model = 64;
      c.num_heads = 4;
      c.moe.num_experts = experts;
      c.moe.top_k = 2;
      Transformer qat(c, 5, at::kCPU), exported(c, 5, at::kCPU);
      WeightQuantization q;
      q.format = GgmlQuant::kQ4_0;
      q.layers = layers;
      qat.SetWeightQuantization(q);
      {
        at::NoGradGuard no_grad;
        for (Parameter& p : exported.parameters()) {
          if (QuantizesParameter(p.name, layers)) {
            p.value.copy_(QuantizeDequantize(p.value, q.format));
          }
        }
      }
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(9);
      ModelInput in;
      in.tokens_BT = at::randint(0, 258, {2, 16}, gen, at::kLong);
      in.positions_BT = at::arange(16, at::kLong).repeat({2, 1});
      in.segments_BT = at::zeros({2, 16}, at::kLong);
      in.real_BT = at::ones({2, 16}, at::kBool);
      const at::Tensor a = qat.Forward(in, AttentionKernel::kMaskedSdpa);
      const at::Tensor b = exported.Forward(in, AttentionKernel::kMaskedSdpa);
      EXPECT_TRUE(at::equal(a, b)) << experts << " experts, " << QuantLayersName(layers);
      // And not what the unquantized weights compute.
      qat.SetWeightQuantization(std::nullopt);
      EXPECT_FALSE(at::equal(qat.Forward(in, AttentionKernel::kMaskedSdpa), b));
    }
  }
}

}  // namespace
}  // namespace tally::model
