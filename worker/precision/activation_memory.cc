#include "worker/precision/activation_memory.h"

#include <algorithm>

#include "common/model_flops.h"

namespace tally::precision {
namespace {

// The attention half of a layer and the feed-forward's norm input and h,
// per token: everything but the feed-forward's products.
int64_t AttentionBytes(int64_t d, StepPrecision p) {
  // Residual, h (or its FP8 transpose), q k v, the attention output (and
  // wo's FP8 copy of it).
  return p == StepPrecision::kFp8 ? 4 * d + 1 * d + 6 * d + 2 * d + 1 * d
                                  : 4 * d + 2 * d + 6 * d + 2 * d;
}

// One feed-forward (dense, shared or one expert's) over a token: its input
// h as the w1|w3 product keeps it, the joint output, the SwiGLU output as
// w2 keeps it.
int64_t FeedForwardBytes(int64_t d, int64_t f, StepPrecision p) {
  return p == StepPrecision::kFp8 ? 1 * d + 4 * f + 1 * f : 2 * d + 4 * f + 2 * f;
}

}  // namespace

int64_t DenseLayerBytesPerToken(int64_t d, int64_t f, StepPrecision p) {
  if (p == StepPrecision::kFp32) return 0;
  return AttentionBytes(d, p) + 4 * d + FeedForwardBytes(d, f, p);
}

StepMemory EstimateStepMemory(const model::ModelConfig& c, int64_t tokens, StepPrecision p) {
  StepMemory m;
  if (p == StepPrecision::kFp32) return m;
  const int64_t d = c.d_model, f = ResolveDff(c.d_model, c.d_ff), v = ResolveVocab(c.vocab_size);
  const int64_t E = c.moe.num_experts, k = c.moe.top_k;
  const int64_t every = std::max<int64_t>(1, c.moe.every_n_layers);
  int64_t per_token = 4 * d + 2 * d + 6 * v;  // the head and the loss
  int64_t block_params = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const bool moe = E > 0 && l % every == every - 1;
    block_params += 4 * d * d;
    if (!moe) {
      per_token += DenseLayerBytesPerToken(d, f, p);
      block_params += 3 * d * f;
      continue;
    }
    per_token += AttentionBytes(d, p) + 4 * d + 12 * E + k * (6 * d + FeedForwardBytes(d, f, p));
    block_params += 3 * d * f * E;
    if (c.moe.shared_expert) {
      per_token += FeedForwardBytes(d, f, p);
      block_params += 3 * d * f;
    }
  }
  m.activation_bytes = per_token * tokens;
  // BF16: every linear's BF16 copy (the head's too); FP8: the block
  // linears' two FP8 layouts and the head's BF16 copy.
  m.weight_cast_bytes = 2 * block_params + 2 * v * d;
  return m;
}

}  // namespace tally::precision
