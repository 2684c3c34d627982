#include "worker/precision/activation_memory.h"

#include <cstdio>

#include "gtest/gtest.h"

namespace tally::precision {
namespace {

TEST(StepMemoryTest, PerLayerBytesFollowWhatEachPathSaves) {
  EXPECT_EQ(DenseLayerBytesPerToken(2048, 5472, StepPrecision::kBf16), 20 * 2048 + 6 * 5472);
  EXPECT_EQ(DenseLayerBytesPerToken(2048, 5472, StepPrecision::kFp8), 19 * 2048 + 5 * 5472);
  EXPECT_EQ(DenseLayerBytesPerToken(2048, 5472, StepPrecision::kFp32), 0) << "not estimated";
}

// The device script's step shapes (tests/gpu/run.sh, step_bench; the byte
// tokenizer's 258 tokens): what the README states for them.
TEST(StepMemoryTest, TheDeviceScriptsShapes) {
  struct Case {
    const char* name;
    int64_t layers, d_model, tokens;
    double bf16_gb, fp8_gb, casts_gb;
  };
  for (const Case& k : {Case{"1B, 8 x 2048 tokens", 20, 2048, 8 * 2048, 24.41, 21.94, 2.02},
                        Case{"3B, 4 x 2048 tokens", 26, 3072, 4 * 2048, 23.72, 21.32, 5.89},
                        Case{"3B, 2 x 2048 tokens", 26, 3072, 2 * 2048, 11.86, 10.66, 5.89}}) {
    SCOPED_TRACE(k.name);
    model::ModelConfig c;
    c.num_layers = k.layers;
    c.d_model = k.d_model;
    c.vocab_size = 258;
    const StepMemory bf16 = EstimateStepMemory(c, k.tokens, StepPrecision::kBf16);
    const StepMemory fp8 = EstimateStepMemory(c, k.tokens, StepPrecision::kFp8);
    std::printf("%s: activations BF16 %.2f GB, FP8 %.2f GB; weight casts %.2f GB\n", k.name,
                bf16.activation_bytes / 1e9, fp8.activation_bytes / 1e9,
                fp8.weight_cast_bytes / 1e9);
    EXPECT_NEAR(bf16.activation_bytes / 1e9, k.bf16_gb, 0.01);
    EXPECT_NEAR(fp8.activation_bytes / 1e9, k.fp8_gb, 0.01);
    EXPECT_NEAR(fp8.weight_cast_bytes / 1e9, k.casts_gb, 0.01);
    EXPECT_EQ(bf16.weight_cast_bytes, fp8.weight_cast_bytes);
  }
}

TEST(StepMemoryTest, ExpertsCountAsTopKFeedForwardsAndFp32IsNotEstimated) {
  model::ModelConfig dense;
  dense.num_layers = 2;
  dense.d_model = 64;
  model::ModelConfig moe = dense;
  moe.moe.num_experts = 8;
  moe.moe.top_k = 2;
  moe.moe.every_n_layers = 1;
  const int64_t d = 64, f = 192;  // 8/3 x 64 rounded up to 32
  const StepMemory a = EstimateStepMemory(dense, 100, StepPrecision::kFp8);
  const StepMemory b = EstimateStepMemory(moe, 100, StepPrecision::kFp8);
  // Per layer and token: one more feed-forward, two gathered rows, the router.
  EXPECT_EQ(b.activation_bytes - a.activation_bytes,
            2 * 100 * ((1 * d + 5 * f) + 2 * 6 * d + 12 * 8));
  EXPECT_EQ(b.weight_cast_bytes - a.weight_cast_bytes, 2 * 2 * 7 * 3 * d * f);
  EXPECT_EQ(EstimateStepMemory(dense, 100, StepPrecision::kFp32).activation_bytes, 0);
}

}  // namespace
}  // namespace tally::precision
