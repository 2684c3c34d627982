#include "worker/train/model_io.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <openssl/evp.h>

#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/model_flops.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"
#include "worker/model/ggml_quant.h"
#include "worker/model/safetensors.h"
#include "worker/model/transformer.h"
#include "worker/train/checkpoint.h"

namespace tally::train {
namespace {

// Metadata larger than this is not a Tally checkpoint's (they are a few
// hundred bytes); bounds what a hostile file makes the parser allocate.
constexpr size_t kMaxMetadataBytes = 1 << 16;

nlohmann::json ByteTokenizerJson() {
  return {{"kind", data::ByteTokenizer::kName},
          {"vocab_size", data::ByteTokenizer::kVocabSize},
          {"bos", data::ByteTokenizer::kBos},
          {"eos", data::ByteTokenizer::kEos}};
}

absl::StatusOr<int64_t> IntField(const nlohmann::json& j, const char* key, int64_t lo, int64_t hi,
                                 const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < lo ||
      it->get<int64_t>() > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, key, " is missing or outside [", lo, ", ", hi, "]"));
  }
  return it->get<int64_t>();
}

absl::StatusOr<model::ModelConfig> FromModelObject(const nlohmann::json& m) {
  const std::string w = "metadata field model.";
  if (!m.is_object()) return absl::InvalidArgumentError("metadata field model is not an object");
  model::ModelConfig c;
  auto get = [&](const nlohmann::json& j, const char* key, int64_t lo, int64_t hi,
                 const std::string& where, int64_t* out) -> absl::Status {
    auto v = IntField(j, key, lo, hi, where);
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  };
  if (auto s = get(m, "num_layers", 1, 256, w, &c.num_layers); !s.ok()) return s;
  if (auto s = get(m, "d_model", 2, 65536, w, &c.d_model); !s.ok()) return s;
  if (auto s = get(m, "num_heads", 1, 1024, w, &c.num_heads); !s.ok()) return s;
  if (auto s = get(m, "d_ff", 1, 1 << 20, w, &c.d_ff); !s.ok()) return s;
  if (auto s = get(m, "vocab_size", 1, 1 << 22, w, &c.vocab_size); !s.ok()) return s;
  for (auto [key, out] :
       {std::pair{"rope_theta", &c.rope_theta}, std::pair{"norm_eps", &c.norm_eps}}) {
    auto it = m.find(key);
    if (it == m.end() || !it->is_number() || !(it->get<double>() > 0) ||
        !std::isfinite(it->get<double>())) {
      return absl::InvalidArgumentError(absl::StrCat(w, key, " is missing or not positive"));
    }
    *out = it->get<double>();
  }
  if (c.d_model % c.num_heads != 0 || (c.d_model / c.num_heads) % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(w, "num_heads (", c.num_heads,
                                                   ") does not divide d_model (", c.d_model,
                                                   ") into heads of an even size"));
  }
  auto moe = m.find("moe");
  if (moe != m.end() && !moe->is_null()) {
    const std::string mw = w + "moe.";
    if (!moe->is_object()) return absl::InvalidArgumentError(mw + " is not an object");
    if (auto s = get(*moe, "num_experts", 0, 1024, mw, &c.moe.num_experts); !s.ok()) return s;
    if (c.moe.num_experts > 0) {
      if (auto s = get(*moe, "top_k", 1, c.moe.num_experts, mw, &c.moe.top_k); !s.ok()) return s;
      if (auto s = get(*moe, "every_n_layers", 1, c.num_layers, mw, &c.moe.every_n_layers);
          !s.ok()) {
        return s;
      }
      auto flag = [&](const char* key) {
        auto it = moe->find(key);
        return it != moe->end() && it->is_boolean() && it->get<bool>();
      };
      c.moe.shared_expert = flag("shared_expert");
      c.moe.sigmoid_router = flag("sigmoid_router");
      auto cap = moe->find("capacity_factor");
      if (cap != moe->end() && cap->is_number() && std::isfinite(cap->get<double>()) &&
          cap->get<double>() >= 0) {
        c.moe.capacity_factor = cap->get<double>();
      }
    }
  }
  return c;
}

// Checkpoints written before "model" was recorded: the fingerprint
// ("layers=2 d_model=64 heads=4 d_ff=192 vocab=258 seq_len=... moe=4x2/
// every1/softmax/cap0 ...").
absl::StatusOr<model::ModelConfig> FromFingerprint(const std::string& f) {
  std::map<std::string, std::string> kv;
  for (absl::string_view part : absl::StrSplit(f, ' ', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    if (eq != absl::string_view::npos) {
      kv[std::string(part.substr(0, eq))] = std::string(part.substr(eq + 1));
    }
  }
  model::ModelConfig c;
  auto num = [&](const char* key, int64_t* out) {
    auto it = kv.find(key);
    return it != kv.end() && absl::SimpleAtoi(it->second, out) && *out > 0;
  };
  if (!num("layers", &c.num_layers) || !num("d_model", &c.d_model) || !num("heads", &c.num_heads) ||
      !num("d_ff", &c.d_ff) || !num("vocab", &c.vocab_size) || c.d_model % c.num_heads != 0) {
    return absl::InvalidArgumentError(
        "metadata has neither a model field nor a fingerprint naming layers, d_model, heads, "
        "d_ff and vocab");
  }
  auto moe = kv.find("moe");
  if (moe != kv.end()) {
    // EXK/everyN[/shared]/softmax|sigmoid/capC
    std::vector<std::string> parts = absl::StrSplit(moe->second, '/');
    std::vector<std::string> ek =
        parts.empty() ? std::vector<std::string>{} : absl::StrSplit(parts[0], 'x');
    if (ek.size() != 2 || !absl::SimpleAtoi(ek[0], &c.moe.num_experts) ||
        !absl::SimpleAtoi(ek[1], &c.moe.top_k)) {
      return absl::InvalidArgumentError("metadata fingerprint: moe= is unreadable");
    }
    for (size_t i = 1; i < parts.size(); ++i) {
      const std::string& p = parts[i];
      if (p.rfind("every", 0) == 0) {
        if (!absl::SimpleAtoi(p.substr(5), &c.moe.every_n_layers)) {
          return absl::InvalidArgumentError("metadata fingerprint: moe every is unreadable");
        }
      } else if (p == "shared") {
        c.moe.shared_expert = true;
      } else if (p == "sigmoid") {
        c.moe.sigmoid_router = true;
      } else if (p.rfind("cap", 0) == 0) {
        if (!absl::SimpleAtod(p.substr(3), &c.moe.capacity_factor)) {
          return absl::InvalidArgumentError("metadata fingerprint: moe cap is unreadable");
        }
      }
    }
  }
  return c;
}

// The SHA-256 (lower-case hex) of a file, read in 1 MiB pieces.
absl::StatusOr<std::string> FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return absl::InternalError(absl::StrCat("cannot read ", path));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &n);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) return absl::InternalError(absl::StrCat("writing ", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("renaming ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

// GPT-2's byte-to-character table (Hugging Face tokenizers' ByteLevel): the
// printable bytes map to themselves, the rest to U+0100 onwards.
std::string ByteChar(int b) {
  int code = b;
  if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
    int n = 0;
    for (int x = 0; x < b; ++x) {
      if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
    }
    code = 256 + n;
  }
  std::string s;
  if (code < 0x80) {
    s.push_back(static_cast<char>(code));
  } else {
    s.push_back(static_cast<char>(0xC0 | (code >> 6)));
    s.push_back(static_cast<char>(0x80 | (code & 0x3F)));
  }
  return s;
}

// The byte vocabulary as Hugging Face tokenizer files: a byte-level BPE
// without merges (every byte its own token, id = byte value), <s> = BOS and
// </s> = EOS as added special tokens, BOS prepended to every encoded text.
absl::Status WriteByteTokenizer(const std::string& dir, int64_t seq_len) {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int b = 0; b < 256; ++b) vocab[ByteChar(b)] = b;
  auto special = [](int id, const char* content) {
    return nlohmann::ordered_json{{"id", id},        {"content", content}, {"single_word", false},
                                  {"lstrip", false}, {"rstrip", false},    {"normalized", false},
                                  {"special", true}};
  };
  nlohmann::ordered_json t;
  t["version"] = "1.0";
  t["truncation"] = nullptr;
  t["padding"] = nullptr;
  t["added_tokens"] = {special(data::ByteTokenizer::kBos, "<s>"),
                       special(data::ByteTokenizer::kEos, "</s>")};
  t["normalizer"] = nullptr;
  t["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", false},
                        {"use_regex", false}};
  nlohmann::ordered_json bos = {{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}};
  t["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", {bos, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
      {"pair",
       {bos,
        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
        bos,
        {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
      {"special_tokens",
       {{"<s>", {{"id", "<s>"}, {"ids", {data::ByteTokenizer::kBos}}, {"tokens", {"<s>"}}}}}}};
  t["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", false},
                  {"trim_offsets", false},
                  {"use_regex", false}};
  t["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", nlohmann::ordered_json::array()}};
  if (auto s = WriteText(dir + "/tokenizer.json", t.dump(1)); !s.ok()) return s;
  nlohmann::ordered_json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                   {"bos_token", "<s>"},
                                   {"eos_token", "</s>"},
                                   {"model_max_length", seq_len},
                                   {"clean_up_tokenization_spaces", false}};
  if (auto s = WriteText(dir + "/tokenizer_config.json", config.dump(1)); !s.ok()) return s;
  nlohmann::ordered_json map = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  return WriteText(dir + "/special_tokens_map.json", map.dump(1));
}

}  // namespace

nlohmann::json ModelConfigJson(const model::ModelConfig& c) {
  nlohmann::json j = {{"num_layers", c.num_layers}, {"d_model", c.d_model},
                      {"num_heads", c.num_heads},   {"d_ff", ResolveDff(c.d_model, c.d_ff)},
                      {"vocab_size", c.vocab_size}, {"rope_theta", c.rope_theta},
                      {"norm_eps", c.norm_eps}};
  if (c.moe.num_experts > 0) {
    j["moe"] = {
        {"num_experts", c.moe.num_experts},       {"top_k", c.moe.top_k},
        {"every_n_layers", c.moe.every_n_layers}, {"shared_expert", c.moe.shared_expert},
        {"sigmoid_router", c.moe.sigmoid_router}, {"capacity_factor", c.moe.capacity_factor}};
  }
  return j;
}

absl::StatusOr<model::ModelConfig> ModelConfigFromMetadata(const nlohmann::json& meta) {
  if (!meta.is_object()) return absl::InvalidArgumentError("metadata is not a JSON object");
  auto m = meta.find("model");
  if (m != meta.end()) return FromModelObject(*m);
  auto fp = meta.find("fingerprint");
  if (fp == meta.end() || !fp->is_string()) {
    return absl::InvalidArgumentError("metadata has neither a model field nor a fingerprint");
  }
  return FromFingerprint(fp->get<std::string>());
}

absl::StatusOr<CheckpointModel> ReadCheckpointModel(const std::string& path,
                                                    const std::string& expected_sha256) {
  auto data = ReadCheckpoint(path, expected_sha256);
  if (!data.ok()) return data.status();
  auto in_file = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  if (data->metadata_json.size() > kMaxMetadataBytes) {
    return in_file(absl::InvalidArgumentError("metadata is too large for a Tally checkpoint"));
  }
  const nlohmann::json meta = nlohmann::json::parse(data->metadata_json, nullptr, false);
  if (meta.is_discarded()) return in_file(absl::InvalidArgumentError("metadata is not JSON"));
  CheckpointModel m;
  m.path = path;
  m.sha256 = data->sha256;
  auto config = ModelConfigFromMetadata(meta);
  if (!config.ok()) return in_file(config.status());
  m.config = *config;
  auto step = IntField(meta, "step", 0, int64_t{1} << 50, "metadata field ");
  if (!step.ok()) return in_file(step.status());
  m.step = *step;
  auto sl = meta.find("seq_len");
  if (sl != meta.end() && sl->is_number_integer() && sl->get<int64_t>() > 0) {
    m.seq_len = sl->get<int64_t>();
  } else if (auto fp = meta.find("fingerprint"); fp != meta.end() && fp->is_string()) {
    for (absl::string_view part : absl::StrSplit(fp->get<std::string>(), ' ')) {
      int64_t v = 0;
      if (absl::ConsumePrefix(&part, "seq_len=") && absl::SimpleAtoi(part, &v)) m.seq_len = v;
    }
  }
  auto tok = meta.find("tokenizer");
  m.tokenizer = tok != meta.end() && tok->is_object() ? *tok : ByteTokenizerJson();
  if (auto qat = meta.find("qat"); qat != meta.end()) {
    const auto text = [&](const char* key) {
      auto it = qat->is_object() ? qat->find(key) : qat->end();
      return it != qat->end() && it->is_string() ? it->get<std::string>() : std::string();
    };
    const auto format = model::ParseGgmlQuant(text("format"));
    const auto layers = model::ParseQuantLayers(text("layers"));
    if (!format || !layers) {
      return in_file(absl::InvalidArgumentError(absl::StrCat(
          "metadata field qat must be {\"format\": \"q8_0\"|\"q4_0\", \"layers\": "
          "\"ffn\"|\"all_linear\"}, got ", qat->dump().substr(0, 200))));
    }
    m.qat = model::WeightQuantization{*format, *layers};
  }
  for (const auto& [name, t] : data->tensors) {
    if (absl::StartsWith(name, "model.")) {
      if (t.scalar_type() != at::kFloat) {
        return in_file(absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is ",
                                                               c10::toString(t.scalar_type()),
                                                               " (model weights are Float)")));
      }
      m.parameters[name.substr(6)] = t;
    } else if (absl::StartsWith(name, "moe.layers.") && absl::EndsWith(name, ".bias")) {
      int64_t layer = -1;
      if (!absl::SimpleAtoi(name.substr(11, name.size() - 16), &layer) || layer < 0 ||
          layer >= m.config.num_layers) {
        return in_file(absl::InvalidArgumentError(
            absl::StrCat("tensor ", name, " names no layer of the model")));
      }
      m.biases[layer] = t;
    }
  }
  // Every parameter of the config, of its shape, before anything of the
  // config's size is built from it.
  for (const auto& [name, shape] : model::ParameterShapes(m.config)) {
    auto it = m.parameters.find(name);
    if (it == m.parameters.end()) {
      return in_file(
          absl::InvalidArgumentError(absl::StrCat("tensor model.", name,
                                                  " is missing for the model its metadata "
                                                  "describes")));
    }
    if (it->second.sizes().vec() != shape) {
      return in_file(absl::InvalidArgumentError(absl::StrCat(
          "tensor model.", name, " is [", absl::StrJoin(it->second.sizes(), ", "),
          "], the model its metadata describes has [", absl::StrJoin(shape, ", "), "]")));
    }
    if (!at::isfinite(it->second).all().item<bool>()) {
      return in_file(absl::InvalidArgumentError(absl::StrCat(
          "tensor model.", name,
          " holds NaN or infinite values; export or start from an earlier checkpoint")));
    }
  }
  for (const auto& [layer, bias] : m.biases) {
    if (!at::isfinite(bias).all().item<bool>()) {
      return in_file(absl::InvalidArgumentError(absl::StrCat(
          "tensor moe.layers.", layer,
          ".bias holds NaN or infinite values; export or start from an earlier checkpoint")));
    }
  }
  return m;
}

absl::StatusOr<ExportSummary> ExportHf(const CheckpointModel& m, const std::string& out_dir,
                                       const model::HfExportOptions& given) {
  model::HfExportOptions options = given;
  auto field = [&](const char* key) -> std::string {
    auto it = m.tokenizer.is_object() ? m.tokenizer.find(key) : m.tokenizer.end();
    return it != m.tokenizer.end() && it->is_string() ? it->get<std::string>() : "";
  };
  auto id = [&](const char* key) -> int64_t {
    auto it = m.tokenizer.is_object() ? m.tokenizer.find(key) : m.tokenizer.end();
    return it != m.tokenizer.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
  };
  const std::string kind = field("kind");
  std::string spm_model;  // the SentencePiece model's bytes
  if (kind == "sentencepiece") {
    const std::string path =
        options.tokenizer_model.empty() ? field("model_path") : options.tokenizer_model;
    if (path.empty()) {
      // Nothing to open, and nothing to name: say what is missing instead.
      return absl::FailedPreconditionError(absl::StrCat(
          "the model was trained with a SentencePiece tokenizer but the checkpoint records no "
          "path to its model (tokenizer.model_path is empty): pass --tokenizer_model=PATH to "
          "the tokenizer.model the dataset was prepared with",
          field("model_sha256").empty() ? ""
                                        : absl::StrCat(" (SHA-256 ", field("model_sha256"), ")")));
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      const std::string recorded = field("model_path");
      return absl::FailedPreconditionError(absl::StrCat(
          recorded.empty()
              ? "the model was trained with a SentencePiece model whose path the checkpoint "
                "does not record; --tokenizer_model "
              : absl::StrCat("the model was trained with the SentencePiece model ", recorded,
                             ", which cannot be read"),
          recorded.empty() ? path + " cannot be read"
          : path != recorded ? " (nor " + path + ")"
                             : "",
          ": pass --tokenizer_model=PATH to the same file"));
    }
    std::stringstream bytes;
    bytes << in.rdbuf();
    spm_model = bytes.str();
    const std::string sha = data::Sha256Hex(spm_model.data(), spm_model.size());
    if (sha != field("model_sha256")) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, " is not the SentencePiece model the model was trained with (SHA-256 ",
                       sha, ", the checkpoint records ",
                       field("model_sha256").empty() ? "none" : field("model_sha256"),
                       "): pass --tokenizer_model=PATH to that file"));
    }
  } else if (kind != data::ByteTokenizer::kName && kind != "pretokenized") {
    return absl::FailedPreconditionError(
        absl::StrCat("the checkpoint's tokenizer is \"", kind.substr(0, 64),
                     "\"; this build exports byte, sentencepiece and pretokenized ones"));
  }
  options.bos = id("bos");
  options.eos = id("eos");
  if (m.seq_len > 0) options.max_position_embeddings = m.seq_len;
  auto config = model::HfConfig(m.config, options);
  if (!config.ok()) return config.status();
  auto tensors = model::ToHfTensors(m.config, m.parameters, m.biases, options);
  if (!tensors.ok()) return tensors.status();
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create --out ", out_dir, ": ", ec.message()));
  }
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"source", m.path}, {"step", std::to_string(m.step)}};
  const std::string weights = out_dir + "/model.safetensors";
  if (auto s = model::WriteSafetensors(weights, *tensors, options.dtype, meta); !s.ok()) {
    return s;
  }
  if (auto s = WriteText(out_dir + "/config.json", config->dump(2) + "\n"); !s.ok()) return s;
  nlohmann::ordered_json gen = nlohmann::ordered_json::object();
  if (options.bos >= 0) gen["bos_token_id"] = options.bos;
  if (options.eos >= 0) gen["eos_token_id"] = options.eos;
  if (auto s = WriteText(out_dir + "/generation_config.json", gen.dump(2) + "\n"); !s.ok()) {
    return s;
  }
  // A folder exported into before may hold another tokenizer's files, which
  // a loader would prefer (tokenizer.json over tokenizer.model): remove them.
  for (const char* stale : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                            "special_tokens_map.json"}) {
    std::filesystem::remove(out_dir + "/" + stale, ec);
  }
  if (kind == data::ByteTokenizer::kName) {
    if (auto s = WriteByteTokenizer(out_dir, m.seq_len > 0 ? m.seq_len : 2048); !s.ok()) return s;
  } else if (kind == "sentencepiece") {
    // The model file itself, read by LlamaTokenizer (and its fast twin).
    if (auto s = WriteText(out_dir + "/tokenizer.model", spm_model); !s.ok()) return s;
    nlohmann::ordered_json config = {{"tokenizer_class", "LlamaTokenizer"},
                                     {"add_bos_token", options.bos >= 0},
                                     {"add_eos_token", false},
                                     {"model_max_length", m.seq_len > 0 ? m.seq_len : 2048},
                                     {"clean_up_tokenization_spaces", false},
                                     {"legacy", false}};
    if (auto s = WriteText(out_dir + "/tokenizer_config.json", config.dump(1)); !s.ok()) {
      return s;
    }
  }
  // Pre-tokenized data: no tokenizer is known here; the ids are the user's.
  ExportSummary out;
  out.architecture = (*config)["architectures"][0].get<std::string>();
  out.tensors = static_cast<int64_t>(tensors->size());
  for (const auto& [name, t] : *tensors) out.parameters += t.numel();
  out.bytes = static_cast<int64_t>(std::filesystem::file_size(weights, ec));
  return out;
}

absl::StatusOr<InitialWeights> ReadInitialWeights(const std::string& hf_dir,
                                                  const std::string& checkpoint) {
  InitialWeights w;
  if (!hf_dir.empty()) {
    auto hf = model::ReadHfFolder(hf_dir);
    if (!hf.ok()) return hf.status();
    w.source = hf_dir + "/config.json";
    w.config = hf->config;
    w.parameters = std::move(hf->parameters);
    auto sha = FileSha256(hf_dir + "/model.safetensors");
    w.provenance = {{"kind", "hf"}, {"path", hf_dir}, {"sha256", sha.ok() ? *sha : ""}};
    return w;
  }
  auto m = ReadCheckpointModel(checkpoint);
  if (!m.ok()) return m.status();
  w.source = checkpoint;
  w.config = m->config;
  w.tokenizer = m->tokenizer;
  w.parameters = std::move(m->parameters);
  w.biases = std::move(m->biases);
  w.provenance = {
      {"kind", "checkpoint"}, {"path", checkpoint}, {"sha256", m->sha256}, {"step", m->step}};
  return w;
}

std::string ShapeString(const model::ModelConfig& c) {
  std::string s = absl::StrCat("layers=", c.num_layers, " d_model=", c.d_model,
                               " heads=", c.num_heads, " d_ff=", ResolveDff(c.d_model, c.d_ff),
                               " vocab=", c.vocab_size);
  if (c.moe.num_experts > 0) {
    absl::StrAppend(&s, " moe=", c.moe.num_experts, "x", c.moe.top_k, "/every",
                    std::max<int64_t>(1, c.moe.every_n_layers),
                    c.moe.shared_expert ? "/shared" : "");
  }
  return s;
}

absl::Status UpcycleWeights(double noise_std, uint64_t seed, model::ModelConfig* target,
                            InitialWeights* w) {
  const model::ModelConfig& src = w->config;
  auto refuse = [&](absl::string_view why) {
    model::ModelConfig shown = *target;
    if (shown.vocab_size == 0) shown.vocab_size = src.vocab_size;
    return absl::FailedPreconditionError(absl::StrCat(
        "model.init_from.upcycle: ", w->source, " (", ShapeString(src),
        ") cannot become this job's model (", ShapeString(shown), "): ", why));
  };
  if (src.moe.num_experts > 0) {
    return refuse(
        "it is already Mixture-of-Experts; upcycling starts from a dense model (remove "
        "upcycle to continue the MoE model as it is)");
  }
  if (target->moe.num_experts < 2) {
    return refuse("set model.moe.num_experts to 2 or more");
  }
  if (target->moe.top_k < 2 || target->moe.shared_expert) {
    return refuse("upcycling needs model.moe.top_k >= 2 and no shared expert");
  }
  // The shape, MoE aside, must be the source's.
  model::ModelConfig dense = *target;
  dense.moe = src.moe;
  if (absl::Status s = ReconcileModel(src, w->source, &dense); !s.ok()) {
    return refuse(s.message());
  }
  const model::MoeConfig moe = target->moe;
  *target = dense;
  target->moe = moe;
  const int64_t E = moe.num_experts;
  const int64_t every = std::max<int64_t>(1, moe.every_n_layers);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed ^ 0x75706379636c65ULL);
  for (int64_t l = 0; l < target->num_layers; ++l) {
    if (l % every != every - 1) continue;
    const std::string p = absl::StrCat("layers.", l, ".");
    for (const char* name : {"w1", "w3", "w2"}) {
      auto it = w->parameters.find(p + name);
      if (it == w->parameters.end()) {
        return refuse(absl::StrCat("it has no dense feed-forward weight ", p, name));
      }
      const at::Tensor dense_w = it->second.to(at::kFloat).contiguous();
      std::vector<at::Tensor> experts;
      for (int64_t e = 0; e < E; ++e) {
        at::Tensor copy = dense_w.clone();
        if (noise_std > 0) {
          copy.add_(at::normal(0.0, noise_std, dense_w.sizes(), gen, dense_w.options()));
        }
        experts.push_back(copy);
      }
      w->parameters.erase(it);
      w->parameters[absl::StrCat(p, "experts.", name)] = at::stack(experts);
    }
    w->keep_init.insert(p + "router");
  }
  w->biases.clear();
  w->provenance["upcycled"] = {{"step", 0},
                               {"noise_std", noise_std},
                               {"num_experts", E},
                               {"top_k", moe.top_k},
                               {"every_n_layers", every}};
  return absl::OkStatus();
}

absl::Status ReconcileModel(const model::ModelConfig& theirs, const std::string& source,
                            model::ModelConfig* spec) {
  auto clash = [&](const char* field, auto ours, auto other) {
    return absl::FailedPreconditionError(
        absl::StrCat("model.init_from: the spec's ", field, " is ", ours, " but ", source, " has ",
                     other, "; leave ", field,
                     " as the model it starts from has it (or remove it, where it may "
                     "be left unset)"));
  };
  if (spec->num_layers != theirs.num_layers) {
    return clash("model.num_layers", spec->num_layers, theirs.num_layers);
  }
  if (spec->d_model != theirs.d_model) return clash("model.d_model", spec->d_model, theirs.d_model);
  if (spec->num_heads != theirs.num_heads) {
    return clash("model.num_heads", spec->num_heads, theirs.num_heads);
  }
  const int64_t their_ff = ResolveDff(theirs.d_model, theirs.d_ff);
  if (spec->d_ff != 0 && spec->d_ff != their_ff) return clash("model.d_ff", spec->d_ff, their_ff);
  if (spec->vocab_size != 0 && spec->vocab_size != theirs.vocab_size) {
    return clash("model.vocab_size", spec->vocab_size, theirs.vocab_size);
  }
  const model::MoeConfig& a = spec->moe;
  const model::MoeConfig& b = theirs.moe;
  if (a.num_experts != b.num_experts) {
    return clash("model.moe.num_experts", a.num_experts, b.num_experts);
  }
  if (b.num_experts > 0) {
    if (a.top_k != b.top_k) return clash("model.moe.top_k", a.top_k, b.top_k);
    if (std::max<int64_t>(1, a.every_n_layers) != b.every_n_layers) {
      return clash("model.moe.every_n_layers", a.every_n_layers, b.every_n_layers);
    }
    if (a.shared_expert != b.shared_expert) {
      return clash("model.moe.shared_expert", a.shared_expert, b.shared_expert);
    }
    if (a.sigmoid_router != b.sigmoid_router) {
      return clash("model.moe.router", a.sigmoid_router ? "sigmoid" : "softmax",
                   b.sigmoid_router ? "sigmoid" : "softmax");
    }
  }
  spec->d_ff = their_ff;
  spec->vocab_size = theirs.vocab_size;
  spec->rope_theta = theirs.rope_theta;
  spec->norm_eps = theirs.norm_eps;
  return absl::OkStatus();
}

}  // namespace tally::train
