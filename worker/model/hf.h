// Tally's model as a Hugging Face model and back: LlamaForCausalLM for a
// dense model, MixtralForCausalLM for a softmax-routed Mixture-of-Experts
// one. Both are the same decoder Tally trains (RMSNorm, RoPE, SwiGLU, no
// biases, an untied head); the names and layouts differ:
//
//   embed [V, D]               model.embed_tokens.weight
//   layers.i.attn_norm [D]     model.layers.i.input_layernorm.weight
//   layers.i.wqkv [3D, D]      model.layers.i.self_attn.{q,k,v}_proj.weight
//                              (rows 0..D-1, D..2D-1, 2D..3D-1)
//   layers.i.wo [D, D]         model.layers.i.self_attn.o_proj.weight
//   layers.i.ffn_norm [D]      model.layers.i.post_attention_layernorm.weight
//   layers.i.w1/w3/w2          model.layers.i.mlp.{gate,up,down}_proj.weight
//   layers.i.router [E, D]     model.layers.i.block_sparse_moe.gate.weight
//   layers.i.experts.w1 [E,F,D] model.layers.i.block_sparse_moe.experts.e.w1.weight
//   (w3 likewise; w2 [E, D, F])
//   final_norm [D]             model.norm.weight
//   head [V, D]                lm_head.weight
//
// RoPE needs no permutation: Tally rotates the pairs (i, i + K/2) of each
// head, which is what those classes' rotate_half does, with the same
// frequencies (theta^(-2i/K)).
//
// What neither class can express is refused, naming the feature: a sigmoid
// router, a shared expert, MoE in only some layers, token dropping
// (capacity_factor), top-1 routing (Tally keeps the raw score as the gate;
// Mixtral renormalises it to 1), and non-zero expert-selection biases (Mixtral
// selects by the router's scores alone) unless the caller accepts the
// difference. The GGUF export (model/gguf.h) refuses the same, through the
// same checks. So does a weight that is not finite or larger in magnitude
// than F16 holds (65504): vLLM runs an FP32 model in F16 by default, and
// llama.cpp stores it so.
#ifndef TALLY_WORKER_MODEL_HF_H_
#define TALLY_WORKER_MODEL_HF_H_

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/safetensors.h"

namespace tally::model {

struct HfExportOptions {
  at::ScalarType dtype = at::kFloat;  // of the written weights: kFloat or kBFloat16
  int64_t bos = -1, eos = -1;         // -1: none
  int64_t max_position_embeddings = 2048;
  // Export even when expert-selection biases are non-zero (the exported
  // model then routes some tokens differently).
  bool drop_routing_bias = false;
  // The SentencePiece model to write beside the weights, when it is no
  // longer where the checkpoint's tokenizer record says (its SHA-256 must
  // still match the record's). Empty: the recorded path.
  std::string tokenizer_model;
};

// Why a Mixture-of-Experts model of shape `c` cannot be run as `target`
// ("MixtralForCausalLM", "llama.cpp's llama architecture"), which routes
// every layer by a softmax over its router, to its top k >= 2 experts, with
// their scores renormalised to sum to 1, and has no shared expert: the
// ModelConfig field and why, or "" for one it can (and for a dense model).
std::string UnexpressibleMoe(const ModelConfig& c, const std::string& target);

// FailedPrecondition "cannot export as `format`: layer N selects experts with
// balancing biases ..." for the first layer whose selection biases are not all
// zero (`target` selects by the router's scores alone, so some tokens would
// go to other experts), naming both fixes; OK when `drop` (the caller accepts
// the difference) or every bias is zero.
absl::Status CheckRoutingBiases(const std::map<int64_t, at::Tensor>& biases, bool drop,
                                const std::string& format, const std::string& target);

// The largest magnitude an exported weight may hold: F16's largest finite
// value.
inline constexpr double kMaxExportedWeight = 65504.0;

// FailedPrecondition naming tensor `name`, the value and where it is, for
// the first element of `t` that is NaN, infinite or larger in magnitude than
// kMaxExportedWeight (no trained model's weights are; a run that diverged
// has them): export an earlier checkpoint.
absl::Status CheckExportableWeight(const std::string& name, const at::Tensor& t);

// config.json for `c`; FailedPrecondition naming the feature for a shape
// neither class can express.
absl::StatusOr<nlohmann::ordered_json> HfConfig(const ModelConfig& c,
                                                const HfExportOptions& options);

// The Hugging Face tensors for Tally's `tensors` (by Tally parameter name,
// as Transformer::parameters() names them) and MoE selection `biases` (by
// layer). FailedPrecondition for a missing or misshapen tensor, a weight
// CheckExportableWeight refuses, or non-zero biases unless
// options.drop_routing_bias.
absl::StatusOr<NamedTensors> ToHfTensors(const ModelConfig& c,
                                         const std::map<std::string, at::Tensor>& tensors,
                                         const std::map<int64_t, at::Tensor>& biases,
                                         const HfExportOptions& options);

// The model config.json describes. InvalidArgument naming the config.json
// field for what Tally cannot build (an unknown model_type, grouped-query
// attention, biases, RoPE scaling, an activation other than SiLU, top-1
// Mixtral routing). rope_theta and rms_norm_eps are taken as given.
absl::StatusOr<ModelConfig> ModelConfigFromHf(const nlohmann::json& config,
                                              const std::string& path);

// Tally's parameters (by name) from a Hugging Face folder's tensors for
// config `c` (from ModelConfigFromHf); InvalidArgument naming the tensor for
// one missing, misshapen or unexpected. A tied head (no lm_head.weight and
// tie_word_embeddings) starts as a copy of the embedding.
absl::StatusOr<std::map<std::string, at::Tensor>> FromHfTensors(const ModelConfig& c,
                                                                const NamedTensors& tensors,
                                                                bool tied_head,
                                                                const std::string& path);

// config.json and model.safetensors of a Hugging Face folder, read and
// mapped: the architecture and Tally's parameters.
struct HfModel {
  ModelConfig config;
  std::map<std::string, at::Tensor> parameters;
};
absl::StatusOr<HfModel> ReadHfFolder(const std::string& dir);

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_HF_H_
