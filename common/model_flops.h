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
  // Mixture-of-Experts: E experts of width d_ff, top-k, on every n-th layer.
  int64_t num_experts = 0;
  int64_t top_k = 1;
  int64_t every_n_layers = 1;
  bool shared_expert = false;
};

inline bool IsMoeLayer(const ModelShape& m, int64_t layer) {
  const int64_t n = m.every_n_layers > 0 ? m.every_n_layers : 1;
  return m.num_experts > 0 && layer % n == n - 1;
}

inline int64_t ResolveDff(int64_t d_model, int64_t d_ff) {
  if (d_ff > 0) return d_ff;
  const int64_t raw = (8 * d_model + 2) / 3;
  return (raw + 31) / 32 * 32;
}

inline int64_t ResolveVocab(int64_t vocab_size) {
  return vocab_size > 0 ? vocab_size : kDefaultVocabSize;
}

// Embedding V*D, per layer two norms (2D), fused QKV and output (4D^2) and
// SwiGLU (3DF) -- or, on an MoE layer, a router (E*D), E experts (E*3DF)
// and an optional shared expert (3DF) -- the final norm D and the untied
// head V*D. `active`: only the top-k experts a token is routed to.
inline int64_t ParameterCount(const ModelShape& m, bool active = false) {
  const int64_t D = m.d_model, F = ResolveDff(m.d_model, m.d_ff), V = ResolveVocab(m.vocab_size);
  int64_t n = 2 * V * D + D;
  for (int64_t l = 0; l < m.num_layers; ++l) {
    n += 2 * D + 4 * D * D;
    if (!IsMoeLayer(m, l)) {
      n += 3 * D * F;
      continue;
    }
    n += m.num_experts * D + (active ? m.top_k : m.num_experts) * 3 * D * F;
    if (m.shared_expert) n += 3 * D * F;
  }
  return n;
}

// Training FLOPs of attention (forward + backward: QK^T and AV, 2 FLOPs a
// multiply-add, x3) over `attended_keys` query-key pairs per layer.
inline double AttentionTrainingFlops(int64_t num_layers, int64_t d_model, double attended_keys) {
  return 12.0 * static_cast<double>(num_layers * d_model) * attended_keys;
}

// Training FLOPs per token (forward + backward): 6 x the parameters outside
// the embedding + 12 x layers x d_model x context for attention (the PaLM
// paper's accounting for model-FLOPs utilization: every token attends to the
// whole context). What causal attention over packed documents executes is
// less: a document of L tokens attends L(L+1)/2 pairs
// (AttentionTrainingFlops of those).
inline double TrainingFlopsPerToken(int64_t non_embedding_parameters, int64_t num_layers,
                                    int64_t d_model, int64_t context) {
  return 6.0 * static_cast<double>(non_embedding_parameters) +
         AttentionTrainingFlops(num_layers, d_model, static_cast<double>(context));
}

// From the active parameters: a token computes only its experts.
inline double TrainingFlopsPerToken(const ModelShape& m, int64_t context) {
  return TrainingFlopsPerToken(
      ParameterCount(m, /*active=*/true) - ResolveVocab(m.vocab_size) * m.d_model,
      m.num_layers, m.d_model, context);
}

}  // namespace tally

#endif  // TALLY_COMMON_MODEL_FLOPS_H_
