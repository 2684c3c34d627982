#include "worker/model/gguf.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/model_flops.h"
#include "worker/data/dataset.h"
#include "worker/model/hf.h"

namespace tally::model {
namespace {

constexpr char kLlamaCpp[] = "llama.cpp's llama architecture";
constexpr char kGguf[] = "a llama GGUF";

// GGUF's value types.
enum class Value : uint32_t {
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
};

// Little-endian encodings, appended to a string.
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutF32(std::string* out, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  PutU32(out, bits);
}
void PutString(std::string* out, absl::string_view s) {
  PutU64(out, s.size());
  out->append(s.data(), s.size());
}

// The key-value section, in the order the pairs are added.
class GgufMetadata {
 public:
  void U32(absl::string_view key, int64_t v) {
    Key(key, Value::kUint32);
    PutU32(&bytes_, static_cast<uint32_t>(v));
  }
  void F32(absl::string_view key, double v) {
    Key(key, Value::kFloat32);
    PutF32(&bytes_, static_cast<float>(v));
  }
  void Bool(absl::string_view key, bool v) {
    Key(key, Value::kBool);
    bytes_.push_back(v ? 1 : 0);
  }
  void Str(absl::string_view key, absl::string_view v) {
    Key(key, Value::kString);
    PutString(&bytes_, v);
  }
  void Strings(absl::string_view key, const std::vector<std::string>& v) {
    Array(key, Value::kString, v.size());
    for (const std::string& s : v) PutString(&bytes_, s);
  }
  void F32s(absl::string_view key, const std::vector<float>& v) {
    Array(key, Value::kFloat32, v.size());
    for (float f : v) PutF32(&bytes_, f);
  }
  void I32s(absl::string_view key, const std::vector<int32_t>& v) {
    Array(key, Value::kInt32, v.size());
    for (int32_t i : v) PutU32(&bytes_, static_cast<uint32_t>(i));
  }
  int64_t count() const { return count_; }
  const std::string& bytes() const { return bytes_; }

 private:
  void Key(absl::string_view key, Value type) {
    PutString(&bytes_, key);
    PutU32(&bytes_, static_cast<uint32_t>(type));
    ++count_;
  }
  void Array(absl::string_view key, Value element, uint64_t n) {
    Key(key, Value::kArray);
    PutU32(&bytes_, static_cast<uint32_t>(element));
    PutU64(&bytes_, n);
  }
  std::string bytes_;
  int64_t count_ = 0;
};

// One tensor of the file, planned before anything is written.
struct PlannedTensor {
  std::string name;        // GGUF's
  std::string source;      // Tally's parameter, for messages
  at::Tensor value;        // Tally's rows (a view)
  int64_t rope_heads = 0;  // > 0: rows reordered for llama.cpp's RoPE, per this many heads
  GgmlType type = GgmlType::kF16;
  uint64_t bytes = 0;
  uint64_t offset = 0;  // in the data section
};

uint64_t Padded(uint64_t n) { return (n + kGgufAlignment - 1) / kGgufAlignment * kGgufAlignment; }

uint64_t DataBytes(GgmlType type, int64_t numel) {
  switch (type) {
    case GgmlType::kF32:
      return 4 * numel;
    case GgmlType::kF16:
      return 2 * numel;
    case GgmlType::kQ8_0:
      return numel / kGgmlBlock * GgmlBlockBytes(GgmlQuant::kQ8_0);
    case GgmlType::kQ4_0:
      return numel / kGgmlBlock * GgmlBlockBytes(GgmlQuant::kQ4_0);
  }
  return 0;
}

const char* FileTypeName(const std::optional<GgmlQuant>& q) {
  return !q ? "f16" : GgmlQuantName(*q);
}

// general.file_type: llama.cpp's LLAMA_FTYPE_MOSTLY_*.
uint32_t FileType(const std::optional<GgmlQuant>& q) {
  if (!q) return 1;
  return *q == GgmlQuant::kQ8_0 ? 7 : 2;
}

// The tensors of `c` in file order, each checked (present, of its shape,
// exportable, whole blocks where quantized).
class TensorPlanner {
 public:
  TensorPlanner(const ModelConfig& c, const std::map<std::string, at::Tensor>& t,
                const GgufExportOptions& o)
      : c_(c), t_(t), o_(o) {}

  absl::StatusOr<std::vector<PlannedTensor>> Plan() {
    const int64_t D = c_.d_model, V = c_.vocab_size, F = ResolveDff(c_.d_model, c_.d_ff);
    const int64_t E = c_.moe.num_experts;
    Add("token_embd.weight", "embed", {V, D});
    for (int64_t i = 0; i < c_.num_layers && status_.ok(); ++i) {
      const std::string p = absl::StrCat("layers.", i, "."), b = absl::StrCat("blk.", i, ".");
      Add(b + "attn_norm.weight", p + "attn_norm", {D});
      if (Take(p + "wqkv", {3 * D, D})) {
        const at::Tensor& wqkv = t_.at(p + "wqkv");
        Push(b + "attn_q.weight", p + "wqkv", wqkv.narrow(0, 0, D), c_.num_heads);
        Push(b + "attn_k.weight", p + "wqkv", wqkv.narrow(0, D, D), c_.num_heads);
        Push(b + "attn_v.weight", p + "wqkv", wqkv.narrow(0, 2 * D, D), 0);
      }
      Add(b + "attn_output.weight", p + "wo", {D, D});
      Add(b + "ffn_norm.weight", p + "ffn_norm", {D});
      if (E == 0) {
        Add(b + "ffn_gate.weight", p + "w1", {F, D});
        Add(b + "ffn_up.weight", p + "w3", {F, D});
        Add(b + "ffn_down.weight", p + "w2", {D, F});
      } else {
        Add(b + "ffn_gate_inp.weight", p + "router", {E, D});
        Add(b + "ffn_gate_exps.weight", p + "experts.w1", {E, F, D});
        Add(b + "ffn_up_exps.weight", p + "experts.w3", {E, F, D});
        Add(b + "ffn_down_exps.weight", p + "experts.w2", {E, D, F});
      }
    }
    Add("output_norm.weight", "final_norm", {D});
    Add("output.weight", "head", {V, D});
    if (!status_.ok()) return status_;
    return std::move(out_);
  }

 private:
  // Whether `name` is there, of `shape`, and exportable; the first failure
  // is kept.
  bool Take(const std::string& name, const std::vector<int64_t>& shape) {
    if (!status_.ok()) return false;
    auto it = t_.find(name);
    if (it == t_.end()) {
      status_ = absl::FailedPreconditionError(absl::StrCat("the checkpoint has no tensor ", name));
    } else if (it->second.sizes().vec() != shape) {
      status_ = absl::FailedPreconditionError(
          absl::StrCat("tensor ", name, " is [", absl::StrJoin(it->second.sizes(), ", "),
                       "], the model config wants [", absl::StrJoin(shape, ", "), "]"));
    } else {
      status_ = CheckExportableWeight(name, it->second);
    }
    return status_.ok();
  }

  void Add(const std::string& gguf, const std::string& name, const std::vector<int64_t>& shape) {
    if (Take(name, shape)) Push(gguf, name, t_.at(name), 0);
  }

  void Push(const std::string& gguf, const std::string& name, const at::Tensor& value,
            int64_t rope_heads) {
    if (!status_.ok()) return;
    PlannedTensor p{gguf, name, value, rope_heads};
    const bool router = absl::EndsWith(name, ".router");
    if (value.dim() == 1 || router) {
      p.type = GgmlType::kF32;
    } else if (o_.quant && QuantizesParameter(name, o_.quant_layers)) {
      p.type = *o_.quant == GgmlQuant::kQ8_0 ? GgmlType::kQ8_0 : GgmlType::kQ4_0;
      if (value.size(-1) % kGgmlBlock != 0) {
        status_ = absl::FailedPreconditionError(
            absl::StrCat("--quant=", GgmlQuantName(*o_.quant), " quantizes blocks of ", kGgmlBlock,
                         " weights along each row, and tensor ", name, "'s rows hold ",
                         value.size(-1), ": train with model.d_model and model.d_ff multiples of ",
                         kGgmlBlock, ", or export with --quant=f16"));
        return;
      }
    }
    p.bytes = DataBytes(p.type, value.numel());
    out_.push_back(std::move(p));
  }

  const ModelConfig& c_;
  const std::map<std::string, at::Tensor>& t_;
  const GgufExportOptions& o_;
  absl::Status status_;
  std::vector<PlannedTensor> out_;
};

void AddModelMetadata(const ModelConfig& c, const GgufExportOptions& o, GgufMetadata* m) {
  m->Str("general.architecture", "llama");
  m->Str("general.name", o.name);
  m->U32("general.alignment", kGgufAlignment);
  m->U32("general.file_type", FileType(o.quant));
  if (o.quant) m->U32("general.quantization_version", 2);  // ggml's QK format version
  m->U32("llama.vocab_size", c.vocab_size);
  m->U32("llama.context_length", o.context_length);
  m->U32("llama.embedding_length", c.d_model);
  m->U32("llama.block_count", c.num_layers);
  m->U32("llama.feed_forward_length", ResolveDff(c.d_model, c.d_ff));
  m->U32("llama.attention.head_count", c.num_heads);
  m->U32("llama.attention.head_count_kv", c.num_heads);
  m->F32("llama.rope.freq_base", c.rope_theta);
  m->U32("llama.rope.dimension_count", c.d_model / c.num_heads);
  m->F32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  if (c.moe.num_experts > 0) {
    m->U32("llama.expert_count", c.moe.num_experts);
    m->U32("llama.expert_used_count", c.moe.top_k);
  }
}

void AddVocabMetadata(const GgufVocab& v, GgufMetadata* m) {
  m->Str("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) m->Str("tokenizer.ggml.pre", v.pre);
  if (v.model == "none") return;
  m->Strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) m->F32s("tokenizer.ggml.scores", v.scores);
  std::vector<int32_t> types;
  for (GgufTokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  m->I32s("tokenizer.ggml.token_type", types);
  if (v.write_merges) m->Strings("tokenizer.ggml.merges", {});
  if (v.bos >= 0) m->U32("tokenizer.ggml.bos_token_id", v.bos);
  if (v.eos >= 0) m->U32("tokenizer.ggml.eos_token_id", v.eos);
  if (v.unk >= 0) m->U32("tokenizer.ggml.unknown_token_id", v.unk);
  m->Bool("tokenizer.ggml.add_bos_token", v.add_bos);
  m->Bool("tokenizer.ggml.add_eos_token", false);
  if (v.add_space_prefix) m->Bool("tokenizer.ggml.add_space_prefix", *v.add_space_prefix);
}

// The bytes of one planned tensor as the file holds them.
std::string TensorData(const PlannedTensor& p) {
  at::Tensor w = p.value.detach().to(at::kCPU);
  if (p.rope_heads > 0) w = InterleaveRopeRows(w, p.rope_heads);
  switch (p.type) {
    case GgmlType::kQ8_0:
      return PackGgmlBlocks(w, GgmlQuant::kQ8_0);
    case GgmlType::kQ4_0:
      return PackGgmlBlocks(w, GgmlQuant::kQ4_0);
    case GgmlType::kF32:
    case GgmlType::kF16:
      break;
  }
  // Little-endian in memory, as GGUF is (the only byte order Tally builds for).
  const at::Tensor v = w.to(p.type == GgmlType::kF32 ? at::kFloat : at::kHalf).contiguous();
  return std::string(static_cast<const char*>(v.data_ptr()),
                     static_cast<size_t>(v.numel() * v.element_size()));
}

// GPT-2's bytes_to_unicode: the printable bytes ('!'..'~', 0xA1..0xAC,
// 0xAE..0xFF) stand for themselves, the others for U+0100 onwards in byte
// order; as UTF-8.
std::string ByteChar(int b) {
  auto printable = [](int x) {
    return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF);
  };
  int code = b;
  if (!printable(b)) {
    code = 256;
    for (int x = 0; x < b; ++x) code += printable(x) ? 0 : 1;
  }
  std::string out;
  if (code < 0x80) {
    out.push_back(static_cast<char>(code));
  } else {
    out.push_back(static_cast<char>(0xC0 | (code >> 6)));
    out.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
  return out;
}

// Unused ids from the tokenizer's vocabulary up to the model's.
void PadVocab(int64_t vocab_size, GgufVocab* v) {
  for (auto id = static_cast<int64_t>(v->tokens.size()); id < vocab_size; ++id) {
    v->tokens.push_back(absl::StrCat("[PAD", id, "]"));
    v->types.push_back(GgufTokenType::kUnused);
    if (!v->scores.empty()) v->scores.push_back(-1e9f);  // never merged into
  }
}

// Protocol buffers' wire format, as much as a SentencePiece ModelProto needs:
// `visit(field, wire_type, varint, bytes)` for each field of `msg` (varint
// for wire types 0, 1 and 5, bytes for 2); false when `msg` is malformed or
// `visit` returns false.
bool ForEachField(absl::string_view msg,
                  const std::function<bool(uint64_t, int, uint64_t, absl::string_view)>& visit) {
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && i < msg.size(); shift += 7) {
      const auto byte = static_cast<uint8_t>(msg[i++]);
      *v |= static_cast<uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  while (i < msg.size()) {
    uint64_t key = 0, v = 0;
    if (!varint(&key)) return false;
    const int wire = static_cast<int>(key & 7);
    absl::string_view bytes;
    if (wire == 0) {
      if (!varint(&v)) return false;
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      if (msg.size() - i < n) return false;
      for (size_t k = 0; k < n; ++k) {
        v |= static_cast<uint64_t>(static_cast<uint8_t>(msg[i + k])) << (8 * k);
      }
      i += n;
    } else if (wire == 2) {
      if (!varint(&v) || v > msg.size() - i) return false;
      bytes = msg.substr(i, v);
      i += v;
    } else {
      return false;  // groups: not in a ModelProto
    }
    if (!visit(key >> 3, wire, v, bytes)) return false;
  }
  return true;
}

// ModelProto's fields: pieces = 1 {piece = 1, score = 2, type = 3},
// trainer_spec = 2 {model_type = 3: unigram 1, bpe 2}, normalizer_spec = 3
// {add_dummy_prefix = 3}.
bool ParseModelProto(absl::string_view bytes, GgufVocab* v, int64_t* model_type) {
  return ForEachField(bytes, [&](uint64_t field, int wire, uint64_t, absl::string_view sub) {
    if (field == 1 && wire == 2) {
      std::string piece;
      float score = 0;
      uint64_t type = 1;  // NORMAL, the default
      const bool ok = ForEachField(sub, [&](uint64_t f, int w, uint64_t x, absl::string_view s) {
        if (f == 1 && w == 2) piece = std::string(s);
        if (f == 2 && w == 5) {
          const auto bits = static_cast<uint32_t>(x);
          std::memcpy(&score, &bits, 4);
        }
        if (f == 3 && w == 0) type = x;
        return true;
      });
      if (!ok || type < 1 || type > 6) return false;
      v->tokens.push_back(std::move(piece));
      v->scores.push_back(score);
      v->types.push_back(static_cast<GgufTokenType>(type));
    } else if (field == 2 && wire == 2) {
      return ForEachField(sub, [&](uint64_t f, int w, uint64_t x, absl::string_view) {
        if (f == 3 && w == 0) *model_type = static_cast<int64_t>(x);
        return true;
      });
    } else if (field == 3 && wire == 2) {
      return ForEachField(sub, [&](uint64_t f, int w, uint64_t x, absl::string_view) {
        if (f == 3 && w == 0) v->add_space_prefix = x != 0;
        return true;
      });
    }
    return true;
  });
}

absl::Status CheckVocab(const ModelConfig& c, const GgufVocab& v) {
  if (v.model == "none") return absl::OkStatus();
  const auto n = static_cast<int64_t>(v.tokens.size());
  if (n != c.vocab_size || static_cast<int64_t>(v.types.size()) != n ||
      (!v.scores.empty() && static_cast<int64_t>(v.scores.size()) != n)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer has ", n, " tokens (", v.types.size(), " types, ",
                     v.scores.size(), " scores) for a model of ", c.vocab_size, " ids"));
  }
  for (int64_t id : {v.bos, v.eos, v.unk}) {
    if (id >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("the tokenizer's special id ", id, " is past its ", n, " tokens"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

GgufVocab ByteLevelGgufVocab(int64_t vocab_size, int64_t bos, int64_t eos) {
  GgufVocab v;
  v.model = "gpt2";
  v.pre = "default";
  v.write_merges = true;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(ByteChar(b));
    v.types.push_back(GgufTokenType::kNormal);
  }
  // The specials' ids follow the bytes (256 and 257 in Tally's).
  for (int64_t id = 256; id < std::max(bos, eos) + 1; ++id) {
    v.tokens.push_back(id == bos ? "<s>" : id == eos ? "</s>" : absl::StrCat("[PAD", id, "]"));
    v.types.push_back(id == bos || id == eos ? GgufTokenType::kControl : GgufTokenType::kUnused);
  }
  PadVocab(vocab_size, &v);
  v.bos = bos;
  v.eos = eos;
  v.add_bos = bos >= 0;
  return v;
}

absl::StatusOr<GgufVocab> SentencePieceGgufVocab(const std::string& model_bytes,
                                                 const std::string& path, int64_t vocab_size,
                                                 int64_t bos, int64_t eos) {
  GgufVocab v;
  v.model = "llama";
  int64_t model_type = 1;  // the trainer's default, unigram
  if (!ParseModelProto(model_bytes, &v, &model_type) || v.tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a SentencePiece model (no pieces could be read)"));
  }
  const auto n = static_cast<int64_t>(v.tokens.size());
  if (n > vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", n, " pieces, more than the model's ", vocab_size,
                     " ids: this is not the tokenizer the model was trained with"));
  }
  for (int64_t id = 0; id < n; ++id) {
    if (v.types[id] == GgufTokenType::kUnknown && v.unk < 0) v.unk = id;
  }
  v.bos = bos < n ? bos : -1;
  v.eos = eos < n ? eos : -1;
  v.add_bos = v.bos >= 0;
  if (!v.add_space_prefix) v.add_space_prefix = true;  // the normalizer's default
  if (model_type != 2) {
    v.notes.push_back(
        absl::StrCat(path,
                     " is a unigram SentencePiece model: llama.cpp segments text by merging the "
                     "highest-scored pairs, as BPE does, so some words may be split differently "
                     "from how the model was trained"));
  }
  PadVocab(vocab_size, &v);
  return v;
}

absl::StatusOr<GgufVocab> GgufVocabFromRecord(const nlohmann::json& record, int64_t vocab_size,
                                              const std::string& tokenizer_model,
                                              file::FileSystem* fs) {
  auto field = [&](const char* key) -> std::string {
    auto it = record.is_object() ? record.find(key) : record.end();
    return it != record.end() && it->is_string() ? it->get<std::string>() : "";
  };
  auto id = [&](const char* key) -> int64_t {
    auto it = record.is_object() ? record.find(key) : record.end();
    return it != record.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
  };
  const std::string kind = field("kind");
  if (kind == "byte") {
    if (vocab_size < 256 || std::max(id("bos"), id("eos")) >= vocab_size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the byte tokenizer needs 256 ids and its specials; the model has ", vocab_size));
    }
    return ByteLevelGgufVocab(vocab_size, id("bos"), id("eos"));
  }
  if (kind == "pretokenized") {
    GgufVocab v;
    v.model = "none";
    v.notes.push_back(
        "the model was trained on pre-tokenized data: the file holds no tokenizer, so "
        "llama.cpp takes token ids only");
    return v;
  }
  if (kind != "sentencepiece") {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint's tokenizer is \"", kind.substr(0, 64),
                     "\"; this build exports byte, sentencepiece and pretokenized ones"));
  }
  const std::string recorded = field("model_path"), sha = field("model_sha256");
  const std::string path = tokenizer_model.empty() ? recorded : tokenizer_model;
  if (path.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the model was trained with a SentencePiece tokenizer but the checkpoint records no "
        "path to its model (tokenizer.model_path is empty): pass --tokenizer_model=PATH to "
        "the tokenizer.model the dataset was prepared with",
        sha.empty() ? "" : absl::StrCat(" (SHA-256 ", sha, ")")));
  }
  auto bytes = (fs != nullptr ? fs : file::Posix())->ReadAtMost(path, size_t{1} << 30);
  if (!bytes.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the SentencePiece model the model was trained with cannot be read (",
                     bytes.status().message(), "): pass --tokenizer_model=PATH to the same file"));
  }
  const std::string got = data::Sha256Hex(bytes->data(), bytes->size());
  if (got != sha) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not the SentencePiece model the model was trained with (SHA-256 ",
                     got, ", the checkpoint records ", sha.empty() ? "none" : sha,
                     "): pass --tokenizer_model=PATH to that file"));
  }
  return SentencePieceGgufVocab(*bytes, path, vocab_size, id("bos"), id("eos"));
}

at::Tensor InterleaveRopeRows(const at::Tensor& w, int64_t num_heads) {
  const int64_t rows = w.size(0), K = rows / num_heads;
  // [H, 2, K/2, D] (halves of a head) -> [H, K/2, 2, D] (pairs adjacent).
  return w.reshape({num_heads, 2, K / 2, w.size(1)}).transpose(1, 2).reshape(w.sizes());
}

absl::StatusOr<GgufSummary> WriteGguf(const std::string& path, const ModelConfig& c,
                                      const std::map<std::string, at::Tensor>& parameters,
                                      const std::map<int64_t, at::Tensor>& biases,
                                      const GgufExportOptions& options, file::FileSystem* fs) {
  if (std::string why = UnexpressibleMoe(c, kLlamaCpp); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot export as ", kGguf, ": ", why));
  }
  if (auto s = CheckRoutingBiases(biases, options.drop_routing_bias, kGguf, kLlamaCpp); !s.ok()) {
    return s;
  }
  if (c.num_heads <= 0 || c.d_model % c.num_heads != 0 || (c.d_model / c.num_heads) % 2 != 0) {
    return absl::FailedPreconditionError(absl::StrCat("model.num_heads (", c.num_heads,
                                                      ") must divide model.d_model (", c.d_model,
                                                      ") into heads of an even size"));
  }
  if (auto s = CheckVocab(c, options.vocab); !s.ok()) return s;
  auto planned = TensorPlanner(c, parameters, options).Plan();
  if (!planned.ok()) return planned.status();
  std::vector<PlannedTensor>& tensors = *planned;

  GgufMetadata meta;
  AddModelMetadata(c, options, &meta);
  AddVocabMetadata(options.vocab, &meta);
  std::string head = "GGUF";
  PutU32(&head, kGgufVersion);
  PutU64(&head, tensors.size());
  PutU64(&head, static_cast<uint64_t>(meta.count()));
  head += meta.bytes();
  GgufSummary summary;
  uint64_t offset = 0;
  for (PlannedTensor& p : tensors) {
    p.offset = offset;
    offset += Padded(p.bytes);
    PutString(&head, p.name);
    PutU32(&head, static_cast<uint32_t>(p.value.dim()));
    for (int64_t d = p.value.dim() - 1; d >= 0; --d) PutU64(&head, p.value.size(d));
    PutU32(&head, static_cast<uint32_t>(p.type));
    PutU64(&head, p.offset);
    summary.parameters += p.value.numel();
    if (p.type == GgmlType::kQ8_0 || p.type == GgmlType::kQ4_0) ++summary.quantized_tensors;
  }
  head.append(Padded(head.size()) - head.size(), '\0');
  summary.tensors = static_cast<int64_t>(tensors.size());
  summary.bytes = static_cast<int64_t>(head.size() + offset);

  // All or nothing, never through a link (file/file_system.h); a tensor at
  // a time, so the file is never held whole in memory.
  auto out = (fs != nullptr ? fs : file::Posix())->NewAtomicFile(path);
  if (!out.ok()) return out.status();
  if (auto s = (*out)->Append(head); !s.ok()) return s;
  for (const PlannedTensor& p : tensors) {
    std::string data = TensorData(p);
    if (data.size() != p.bytes) {
      return absl::InternalError(
          absl::StrCat("tensor ", p.name, ": ", data.size(), " bytes, ", p.bytes, " planned"));
    }
    data.append(Padded(data.size()) - data.size(), '\0');
    if (auto s = (*out)->Append(data); !s.ok()) return s;
  }
  if (auto s = (*out)->Commit(); !s.ok()) return s;
  return summary;
}

}  // namespace tally::model
