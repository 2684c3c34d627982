// Tally's model as one GGUF file of llama.cpp's `llama` architecture, which
// llama.cpp, llama-cpp-python, Ollama and LM Studio load.
//
// The file (GGUF v3, little-endian): "GGUF", uint32 3, uint64 tensor count,
// uint64 key-value count; the key-value pairs (a string is a uint64 length
// and its bytes; a value is a uint32 type and the value; an array is the
// element type, a uint64 count and the elements); one info per tensor (name,
// uint32 dimensions, uint64 ne[dimensions] innermost first, so a PyTorch
// shape reversed, uint32 ggml type, uint64 offset into the data section);
// zeros up to general.alignment (32); the data section, every tensor at a
// multiple of 32 from its start, in info order, zero-padded to the next.
//
//   Tally                        GGUF                             type
//   embed [V, D]                 token_embd.weight                F16
//   layers.i.attn_norm [D]       blk.i.attn_norm.weight           F32
//   layers.i.wqkv [3D, D]        blk.i.attn_q / attn_k / attn_v   quant (all_linear) or F16
//                                (rows 0..D-1, D..2D-1, 2D..3D-1; q and k reordered, below)
//   layers.i.wo [D, D]           blk.i.attn_output.weight         quant (all_linear) or F16
//   layers.i.ffn_norm [D]        blk.i.ffn_norm.weight            F32
//   layers.i.w1 / w3 / w2        blk.i.ffn_gate / ffn_up / ffn_down.weight   quant or F16
//   layers.i.router [E, D]       blk.i.ffn_gate_inp.weight        F32 (llama.cpp's own choice)
//   layers.i.experts.w1 / w3 [E, F, D], w2 [E, D, F]
//                                blk.i.ffn_gate_exps / ffn_up_exps / ffn_down_exps.weight
//                                                                 quant or F16
//   final_norm [D]               output_norm.weight               F32
//   head [V, D]                  output.weight                    F16
// "quant" is the chosen Q8_0 or Q4_0 for the linears QuantizesParameter
// (ggml_quant.h) names; with F16 every matrix is F16. The quantized bytes are
// PackGgmlBlocks', the very values quantization-aware training computes with.
//
// RoPE: Tally rotates the pairs (j, j + K/2) of each head by theta^(-2j/K)
// (Hugging Face's rotate_half); llama.cpp's llama architecture rotates the
// adjacent pairs (2j, 2j + 1) by the same angle. So attn_q and attn_k hold
// each head's rows reordered, row 2j Tally's row j and row 2j + 1 Tally's row
// j + K/2 (llama.cpp's converter does the same to a Hugging Face Llama): the
// same attention. Blocks run along D, within a row, so the reordering moves
// whole blocks and the quantized rows are Tally's own, bit for bit.
//
// Mixture-of-Experts: llama.cpp's llama MoE takes p = softmax(router x)
// over all E experts, the top k of p, and weighs the chosen experts' outputs
// by p_i / (sum of the chosen p). Tally's (moe.cc Route) with a softmax
// router and k >= 2 computes the same: the softmax over all experts, top-k
// on the scores plus the selection biases, gates renormalised over the k.
// So the biases must be zero (or dropped, knowingly), and what llama.cpp
// cannot run is refused as for the Hugging Face export (hf.h
// UnexpressibleMoe): a sigmoid router, a shared expert, MoE in only some
// layers, token dropping (capacity_factor), top-1 (Tally's gate is then the
// raw score, llama.cpp's would be 1).
//
// Tokenizer (tokenizer.ggml.*), the one the model was trained with:
//   byte: model "gpt2" (byte-level BPE), pre "default", no merges; token b
//     (0..255) is byte b's GPT-2 character (bytes_to_unicode), so llama.cpp
//     splits any text into one token per byte, the ids Tally trained on;
//     256 <s> (BOS) and 257 </s> (EOS) are control tokens; BOS is added.
//   sentencepiece: model "llama" with the .model file's pieces, scores and
//     types (normal 1, unknown 2, control 3, user-defined 4, unused 5, byte
//     6), its unknown, BOS and EOS ids, add_space_prefix as its normalizer's
//     add_dummy_prefix; BOS added when the model has one (as tally-prep
//     encoded). llama.cpp applies no NFKC normalisation, and segments by
//     merging the highest-scored pairs, which is BPE's own; a unigram
//     model's segmentation may differ (GgufVocab::notes says so).
//   pretokenized: model "none" (the ids are the user's), llama.vocab_size.
// Ids past the tokenizer's vocabulary (a model wider than it) are unused
// tokens "[PAD<id>]".
#ifndef TALLY_WORKER_MODEL_GGUF_H_
#define TALLY_WORKER_MODEL_GGUF_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file/file_system.h"
#include "nlohmann/json.hpp"
#include "worker/model/config.h"
#include "worker/model/ggml_quant.h"

namespace tally::model {

inline constexpr uint32_t kGgufVersion = 3;
inline constexpr uint32_t kGgufAlignment = 32;

// ggml's tensor types written here.
enum class GgmlType : uint32_t { kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ8_0 = 8 };

// tokenizer.ggml.token_type values.
enum class GgufTokenType : int32_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

// The tokenizer as GGUF's metadata states it (the file's comment).
struct GgufVocab {
  std::string model;  // tokenizer.ggml.model: "gpt2", "llama" or "none"
  std::string pre;    // tokenizer.ggml.pre; "": not written
  std::vector<std::string> tokens;
  std::vector<float> scores;  // empty: not written
  std::vector<GgufTokenType> types;
  bool write_merges = false;             // an empty tokenizer.ggml.merges (gpt2 needs the key)
  int64_t bos = -1, eos = -1, unk = -1;  // -1: none
  bool add_bos = false;
  std::optional<bool> add_space_prefix;
  // What a user should know about how llama.cpp will tokenize, for the CLI
  // to print.
  std::vector<std::string> notes;
};

// Tally's byte tokenizer for a model of `vocab_size` ids (at least 256, and
// past bos and eos).
GgufVocab ByteLevelGgufVocab(int64_t vocab_size, int64_t bos, int64_t eos);

// A SentencePiece model file's vocabulary (`model_bytes`, the serialized
// ModelProto, read here without the library), for a model of `vocab_size`
// ids. InvalidArgument naming `path` for bytes that are not a ModelProto, or
// a vocabulary wider than the model.
absl::StatusOr<GgufVocab> SentencePieceGgufVocab(const std::string& model_bytes,
                                                 const std::string& path, int64_t vocab_size,
                                                 int64_t bos, int64_t eos);

// The vocabulary a checkpoint's tokenizer record ({"kind", "bos", "eos",
// "model_path", "model_sha256"}) names, for a model of `vocab_size` ids. A
// SentencePiece model is read from `tokenizer_model`, else the recorded
// path, and must have the recorded SHA-256. FailedPrecondition saying what to
// pass (--tokenizer_model=PATH) when it cannot be read or is another file,
// and for a kind this build does not know.
absl::StatusOr<GgufVocab> GgufVocabFromRecord(const nlohmann::json& record, int64_t vocab_size,
                                              const std::string& tokenizer_model,
                                              file::FileSystem* fs = nullptr);

struct GgufExportOptions {
  std::optional<GgmlQuant> quant;  // nullopt: F16
  QuantLayers quant_layers = QuantLayers::kFfn;
  std::string name;  // general.name
  int64_t context_length = 2048;
  // Export even when expert-selection biases are non-zero (the exported
  // model then routes some tokens differently).
  bool drop_routing_bias = false;
  GgufVocab vocab;
};

// What WriteGguf wrote.
struct GgufSummary {
  int64_t tensors = 0;
  int64_t quantized_tensors = 0;
  int64_t parameters = 0;
  int64_t bytes = 0;  // the file's
};

// Writes `path` (one AtomicFile through `fs`; null: the operating
// system's): PATH.tmp, renamed over `path` once whole, and nothing left
// behind on an error. `parameters` by Tally parameter name
// (Transformer::parameters()), `biases` the MoE selection biases by layer.
// Every check runs before the file is started: FailedPrecondition naming the
// feature for an MoE llama.cpp cannot run, the tensor for one missing or
// misshapen, a weight CheckExportableWeight (hf.h) refuses, or a quantized
// tensor whose rows are not whole blocks of 32; InvalidArgument for a
// vocabulary of another size than the model's.
absl::StatusOr<GgufSummary> WriteGguf(const std::string& path, const ModelConfig& c,
                                      const std::map<std::string, at::Tensor>& parameters,
                                      const std::map<int64_t, at::Tensor>& biases,
                                      const GgufExportOptions& options,
                                      file::FileSystem* fs = nullptr);

// A q or k projection [H*K, D] with each head's rows in llama.cpp's rotary
// order: row 2j of a head is Tally's row j, row 2j + 1 its row j + K/2.
at::Tensor InterleaveRopeRows(const at::Tensor& w, int64_t num_heads);

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_GGUF_H_
