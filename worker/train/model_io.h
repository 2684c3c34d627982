// A trained model in and out of Tally: the model a checkpoint holds, its
// export as a Hugging Face folder (tally-export), and the weights a job
// starts from (model.init_from: a Hugging Face folder or a Tally
// checkpoint).
//
// Checkpoints record the model they hold in their metadata: "model" (the
// ModelConfig, ModelConfigJson), "seq_len", and "tokenizer" ({"kind",
// "vocab_size", "bos", "eos"} from the dataset trained on). Checkpoints
// written before those fields existed are read from their "fingerprint"
// (layers, d_model, heads, d_ff, vocab, seq_len, moe), with RoPE theta and
// norm epsilon at the defaults they were trained with, and the byte
// tokenizer.
#ifndef TALLY_WORKER_TRAIN_MODEL_IO_H_
#define TALLY_WORKER_TRAIN_MODEL_IO_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/hf.h"

namespace tally::train {

nlohmann::json ModelConfigJson(const model::ModelConfig& c);

// The model a checkpoint's metadata describes ("model", else the
// fingerprint). InvalidArgument naming the field when neither can be read.
absl::StatusOr<model::ModelConfig> ModelConfigFromMetadata(const nlohmann::json& meta);

struct CheckpointModel {
  std::string path;
  model::ModelConfig config;
  int64_t seq_len = 0;
  int64_t step = 0;
  std::string sha256;                            // the whole file's, hex
  nlohmann::json tokenizer;                      // {"kind", "vocab_size", "bos", "eos"}
  std::map<std::string, at::Tensor> parameters;  // by Transformer parameter name
  std::map<int64_t, at::Tensor> biases;          // MoE selection biases by layer
  // training.qat's format and layers when the model was trained for them
  // (the metadata's "qat"); nullopt otherwise.
  std::optional<model::WeightQuantization> qat;
};

// Reads and verifies a checkpoint (train/checkpoint.h) and takes the model
// out of it: its config, tokenizer and parameters (optimizer and FP8 state
// are left). InvalidArgument naming the field or tensor when the checkpoint
// holds no model Tally can rebuild, or a model weight or MoE bias that is
// NaN or infinite (so tally-export and model.init_from refuse it).
absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& path,
                                                    const std::string& expected_sha256 = "");

// What ExportHf wrote.
struct ExportSummary {
  std::string architecture;  // "LlamaForCausalLM" or "MixtralForCausalLM"
  int64_t tensors = 0;
  int64_t parameters = 0;
  int64_t bytes = 0;  // of model.safetensors
};

// Writes `out_dir` (created if missing): config.json, model.safetensors,
// generation_config.json, and the tokenizer (the byte vocabulary as
// tokenizer.json, tokenizer_config.json and special_tokens_map.json).
// FailedPrecondition naming the feature for a model neither Hugging Face
// class can express (model/hf.h).
absl::StatusOr<ExportSummary> ExportHf(const CheckpointModel& m, const std::string& out_dir,
                                       const model::HfExportOptions& options);

// The weights model.init_from names: a Hugging Face folder or a Tally
// checkpoint.
struct InitialWeights {
  std::string source;  // "DIR/config.json" or the checkpoint's path, for errors
  model::ModelConfig config;
  nlohmann::json tokenizer;  // null when the source records none
  std::map<std::string, at::Tensor> parameters;
  std::map<int64_t, at::Tensor> biases;
  // Parameters the model keeps from its own (seeded) init: an upcycled
  // model's routers.
  std::set<std::string> keep_init;
  // Where the weights came from, as checkpoints record it ("init_from" in
  // their metadata): {"kind": "checkpoint"|"hf", "path", "sha256" (of the
  // checkpoint file, or of the folder's model.safetensors)}, with
  // "upcycled" added by UpcycleWeights.
  nlohmann::json provenance;
};
absl::StatusOr<InitialWeights> ReadInitialWeights(const std::string& hf_dir,
                                                  const std::string& checkpoint);

// "layers=2 d_model=64 heads=4 d_ff=192 vocab=258[ moe=8x2/every1]": a
// model's shape, for messages.
std::string ShapeString(const model::ModelConfig& c);

// Sparse upcycling (model.init_from.upcycle): makes `w`, a dense model's
// weights, those of `target` (the job's model: the same layers, width,
// heads, feed-forward width and vocabulary, with target.moe making every
// n-th layer Mixture-of-Experts). On each MoE layer every expert's w1, w3
// and w2 start as copies of the dense layer's, plus N(0, noise_std^2)
// noise per expert drawn from `seed` when noise_std > 0; the router is left
// to the model's own init (keep_init). Everything else is copied. With
// top_k >= 2 (the gates of a token's experts are normalised to sum to 1)
// and noise 0, the upcycled model computes the dense model's logits.
// FailedPrecondition naming both shapes for a source that is already MoE or
// a shape that differs; fills target's d_ff, vocab, rope_theta and norm_eps
// from the source like ReconcileModel.
absl::Status UpcycleWeights(double noise_std, uint64_t seed, model::ModelConfig* target,
                            InitialWeights* w);

// Makes `spec` (the job's model) the model `theirs` describes: fields the
// spec leaves unset (d_ff 0, vocab_size 0) and those it cannot state
// (rope_theta, norm_eps) are taken from it; a field the spec states
// differently is FailedPrecondition naming the spec field, both values and
// `source`.
absl::Status ReconcileModel(const model::ModelConfig& theirs, const std::string& source,
                            model::ModelConfig* spec);

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_MODEL_IO_H_
