// The model's shape, apart from the code that builds it, so that a training
// configuration can hold one without ATen: ModelConfig (transformer.h) and
// its Mixture-of-Experts part, MoeConfig (moe.h).
#ifndef TALLY_WORKER_MODEL_CONFIG_H_
#define TALLY_WORKER_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tally::model {

struct MoeConfig {
  int64_t num_experts = 0;  // 0: dense
  int64_t top_k = 1;
  int64_t every_n_layers = 1;
  bool shared_expert = false;
  bool sigmoid_router = false;  // false: softmax
  double capacity_factor = 0;   // 0: dropless
  // Expert products: one grouped product per weight over all experts
  // (at::_grouped_mm; BF16 on CUDA) instead of a loop over experts. With a
  // LinearOverride that is a GroupedLinearOverride (FP8), where its Groups()
  // says so, through its GroupedLinear (at::_scaled_grouped_mm); elsewhere
  // the loop.
  bool grouped_mm = true;
  // Rows of each expert's group padded to a multiple of this (zero rows) for
  // the grouped product; 0: what the device needs (16 on CUDA, 1 on CPU).
  int64_t group_align = 0;
  // Tests only: every token is routed to this expert (as one of its top-k)
  // whatever the scores, a forced routing collapse. -1: off.
  int64_t test_forced_expert = -1;
};

// llama.cpp's GGUF block formats (model/ggml_quant.h has the quantizers).
enum class GgmlQuant { kQ8_0, kQ4_0 };

// Which block linears QAT (and an export, or a quantized evaluation)
// quantizes: the feed-forward weights (dense, shared expert and experts:
// w1, w3, w2), or those and attention's projections (wqkv, wo). Never the
// embedding, the norms, the MoE router or the output head.
enum class QuantLayers { kFfn, kAllLinear };

// A format and the layers it covers.
struct WeightQuantization {
  GgmlQuant format = GgmlQuant::kQ8_0;
  QuantLayers layers = QuantLayers::kFfn;
  bool operator==(const WeightQuantization& o) const {
    return format == o.format && layers == o.layers;
  }
  bool operator!=(const WeightQuantization& o) const { return !(*this == o); }
};

// Their names as specs, flags and checkpoints write them: "q8_0" / "q4_0",
// "ffn" / "all_linear"; nullopt for anything else.
inline std::optional<GgmlQuant> ParseGgmlQuant(std::string_view name) {
  if (name == "q8_0") return GgmlQuant::kQ8_0;
  if (name == "q4_0") return GgmlQuant::kQ4_0;
  return std::nullopt;
}
inline const char* GgmlQuantName(GgmlQuant q) { return q == GgmlQuant::kQ8_0 ? "q8_0" : "q4_0"; }
inline std::optional<QuantLayers> ParseQuantLayers(std::string_view name) {
  if (name == "ffn") return QuantLayers::kFfn;
  if (name == "all_linear") return QuantLayers::kAllLinear;
  return std::nullopt;
}
inline const char* QuantLayersName(QuantLayers layers) {
  return layers == QuantLayers::kFfn ? "ffn" : "all_linear";
}
// "q4_0 ffn".
inline std::string QuantizationName(const WeightQuantization& q) {
  return std::string(GgmlQuantName(q.format)) + " " + QuantLayersName(q.layers);
}

struct ModelConfig {
  int64_t num_layers = 2;
  int64_t d_model = 64;
  int64_t num_heads = 4;
  int64_t d_ff = 0;  // 0: SwiGLU's 8/3 * d_model, rounded up to a multiple of 32
  int64_t vocab_size = 258;
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  MoeConfig moe;  // num_experts 0: every feed-forward block is dense
};

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_CONFIG_H_
