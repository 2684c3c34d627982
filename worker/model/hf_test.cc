#include "worker/model/hf.h"

#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "worker/model/safetensors.h"
#include "worker/model/transformer.h"

namespace tally::model {
namespace {

std::string TempPath(const std::string& name) {
  static const std::string dir = [] {
    char t[] = "/tmp/tally_hf_test_XXXXXX";
    return std::string(mkdtemp(t));
  }();
  return dir + "/" + name;
}

void WriteRaw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

TEST(Safetensors, RoundTripsFp32AndBf16) {
  at::manual_seed(1);
  NamedTensors t = {
      {"a", at::randn({3, 5})}, {"b.weight", at::randn({7})}, {"empty", at::zeros({0, 4})}};
  const std::string path = TempPath("rt.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, t, at::kFloat, {{"format", "pt"}}).ok());
  auto back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 3u);
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ((*back)[i].first, t[i].first);
    EXPECT_TRUE(at::equal((*back)[i].second, t[i].second)) << t[i].first;
  }
  ASSERT_TRUE(WriteSafetensors(path, t, at::kBFloat16).ok());
  back = ReadSafetensors(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(at::equal((*back)[0].second, t[0].second.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_FALSE(at::equal((*back)[0].second, t[0].second));
}

TEST(Safetensors, MalformedFilesAreRefusedNamingTheTensor) {
  const std::string f32x2(8, '\0');
  struct Case {
    std::string header, data, message;
    absl::StatusCode code = absl::StatusCode::kDataLoss;
  };
  const Case cases[] = {
      {"not json", "", "not a JSON object"},
      {"[1]", "", "not a JSON object"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", f32x2, "tensor a: 4 bytes"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", f32x2, "outside the data"},
      {R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2, "non-negative"},
      {R"({"a":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", f32x2, "unknown dtype"},
      {R"({"a":{"dtype":"I8","shape":[8],"data_offsets":[0,8]}})", f32x2, "is I8",
       absl::StatusCode::kInvalidArgument},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
       f32x2, "overlaps"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", f32x2, "belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", f32x2, "belong to no tensor"},
      {R"({"a":{"dtype":"F32","shape":[[[[[[1]]]]]],"data_offsets":[0,4]}})", f32x2,
       "nests deeper"},
      {R"({"a":{"dtype":"F32","shape":[1]}})", f32x2, "data_offsets"},
      {R"({"__metadata__":{"k":1}})", "", "__metadata__.k"},
  };
  for (const Case& c : cases) {
    const std::string path = TempPath("bad.safetensors");
    WriteRaw(path, c.header, c.data);
    auto r = ReadSafetensors(path);
    ASSERT_FALSE(r.ok()) << c.header;
    EXPECT_EQ(r.status().code(), c.code) << r.status();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos)
        << r.status() << " wanted " << c.message;
  }
  // A header length past the end of the file.
  const std::string path = TempPath("long.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 1 << 20;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  auto r = ReadSafetensors(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("beyond the file"), std::string::npos) << r.status();
  EXPECT_TRUE(absl::IsNotFound(ReadSafetensors(TempPath("missing")).status()));
}

std::map<std::string, at::Tensor> ParamsOf(const Transformer& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : m.parameters()) out[p.name] = p.value.detach();
  return out;
}

ModelConfig Small(int64_t experts) {
  ModelConfig c;
  c.num_layers = 2;
  c.d_model = 32;
  c.num_heads = 4;
  c.vocab_size = 258;
  c.moe.num_experts = experts;
  c.moe.top_k = 2;
  return c;
}

// Export, read back through config.json's description, build: the same
// weights and the same logits.
TEST(Hf, ExportAndImportRoundTripDenseAndMoe) {
  for (const int64_t experts : {0, 4}) {
    const ModelConfig c = Small(experts);
    Transformer a(c, 3, at::kCPU);
    HfExportOptions o;
    auto config = HfConfig(c, o);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ((*config)["architectures"][0], experts ? "MixtralForCausalLM" : "LlamaForCausalLM");
    auto hf = ToHfTensors(c, ParamsOf(a), {}, o);
    ASSERT_TRUE(hf.ok()) << hf.status();
    auto back_config = ModelConfigFromHf(nlohmann::json::parse(config->dump()), "config.json");
    ASSERT_TRUE(back_config.ok()) << back_config.status();
    auto back = FromHfTensors(*back_config, *hf, false, "model.safetensors");
    ASSERT_TRUE(back.ok()) << back.status();
    Transformer b(*back_config, 99, at::kCPU);
    at::NoGradGuard no_grad;
    for (auto& p : b.parameters()) {
      ASSERT_TRUE(back->count(p.name)) << p.name;
      ASSERT_TRUE(at::equal(back->at(p.name), ParamsOf(a).at(p.name))) << p.name;
      p.value.copy_(back->at(p.name));
    }
    ModelInput in;
    in.tokens_BT = at::randint(258, {1, 12}, at::kLong);
    in.positions_BT = at::arange(12, at::kLong).view({1, 12});
    in.segments_BT = at::zeros({1, 12}, at::kLong);
    EXPECT_TRUE(at::equal(a.Forward(in, AttentionKernel::kMaskedSdpa),
                          b.Forward(in, AttentionKernel::kMaskedSdpa)));
  }
}

TEST(Hf, ShapesNeitherClassExpressesAreRefused) {
  struct Case {
    std::function<void(ModelConfig*)> change;
    std::string message;
  };
  const Case cases[] = {
      {[](ModelConfig* c) { c->moe.sigmoid_router = true; }, "model.moe.router is sigmoid"},
      {[](ModelConfig* c) { c->moe.shared_expert = true; }, "shared_expert"},
      {[](ModelConfig* c) { c->moe.every_n_layers = 2; }, "every_n_layers is 2"},
      {[](ModelConfig* c) { c->moe.capacity_factor = 1.25; }, "capacity_factor is 1.25"},
      {[](ModelConfig* c) { c->moe.top_k = 1; }, "top_k is 1"},
  };
  for (const Case& k : cases) {
    ModelConfig c = Small(4);
    k.change(&c);
    auto r = HfConfig(c, {});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(r.status().message().find(k.message), std::string::npos) << r.status();
  }
  // Non-zero balancing biases, unless dropped.
  const ModelConfig c = Small(4);
  Transformer m(c, 1, at::kCPU);
  std::map<int64_t, at::Tensor> biases = {{0, at::tensor({0.0f, 0.1f, 0.0f, 0.0f})}};
  auto r = ToHfTensors(c, ParamsOf(m), biases, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("balancing biases"), std::string::npos) << r.status();
  HfExportOptions drop;
  drop.drop_routing_bias = true;
  EXPECT_TRUE(ToHfTensors(c, ParamsOf(m), biases, drop).ok());
}

TEST(Hf, ConfigsTallyCannotBuildAreRefusedNamingTheField) {
  const nlohmann::json base = {{"model_type", "llama"},    {"hidden_size", 64},
                               {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                               {"intermediate_size", 128}, {"vocab_size", 300},
                               {"rms_norm_eps", 1e-6},     {"rope_theta", 500000.0}};
  auto ok = ModelConfigFromHf(base, "c.json");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rope_theta, 500000.0);
  EXPECT_EQ(ok->norm_eps, 1e-6);
  EXPECT_EQ(ok->d_ff, 128);
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* message;
  };
  const Case cases[] = {
      {"model_type", "gpt2", "model_type"},
      {"model_type", 7, "model_type"},
      {"num_key_value_heads", 2, "grouped-query attention"},
      {"rope_scaling", {{"type", "linear"}}, "rope_scaling"},
      {"attention_bias", true, "attention_bias"},
      {"hidden_act", "gelu", "hidden_act"},
      {"hidden_act", 3, "hidden_act"},
      {"hidden_size", "64", "hidden_size"},
      {"num_attention_heads", 3, "num_attention_heads"},
      {"head_dim", 32, "head_dim"},
      {"rope_theta", -1, "rope_theta"},
  };
  for (const Case& k : cases) {
    nlohmann::json j = base;
    j[k.key] = k.value;
    auto r = ModelConfigFromHf(j, "c.json");
    ASSERT_FALSE(r.ok()) << k.key;
    EXPECT_NE(r.status().message().find(k.message), std::string::npos) << r.status();
  }
  nlohmann::json mixtral = base;
  mixtral["model_type"] = "mixtral";
  mixtral["num_local_experts"] = 8;
  mixtral["num_experts_per_tok"] = 1;
  auto r = ModelConfigFromHf(mixtral, "c.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("num_experts_per_tok"), std::string::npos);
  mixtral["num_experts_per_tok"] = 2;
  ASSERT_TRUE(ModelConfigFromHf(mixtral, "c.json").ok());
}

TEST(Hf, MissingMisshapenAndExtraTensorsAreNamed) {
  const ModelConfig c = Small(0);
  Transformer m(c, 1, at::kCPU);
  auto hf = ToHfTensors(c, ParamsOf(m), {}, {});
  ASSERT_TRUE(hf.ok());
  NamedTensors missing(hf->begin() + 1, hf->end());
  auto r = FromHfTensors(c, missing, false, "m.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no tensor model.embed_tokens.weight"), std::string::npos);
  NamedTensors extra = *hf;
  extra.emplace_back("model.layers.9.mlp.gate_proj.weight", at::zeros({1}));
  r = FromHfTensors(c, extra, false, "m.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model.layers.9.mlp.gate_proj.weight has no place"),
            std::string::npos);
  NamedTensors wrong = *hf;
  wrong[0].second = at::zeros({10, 32});
  r = FromHfTensors(c, wrong, false, "m.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("is [10, 32], config.json makes it [258, 32]"),
            std::string::npos)
      << r.status();
  // A tied head: lm_head.weight absent, the embedding copied.
  NamedTensors tied;
  for (const auto& [n, t] : *hf) {
    if (n != "lm_head.weight") tied.emplace_back(n, t);
  }
  auto t = FromHfTensors(c, tied, true, "m.safetensors");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(at::equal(t->at("head"), t->at("embed")));
}

// ParameterShapes must list what the constructor builds, in its order.
TEST(Hf, ParameterShapesAreTheConstructorsParameters) {
  for (const int64_t experts : {0, 4}) {
    for (const bool shared : {false, true}) {
      ModelConfig c = Small(experts);
      c.num_layers = 3;
      c.moe.every_n_layers = 2;
      c.moe.shared_expert = shared;
      Transformer m(c, 1, at::kCPU);
      const auto shapes = ParameterShapes(c);
      ASSERT_EQ(shapes.size(), m.parameters().size());
      for (size_t i = 0; i < shapes.size(); ++i) {
        EXPECT_EQ(shapes[i].first, m.parameters()[i].name);
        EXPECT_EQ(shapes[i].second, m.parameters()[i].value.sizes().vec()) << shapes[i].first;
      }
    }
  }
}

}  // namespace
}  // namespace tally::model
