#include "worker/model/gguf.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/support/file/fault_injection_file_system.h"
#include "worker/data/dataset.h"
#include "worker/model/ggml_quant.h"
#include "worker/model/hf.h"
#include "worker/model/transformer.h"

namespace tally::model {
namespace {

std::string TempPath(const std::string& name) {
  static const std::string dir = [] {
    char t[] = "/tmp/tally_gguf_test_XXXXXX";
    return std::string(mkdtemp(t));
  }();
  return dir + "/" + name;
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// A GGUF file read back by this test's own reader, from the format's
// description (GGUF v3), not from the writer's code.
struct Kv {
  uint32_t type = 0;  // GGUF's value type
  uint64_t u = 0;     // uint32, bool
  double f = 0;       // float32
  std::string s;      // string
  uint32_t element = 0;
  std::vector<std::string> strings;
  std::vector<double> numbers;  // float32 or int32 elements
};
struct Info {
  std::string name;
  std::vector<uint64_t> ne;
  uint32_t type = 0;
  uint64_t offset = 0;
};
struct GgufFile {
  uint32_t version = 0;
  std::map<std::string, Kv> kv;
  std::vector<std::string> keys;  // in file order
  std::vector<Info> infos;
  uint64_t data_start = 0;
  std::string bytes;

  const Info* Find(const std::string& name) const {
    for (const Info& i : infos) {
      if (i.name == name) return &i;
    }
    return nullptr;
  }
  std::string Data(const Info& i, uint64_t n) const {
    return bytes.substr(data_start + i.offset, n);
  }
};

class Reader {
 public:
  explicit Reader(const std::string& b) : b_(b) {}
  uint64_t U(int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) {
      v |= static_cast<uint64_t>(static_cast<uint8_t>(b_.at(at_ + i))) << (8 * i);
    }
    at_ += n;
    return v;
  }
  double F32() {
    const auto bits = static_cast<uint32_t>(U(4));
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  std::string Str() {
    const uint64_t n = U(8);
    std::string s = b_.substr(at_, n);
    at_ += n;
    return s;
  }
  size_t at() const { return at_; }

 private:
  const std::string& b_;
  size_t at_ = 0;
};

GgufFile ReadGguf(const std::string& path) {
  GgufFile g;
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  g.bytes = ss.str();
  Reader r(g.bytes);
  EXPECT_EQ(g.bytes.substr(0, 4), "GGUF");
  r.U(4);
  g.version = static_cast<uint32_t>(r.U(4));
  const uint64_t tensors = r.U(8), kvs = r.U(8);
  for (uint64_t i = 0; i < kvs; ++i) {
    const std::string key = r.Str();
    Kv v;
    v.type = static_cast<uint32_t>(r.U(4));
    if (v.type == 4) v.u = r.U(4);
    if (v.type == 7) v.u = r.U(1);
    if (v.type == 6) v.f = r.F32();
    if (v.type == 8) v.s = r.Str();
    if (v.type == 9) {
      v.element = static_cast<uint32_t>(r.U(4));
      const uint64_t n = r.U(8);
      for (uint64_t k = 0; k < n; ++k) {
        if (v.element == 8) v.strings.push_back(r.Str());
        if (v.element == 6) v.numbers.push_back(r.F32());
        if (v.element == 5) v.numbers.push_back(static_cast<int32_t>(r.U(4)));
      }
    }
    EXPECT_TRUE(v.type == 4 || v.type == 6 || v.type == 7 || v.type == 8 || v.type == 9) << key;
    g.keys.push_back(key);
    g.kv[key] = v;
  }
  for (uint64_t i = 0; i < tensors; ++i) {
    Info t;
    t.name = r.Str();
    const uint64_t dims = r.U(4);
    for (uint64_t d = 0; d < dims; ++d) t.ne.push_back(r.U(8));
    t.type = static_cast<uint32_t>(r.U(4));
    t.offset = r.U(8);
    g.infos.push_back(t);
  }
  g.data_start = (r.at() + 31) / 32 * 32;
  return g;
}

uint64_t Numel(const Info& i) {
  uint64_t n = 1;
  for (uint64_t d : i.ne) n *= d;
  return n;
}

uint64_t Bytes(const Info& i) {
  switch (i.type) {
    case 0:
      return 4 * Numel(i);
    case 1:
      return 2 * Numel(i);
    case 8:
      return Numel(i) / 32 * 34;
    case 2:
      return Numel(i) / 32 * 18;
  }
  ADD_FAILURE() << "type " << i.type;
  return 0;
}

// A tensor's values from its bytes, in FP32, shape = ne reversed; Q8_0 and
// Q4_0 dequantized from the block layout (fp16 d, then 32 int8, or 16 bytes
// of nibbles: low weight j, high weight j + 16, value (q - 8) * d).
at::Tensor Values(const GgufFile& g, const Info& i) {
  const std::string d = g.Data(i, Bytes(i));
  std::vector<int64_t> shape(i.ne.rbegin(), i.ne.rend());
  const auto n = static_cast<int64_t>(Numel(i));
  if (i.type == 0 || i.type == 1) {
    at::Tensor t = at::empty({n}, i.type == 0 ? at::kFloat : at::kHalf);
    std::memcpy(t.data_ptr(), d.data(), d.size());
    return t.to(at::kFloat).reshape(shape);
  }
  at::Tensor t = at::empty({n}, at::kFloat);
  float* out = t.data_ptr<float>();
  const size_t block = i.type == 8 ? 34 : 18;
  for (int64_t b = 0; b < n / 32; ++b) {
    const char* p = d.data() + b * block;
    at::Half scale;
    std::memcpy(&scale.x, p, 2);
    const float s = static_cast<float>(scale);
    for (int j = 0; j < 32; ++j) {
      if (i.type == 8) {
        out[b * 32 + j] = static_cast<float>(static_cast<int8_t>(p[2 + j])) * s;
      } else {
        const auto q = static_cast<uint8_t>(p[2 + j % 16]);
        out[b * 32 + j] = static_cast<float>((j < 16 ? q & 0xF : q >> 4) - 8) * s;
      }
    }
  }
  return t.reshape(shape);
}

// llama.cpp's row order of a q or k projection, by index, not by reshapes:
// head h's row 2j is Tally's h*K + j, row 2j + 1 Tally's h*K + j + K/2.
at::Tensor Interleaved(const at::Tensor& w, int64_t heads) {
  const int64_t K = w.size(0) / heads;
  std::vector<int64_t> rows;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < K / 2; ++j) {
      rows.push_back(h * K + j);
      rows.push_back(h * K + j + K / 2);
    }
  }
  return w.index_select(0, at::tensor(rows, at::kLong));
}

// The inverse: Tally's rows from llama.cpp's.
at::Tensor Deinterleaved(const at::Tensor& w, int64_t heads) {
  const int64_t K = w.size(0) / heads;
  at::Tensor out = at::empty_like(w);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t j = 0; j < K / 2; ++j) {
      out[h * K + j] = w[h * K + 2 * j];
      out[h * K + j + K / 2] = w[h * K + 2 * j + 1];
    }
  }
  return out;
}

ModelConfig Small(int64_t experts) {
  ModelConfig c;
  c.num_layers = 2;
  c.d_model = 64;
  c.num_heads = 4;
  c.vocab_size = 260;  // the byte tokenizer's 258, and two unused
  c.moe.num_experts = experts;
  c.moe.top_k = 2;
  return c;
}

std::map<std::string, at::Tensor> ParamsOf(const ModelConfig& c, uint64_t seed) {
  Transformer m(c, seed, at::kCPU);
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.parameters()) out[p.name] = p.value.detach().clone();
  // Norm gains other than 1, so that a misplaced one shows.
  for (auto& [name, t] : out) {
    if (t.dim() == 1) t.uniform_(0.5, 1.5);
  }
  return out;
}

GgufExportOptions Options(const ModelConfig& c, std::optional<GgmlQuant> quant,
                          QuantLayers layers = QuantLayers::kFfn) {
  GgufExportOptions o;
  o.quant = quant;
  o.quant_layers = layers;
  o.name = "tiny";
  o.context_length = 128;
  o.vocab = ByteLevelGgufVocab(c.vocab_size, 256, 257);
  return o;
}

TEST(Gguf, WritesTheLlamaLayoutHeaderAndMetadata) {
  const ModelConfig c = Small(0);
  const auto params = ParamsOf(c, 1);
  const std::string path = TempPath("f16.gguf");
  auto s = WriteGguf(path, c, params, {}, Options(c, std::nullopt));
  ASSERT_TRUE(s.ok()) << s.status();
  const GgufFile g = ReadGguf(path);
  EXPECT_EQ(g.version, 3u);
  EXPECT_EQ(g.kv.at("general.architecture").s, "llama");
  EXPECT_EQ(g.kv.at("general.name").s, "tiny");
  EXPECT_EQ(g.keys[0], "general.architecture");
  const std::map<std::string, uint64_t> u32 = {{"general.alignment", 32},
                                               {"general.file_type", 1},
                                               {"llama.vocab_size", 260},
                                               {"llama.context_length", 128},
                                               {"llama.embedding_length", 64},
                                               {"llama.block_count", 2},
                                               {"llama.feed_forward_length", 192},
                                               {"llama.attention.head_count", 4},
                                               {"llama.attention.head_count_kv", 4},
                                               {"llama.rope.dimension_count", 16},
                                               {"tokenizer.ggml.bos_token_id", 256},
                                               {"tokenizer.ggml.eos_token_id", 257}};
  for (const auto& [key, value] : u32) {
    ASSERT_TRUE(g.kv.count(key)) << key;
    EXPECT_EQ(g.kv.at(key).type, 4u) << key;
    EXPECT_EQ(g.kv.at(key).u, value) << key;
  }
  EXPECT_FLOAT_EQ(g.kv.at("llama.rope.freq_base").f, 10000.0f);
  EXPECT_FLOAT_EQ(g.kv.at("llama.attention.layer_norm_rms_epsilon").f, 1e-5f);
  EXPECT_FALSE(g.kv.count("llama.expert_count"));
  EXPECT_FALSE(g.kv.count("general.quantization_version"));
  // The byte tokenizer: GPT-2's byte characters in id order, no merges.
  EXPECT_EQ(g.kv.at("tokenizer.ggml.model").s, "gpt2");
  EXPECT_EQ(g.kv.at("tokenizer.ggml.pre").s, "default");
  const Kv& tokens = g.kv.at("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.strings.size(), 260u);
  EXPECT_EQ(tokens.strings['a'], "a");
  EXPECT_EQ(tokens.strings[' '], "\xC4\xA0");   // U+0120
  EXPECT_EQ(tokens.strings['\n'], "\xC4\x8A");  // U+010A
  EXPECT_EQ(tokens.strings[0], "\xC4\x80");     // U+0100
  EXPECT_EQ(tokens.strings[127], "\xC4\xA1");   // U+0121
  EXPECT_EQ(tokens.strings[173], "\xC5\x83");   // U+0143
  EXPECT_EQ(tokens.strings[255], "\xC3\xBF");   // U+00FF, printable
  EXPECT_EQ(tokens.strings[256], "<s>");
  EXPECT_EQ(tokens.strings[257], "</s>");
  EXPECT_EQ(tokens.strings[259], "[PAD259]");
  EXPECT_EQ(std::set<std::string>(tokens.strings.begin(), tokens.strings.end()).size(), 260u);
  const Kv& types = g.kv.at("tokenizer.ggml.token_type");
  EXPECT_EQ(types.element, 5u);
  ASSERT_EQ(types.numbers.size(), 260u);
  EXPECT_EQ(types.numbers[65], 1);
  EXPECT_EQ(types.numbers[256], 3);
  EXPECT_EQ(types.numbers[257], 3);
  EXPECT_EQ(types.numbers[258], 5);
  EXPECT_EQ(g.kv.at("tokenizer.ggml.merges").element, 8u);
  EXPECT_TRUE(g.kv.at("tokenizer.ggml.merges").strings.empty());
  EXPECT_EQ(g.kv.at("tokenizer.ggml.add_bos_token").u, 1u);
  EXPECT_EQ(g.kv.at("tokenizer.ggml.add_eos_token").u, 0u);
  EXPECT_EQ(s->tensors, 3 + 2 * 9);
  EXPECT_EQ(s->quantized_tensors, 0);
  EXPECT_EQ(s->bytes, static_cast<int64_t>(g.bytes.size()));
}

TEST(Gguf, TensorsHaveTheirNamesShapesTypesAndAlignedOffsets) {
  const ModelConfig c = Small(0);
  const auto params = ParamsOf(c, 2);
  const std::string path = TempPath("layout.gguf");
  ASSERT_TRUE(WriteGguf(path, c, params, {}, Options(c, GgmlQuant::kQ8_0)).ok());
  const GgufFile g = ReadGguf(path);
  std::vector<std::string> names = {"token_embd.weight"};
  for (int i = 0; i < 2; ++i) {
    for (const char* n : {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                          "ffn_gate", "ffn_up", "ffn_down"}) {
      names.push_back(absl::StrCat("blk.", i, ".", n, ".weight"));
    }
  }
  names.push_back("output_norm.weight");
  names.push_back("output.weight");
  ASSERT_EQ(g.infos.size(), names.size());
  uint64_t offset = 0;
  for (size_t k = 0; k < names.size(); ++k) {
    const Info& i = g.infos[k];
    EXPECT_EQ(i.name, names[k]);
    EXPECT_EQ(i.offset, offset) << i.name;  // in order, each at the next multiple of 32
    EXPECT_EQ(i.offset % 32, 0u) << i.name;
    offset += (Bytes(i) + 31) / 32 * 32;
  }
  EXPECT_EQ(g.data_start % 32, 0u);
  EXPECT_EQ(g.bytes.size(), g.data_start + offset);
  auto ne = [&](const char* n) { return g.Find(n)->ne; };
  auto type = [&](const char* n) { return g.Find(n)->type; };
  EXPECT_EQ(ne("token_embd.weight"), (std::vector<uint64_t>{64, 260}));
  EXPECT_EQ(ne("blk.0.attn_q.weight"), (std::vector<uint64_t>{64, 64}));
  EXPECT_EQ(ne("blk.0.ffn_gate.weight"), (std::vector<uint64_t>{64, 192}));
  EXPECT_EQ(ne("blk.0.ffn_down.weight"), (std::vector<uint64_t>{192, 64}));
  EXPECT_EQ(ne("blk.1.attn_norm.weight"), (std::vector<uint64_t>{64}));
  EXPECT_EQ(type("token_embd.weight"), 1u);
  EXPECT_EQ(type("output.weight"), 1u);
  EXPECT_EQ(type("blk.0.attn_q.weight"), 1u);
  EXPECT_EQ(type("blk.0.attn_output.weight"), 1u);
  EXPECT_EQ(type("blk.0.attn_norm.weight"), 0u);
  EXPECT_EQ(type("output_norm.weight"), 0u);
  EXPECT_EQ(type("blk.1.ffn_gate.weight"), 8u);
  EXPECT_EQ(type("blk.1.ffn_down.weight"), 8u);
  EXPECT_EQ(g.kv.at("general.file_type").u, 7u);
  EXPECT_EQ(g.kv.at("general.quantization_version").u, 2u);
  // F32 and F16 values: exactly the weights, rounded to F16 where F16.
  EXPECT_TRUE(
      at::equal(Values(g, *g.Find("blk.1.ffn_norm.weight")), params.at("layers.1.ffn_norm")));
  EXPECT_TRUE(at::equal(Values(g, *g.Find("output.weight")),
                        params.at("head").to(at::kHalf).to(at::kFloat)));
  EXPECT_TRUE(
      at::equal(Values(g, *g.Find("blk.0.attn_v.weight")),
                params.at("layers.0.wqkv").narrow(0, 128, 64).to(at::kHalf).to(at::kFloat)));
}

// Quantized tensors are PackGgmlBlocks' bytes of the rows llama.cpp reads
// (q and k reordered); dequantized and put back in Tally's order they are
// the weights training computed with (QuantizeDequantize), and F16's q and k
// the F16-rounded originals.
TEST(Gguf, QuantizedBytesArePackGgmlBlocksOfTheReorderedRows) {
  const ModelConfig c = Small(0);
  const auto params = ParamsOf(c, 3);
  const at::Tensor& wqkv = params.at("layers.1.wqkv");
  const at::Tensor q = wqkv.narrow(0, 0, 64), k = wqkv.narrow(0, 64, 64);
  for (GgmlQuant quant : {GgmlQuant::kQ8_0, GgmlQuant::kQ4_0}) {
    for (QuantLayers layers : {QuantLayers::kFfn, QuantLayers::kAllLinear}) {
      SCOPED_TRACE(absl::StrCat(GgmlQuantName(quant), " ", QuantLayersName(layers)));
      const std::string path = TempPath("quant.gguf");
      auto s = WriteGguf(path, c, params, {}, Options(c, quant, layers));
      ASSERT_TRUE(s.ok()) << s.status();
      const bool all = layers == QuantLayers::kAllLinear;
      EXPECT_EQ(s->quantized_tensors, 2 * (all ? 7 : 3));
      const GgufFile g = ReadGguf(path);
      const uint32_t qtype = quant == GgmlQuant::kQ8_0 ? 8 : 2;
      EXPECT_EQ(g.kv.at("general.file_type").u, quant == GgmlQuant::kQ8_0 ? 7u : 2u);
      auto bytes_of = [&](const char* name) {
        const Info* i = g.Find(name);
        EXPECT_EQ(i->type, qtype) << name;
        return g.Data(*i, Bytes(*i));
      };
      EXPECT_EQ(bytes_of("blk.1.ffn_gate.weight"), PackGgmlBlocks(params.at("layers.1.w1"), quant));
      EXPECT_EQ(bytes_of("blk.1.ffn_up.weight"), PackGgmlBlocks(params.at("layers.1.w3"), quant));
      EXPECT_EQ(bytes_of("blk.1.ffn_down.weight"), PackGgmlBlocks(params.at("layers.1.w2"), quant));
      EXPECT_EQ(g.Find("token_embd.weight")->type, 1u);
      EXPECT_EQ(g.Find("output.weight")->type, 1u);
      const Info& iq = *g.Find("blk.1.attn_q.weight");
      const Info& ik = *g.Find("blk.1.attn_k.weight");
      if (!all) {
        EXPECT_EQ(iq.type, 1u);
        EXPECT_EQ(g.Find("blk.1.attn_output.weight")->type, 1u);
        EXPECT_TRUE(at::equal(Deinterleaved(Values(g, iq), 4), q.to(at::kHalf).to(at::kFloat)));
        EXPECT_TRUE(at::equal(Deinterleaved(Values(g, ik), 4), k.to(at::kHalf).to(at::kFloat)));
        continue;
      }
      EXPECT_EQ(bytes_of("blk.1.attn_q.weight"), PackGgmlBlocks(Interleaved(q, 4), quant));
      EXPECT_EQ(bytes_of("blk.1.attn_k.weight"), PackGgmlBlocks(Interleaved(k, 4), quant));
      EXPECT_EQ(bytes_of("blk.1.attn_v.weight"),
                PackGgmlBlocks(wqkv.narrow(0, 128, 64).contiguous(), quant));
      EXPECT_EQ(bytes_of("blk.1.attn_output.weight"),
                PackGgmlBlocks(params.at("layers.1.wo"), quant));
      const at::Tensor trained = QuantizeDequantize(wqkv, quant);
      EXPECT_TRUE(at::equal(Deinterleaved(Values(g, iq), 4), trained.narrow(0, 0, 64)));
      EXPECT_TRUE(at::equal(Deinterleaved(Values(g, ik), 4), trained.narrow(0, 64, 64)));
      EXPECT_TRUE(at::equal(Values(g, *g.Find("blk.1.ffn_down.weight")),
                            QuantizeDequantize(params.at("layers.1.w2"), quant)));
    }
  }
  EXPECT_TRUE(at::equal(InterleaveRopeRows(q, 4), Interleaved(q, 4)));
}

TEST(Gguf, MoeExpertsAreStackedWithAnF32Router) {
  const ModelConfig c = Small(4);
  const auto params = ParamsOf(c, 4);
  const std::string path = TempPath("moe.gguf");
  auto s = WriteGguf(path, c, params, {{0, at::zeros({4})}, {1, at::zeros({4})}},
                     Options(c, GgmlQuant::kQ4_0));
  ASSERT_TRUE(s.ok()) << s.status();
  const GgufFile g = ReadGguf(path);
  EXPECT_EQ(g.kv.at("llama.expert_count").u, 4u);
  EXPECT_EQ(g.kv.at("llama.expert_used_count").u, 2u);
  EXPECT_EQ(g.Find("blk.0.ffn_gate.weight"), nullptr);
  const Info& router = *g.Find("blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(router.ne, (std::vector<uint64_t>{64, 4}));
  EXPECT_EQ(router.type, 0u);
  EXPECT_TRUE(at::equal(Values(g, router), params.at("layers.0.router")));
  EXPECT_EQ(g.Find("blk.1.ffn_gate_exps.weight")->ne, (std::vector<uint64_t>{64, 192, 4}));
  EXPECT_EQ(g.Find("blk.1.ffn_up_exps.weight")->ne, (std::vector<uint64_t>{64, 192, 4}));
  const Info& down = *g.Find("blk.1.ffn_down_exps.weight");
  EXPECT_EQ(down.ne, (std::vector<uint64_t>{192, 64, 4}));
  EXPECT_EQ(down.type, 2u);
  EXPECT_EQ(g.Data(down, Bytes(down)),
            PackGgmlBlocks(params.at("layers.1.experts.w2"), GgmlQuant::kQ4_0));
  // Biases that select differently are refused unless dropped.
  auto biased = WriteGguf(path + "2", c, params, {{1, at::tensor({0.f, 0.5f, 0.f, 0.f})}},
                          Options(c, std::nullopt));
  ASSERT_FALSE(biased.ok());
  EXPECT_NE(biased.status().message().find("layer 1 selects experts with balancing biases"),
            std::string::npos)
      << biased.status();
  EXPECT_NE(biased.status().message().find("--drop_routing_bias"), std::string::npos);
  GgufExportOptions drop = Options(c, std::nullopt);
  drop.drop_routing_bias = true;
  EXPECT_TRUE(
      WriteGguf(path + "2", c, params, {{1, at::tensor({0.f, 0.5f, 0.f, 0.f})}}, drop).ok());
}

TEST(Gguf, RefusesMoeLlamaCppCannotRun) {
  struct Case {
    std::function<void(MoeConfig*)> change;
    std::string message;
  };
  const Case cases[] = {
      {[](MoeConfig* m) { m->sigmoid_router = true; }, "model.moe.router is sigmoid"},
      {[](MoeConfig* m) { m->shared_expert = true; }, "model.moe.shared_expert is on"},
      {[](MoeConfig* m) { m->every_n_layers = 2; }, "model.moe.every_n_layers is 2"},
      {[](MoeConfig* m) { m->capacity_factor = 1.25; }, "model.moe.capacity_factor is 1.25"},
      {[](MoeConfig* m) { m->top_k = 1; }, "model.moe.top_k is 1"},
  };
  for (const Case& k : cases) {
    ModelConfig c = Small(4);
    k.change(&c.moe);
    const std::string path = TempPath("refused.gguf");
    auto s = WriteGguf(path, c, ParamsOf(c, 5), {}, Options(c, std::nullopt));
    ASSERT_FALSE(s.ok()) << k.message;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.status().message().find(k.message), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("llama.cpp's llama architecture"), std::string::npos);
    EXPECT_FALSE(Exists(path));
  }
}

// A weight F16 cannot hold, or NaN, is refused by both exports, naming the
// tensor, the value and where, and no file is left.
TEST(Gguf, RefusesWeightsF16CannotHoldInBothExports) {
  const ModelConfig c = Small(0);
  struct Case {
    std::string tensor;
    float value;
    std::string message;
  };
  const Case cases[] = {
      {"embed", 3e38f, "tensor embed holds a weight of magnitude 3e+38 at [1, 2], above 65504"},
      {"layers.0.wqkv", -70000.f,
       "tensor layers.0.wqkv holds a weight of magnitude 70000 at [1, 2]"},
      {"layers.1.w2", std::nanf(""), "tensor layers.1.w2 holds NaN at [1, 2]"},
      {"final_norm", INFINITY, "tensor final_norm holds an infinite value at [2]"},
  };
  for (const Case& k : cases) {
    auto params = ParamsOf(c, 6);
    at::Tensor t = params.at(k.tensor);
    if (t.dim() == 2) {
      t[1][2] = k.value;
    } else {
      t[2] = k.value;
    }
    const std::string path = TempPath("huge.gguf");
    for (auto quant : {std::optional<GgmlQuant>(), std::optional<GgmlQuant>(GgmlQuant::kQ8_0)}) {
      auto s = WriteGguf(path, c, params, {}, Options(c, quant));
      ASSERT_FALSE(s.ok()) << k.message;
      EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(s.status().message().find(k.message), std::string::npos) << s.status();
      EXPECT_NE(s.status().message().find("export an earlier checkpoint"), std::string::npos);
      EXPECT_FALSE(Exists(path));
      EXPECT_FALSE(Exists(path + ".tmp"));
    }
    auto hf = ToHfTensors(c, params, {}, {});
    ASSERT_FALSE(hf.ok()) << k.message;
    EXPECT_NE(hf.status().message().find(k.message), std::string::npos) << hf.status();
  }
  EXPECT_TRUE(ToHfTensors(c, ParamsOf(c, 6), {}, {}).ok());
  at::Tensor edge = at::full({2, 2}, 65504.0f);
  EXPECT_TRUE(CheckExportableWeight("edge", edge).ok());
  edge[1][1] = -65504.5f;
  EXPECT_FALSE(CheckExportableWeight("edge", edge).ok());
}

TEST(Gguf, QuantizedRowsMustBeWholeBlocks) {
  ModelConfig c = Small(0);
  c.d_ff = 100;
  const auto params = ParamsOf(c, 7);
  const std::string path = TempPath("ragged.gguf");
  auto s = WriteGguf(path, c, params, {}, Options(c, GgmlQuant::kQ8_0));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("tensor layers.0.w2's rows hold 100"), std::string::npos)
      << s.status();
  EXPECT_NE(s.status().message().find("--quant=f16"), std::string::npos);
  EXPECT_FALSE(Exists(path));
  EXPECT_TRUE(WriteGguf(path, c, params, {}, Options(c, std::nullopt)).ok());
}

TEST(Gguf, AFailedWriteLeavesNoFile) {
  const ModelConfig c = Small(0);
  const auto params = ParamsOf(c, 8);
  file::FaultInjectionFileSystem fs(file::Posix());
  const std::string path = TempPath("full-disk.gguf");
  fs.FailAppendsAfter(40000);
  auto s = WriteGguf(path, c, params, {}, Options(c, std::nullopt), &fs);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(Exists(path));
  EXPECT_FALSE(Exists(path + ".tmp"));
  fs.FailAppendsAfter(-1);
  fs.FailCommits(true);
  EXPECT_FALSE(WriteGguf(path, c, params, {}, Options(c, std::nullopt), &fs).ok());
  EXPECT_FALSE(Exists(path));
}

// A SentencePiece ModelProto, encoded here from protobuf's wire format.
std::string Varint(uint64_t v) {
  std::string s;
  do {
    s.push_back(static_cast<char>((v & 0x7F) | (v > 0x7F ? 0x80 : 0)));
    v >>= 7;
  } while (v != 0);
  return s;
}
std::string Field(int field, const std::string& bytes) {
  return Varint(field << 3 | 2) + Varint(bytes.size()) + bytes;
}
std::string Piece(const std::string& text, float score, int type) {
  std::string p = Field(1, text);
  uint32_t bits;
  std::memcpy(&bits, &score, 4);
  p += Varint(2 << 3 | 5);
  for (int i = 0; i < 4; ++i) p.push_back(static_cast<char>(bits >> (8 * i)));
  if (type != 1) p += Varint(3 << 3) + Varint(type);
  return Field(1, p);
}
std::string ModelProto(int model_type, bool dummy_prefix) {
  std::string m = Piece("<unk>", 0, 2) + Piece("<s>", 0, 3) + Piece("</s>", 0, 3) +
                  Piece("<0x0A>", 0, 6) + Piece("\xE2\x96\x81h", -1.5f, 1) + Piece("e", -2, 1) +
                  Piece("<tool>", 0, 4);
  m += Field(2, Varint(3 << 3) + Varint(model_type) + Varint(11 << 3) + Varint(1));
  m += Field(3, Field(1, "nmt_nfkc") + Varint(3 << 3) + Varint(dummy_prefix ? 1 : 0));
  return m;
}

TEST(Gguf, SentencePieceVocabularyFromTheModelFile) {
  auto v = SentencePieceGgufVocab(ModelProto(2, false), "tok.model", 9, 1, 2);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->model, "llama");
  EXPECT_EQ(v->tokens, (std::vector<std::string>{"<unk>", "<s>", "</s>", "<0x0A>", "\xE2\x96\x81h",
                                                 "e", "<tool>", "[PAD7]", "[PAD8]"}));
  EXPECT_EQ(v->scores[4], -1.5f);
  EXPECT_EQ(v->scores[5], -2.0f);
  const std::vector<GgufTokenType> types = {
      GgufTokenType::kUnknown,     GgufTokenType::kControl, GgufTokenType::kControl,
      GgufTokenType::kByte,        GgufTokenType::kNormal,  GgufTokenType::kNormal,
      GgufTokenType::kUserDefined, GgufTokenType::kUnused,  GgufTokenType::kUnused};
  EXPECT_EQ(v->types, types);
  EXPECT_EQ(v->unk, 0);
  EXPECT_EQ(v->bos, 1);
  EXPECT_EQ(v->eos, 2);
  EXPECT_TRUE(v->add_bos);
  EXPECT_EQ(v->add_space_prefix, std::optional<bool>(false));
  EXPECT_TRUE(v->notes.empty());
  // A unigram model: llama.cpp's segmentation may differ, and says so.
  auto unigram = SentencePieceGgufVocab(ModelProto(1, true), "uni.model", 7, 1, 2);
  ASSERT_TRUE(unigram.ok());
  EXPECT_EQ(unigram->add_space_prefix, std::optional<bool>(true));
  ASSERT_EQ(unigram->notes.size(), 1u);
  EXPECT_NE(unigram->notes[0].find("unigram"), std::string::npos);
  // Refused: a vocabulary wider than the model, and bytes that are not one.
  EXPECT_FALSE(SentencePieceGgufVocab(ModelProto(2, true), "tok.model", 6, 1, 2).ok());
  auto junk = SentencePieceGgufVocab("\x0a\xff\xff\xff", "junk.model", 9, 1, 2);
  ASSERT_FALSE(junk.ok());
  EXPECT_NE(junk.status().message().find("junk.model: not a SentencePiece model"),
            std::string::npos);
}

TEST(Gguf, VocabularyFromTheCheckpointsTokenizerRecord) {
  const std::string model = ModelProto(2, true), path = TempPath("tok.model");
  std::ofstream(path, std::ios::binary) << model;
  const std::string sha = data::Sha256Hex(model.data(), model.size());
  nlohmann::json record = {{"kind", "sentencepiece"}, {"vocab_size", 7},    {"bos", 1}, {"eos", 2},
                           {"model_path", path},      {"model_sha256", sha}};
  auto v = GgufVocabFromRecord(record, 8, "");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->tokens.size(), 8u);
  record["model_path"] = TempPath("moved.model");
  auto moved = GgufVocabFromRecord(record, 8, "");
  ASSERT_FALSE(moved.ok());
  EXPECT_NE(moved.status().message().find("--tokenizer_model=PATH"), std::string::npos);
  EXPECT_TRUE(GgufVocabFromRecord(record, 8, path).ok());
  record["model_sha256"] = std::string(64, 'a');
  auto other = GgufVocabFromRecord(record, 8, path);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("is not the SentencePiece model"), std::string::npos);
  record["model_path"] = "";
  auto none = GgufVocabFromRecord(record, 8, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("records no path"), std::string::npos);
  auto bytes = GgufVocabFromRecord({{"kind", "byte"}, {"bos", 256}, {"eos", 257}}, 258, "");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(bytes->model, "gpt2");
  EXPECT_EQ(bytes->tokens.size(), 258u);
  auto ids = GgufVocabFromRecord({{"kind", "pretokenized"}}, 300, "");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(ids->model, "none");
  EXPECT_FALSE(GgufVocabFromRecord({{"kind", "wordpiece"}}, 300, "").ok());
  // Pre-tokenized: the model "none" and the vocabulary's size, no tokens.
  const ModelConfig c = Small(0);
  GgufExportOptions o = Options(c, std::nullopt);
  o.vocab = *ids;
  const std::string file = TempPath("ids.gguf");
  ASSERT_TRUE(WriteGguf(file, c, ParamsOf(c, 9), {}, o).ok());
  const GgufFile g = ReadGguf(file);
  EXPECT_EQ(g.kv.at("tokenizer.ggml.model").s, "none");
  EXPECT_FALSE(g.kv.count("tokenizer.ggml.tokens"));
  EXPECT_EQ(g.kv.at("llama.vocab_size").u, 260u);
  // A vocabulary of another size than the model's is refused.
  o.vocab = ByteLevelGgufVocab(258, 256, 257);
  EXPECT_EQ(WriteGguf(file, c, ParamsOf(c, 9), {}, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tally::model
