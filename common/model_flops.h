// The size and cost of the transformer the worker trains, computed from its
// shape alone, so tallyd can price a job without LibTorch. The worker's model
// uses the same definitions (worker/model/transformer.h), and a test checks
// that the two counts agree.
#ifndef TALLY_COMMON_MODEL_FLOPS_H_
#define TALLY_COMMON_MODEL_FLOPS_H_

#include <cstdint>

namespace tally {

// Byte-level tokenizer: 256 bytes + BOS + EOS.
inline constexpr int64_t kDefaultVocabSize = 258;

struct ModelShape {
  int64_t num_layers = 0;
  int64_t d_model = 0;
  int64_t d_ff = 0;        // 0: SwiGLU's 8/3 * d_model, rounded up to 32
  int64_t vocab_size = 0;  // 0: kDefaultVocabSize
};

inline int64_t ResolveDff(int64_t d_model, int64_t d_ff) {
  if (d_ff > 0) return d_ff;
  const int64_t raw = (8 * d_model + 2) / 3;
  return (raw + 31) / 32 * 32;
}

inline int64_t ResolveVocab(int64_t vocab_size) {
  return vocab_size > 0 ? vocab_size : kDefaultVocabSize;
}

// Embedding V*D, per layer two norms (2D), fused QKV and output (4D^2) and
// SwiGLU (3DF), the final norm D and the untied head V*D.
inline int64_t ParameterCount(const ModelShape& m) {
  const int64_t D = m.d_model, F = ResolveDff(m.d_model, m.d_ff), V = ResolveVocab(m.vocab_size);
  return 2 * V * D + D + m.num_layers * (2 * D + 4 * D * D + 3 * D * F);
}

// Training FLOPs per token (forward + backward): 6 x the parameters outside
// the embedding + 12 x layers x d_model x context for attention (the PaLM
// paper's accounting for model-FLOPs utilization).
inline double TrainingFlopsPerToken(int64_t non_embedding_parameters, int64_t num_layers,
                                    int64_t d_model, int64_t context) {
  return 6.0 * static_cast<double>(non_embedding_parameters) +
         12.0 * static_cast<double>(num_layers * d_model) * static_cast<double>(context);
}

inline double TrainingFlopsPerToken(const ModelShape& m, int64_t context) {
  return TrainingFlopsPerToken(ParameterCount(m) - ResolveVocab(m.vocab_size) * m.d_model,
                               m.num_layers, m.d_model, context);
}

}  // namespace tally

#endif  // TALLY_COMMON_MODEL_FLOPS_H_
