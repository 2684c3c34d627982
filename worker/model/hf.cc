#include "worker/model/hf.h"

#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_flops.h"
#include "worker/data/json_limits.h"

namespace tally::model {
namespace {

// j[key] when it is a string, else `fallback` (never throws).
std::string StringOr(const nlohmann::json& j, const char* key, const std::string& fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : fallback;
}

std::string Layer(int64_t i) { return absl::StrCat("layers.", i, "."); }
std::string HfLayer(int64_t i) { return absl::StrCat("model.layers.", i, "."); }

absl::Status CheckShape(const std::map<std::string, at::Tensor>& t, const std::string& name,
                        std::vector<int64_t> shape) {
  auto it = t.find(name);
  if (it == t.end()) {
    return absl::FailedPreconditionError(absl::StrCat("the checkpoint has no tensor ", name));
  }
  if (it->second.sizes().vec() != shape) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", name, " is [", absl::StrJoin(it->second.sizes(), ", "),
                     "], the model config wants [", absl::StrJoin(shape, ", "), "]"));
  }
  return absl::OkStatus();
}

constexpr char kMixtral[] = "MixtralForCausalLM";
constexpr char kHf[] = "a Hugging Face model";

}  // namespace

std::string UnexpressibleMoe(const ModelConfig& c, const std::string& target) {
  const MoeConfig& m = c.moe;
  if (m.num_experts == 0) return "";
  if (m.sigmoid_router) {
    return absl::StrCat("model.moe.router is sigmoid: ", target, " routes by a softmax");
  }
  if (m.shared_expert) {
    return absl::StrCat("model.moe.shared_expert is on: ", target, " has no shared expert");
  }
  if (m.every_n_layers != 1) {
    return absl::StrCat("model.moe.every_n_layers is ", m.every_n_layers, ": ", target,
                        " has experts in every layer");
  }
  if (m.capacity_factor > 0) {
    return absl::StrCat("model.moe.capacity_factor is ", m.capacity_factor,
                        ": Tally drops tokens over capacity, ", target, " never does");
  }
  if (m.top_k == 1) {
    return absl::StrCat("model.moe.top_k is 1: Tally keeps the router's score as the gate, ",
                        target, " renormalises it to 1");
  }
  return "";
}

absl::Status CheckRoutingBiases(const std::map<int64_t, at::Tensor>& biases, bool drop,
                                const std::string& format, const std::string& target) {
  if (drop) return absl::OkStatus();
  for (const auto& [layer, bias] : biases) {
    if (bias.numel() == 0) continue;
    const double top = bias.abs().max().item<double>();
    if (top == 0) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot export as ", format, ": layer ", layer,
        " selects experts with balancing biases (largest |bias| ", top, "), and ", target,
        " selects by the router's scores alone, so some tokens would go to other experts. "
        "Train with model.moe.bias_balancing: false, or pass --drop_routing_bias to export "
        "anyway (the exported model's outputs then differ from Tally's)"));
  }
  return absl::OkStatus();
}

absl::Status CheckExportableWeight(const std::string& name, const at::Tensor& t) {
  if (t.numel() == 0) return absl::OkStatus();
  const at::Tensor flat = t.detach().reshape({-1});
  const at::Tensor bad = flat.isfinite().logical_not().logical_or(flat.abs() > kMaxExportedWeight);
  if (!bad.any().item<bool>()) return absl::OkStatus();
  // The first offending element, as an index into t.
  int64_t at_flat = bad.to(at::kByte).argmax().item<int64_t>();
  const double value = flat[at_flat].item<double>();
  std::vector<int64_t> index(t.dim());
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    index[d] = at_flat % t.size(d);
    at_flat /= t.size(d);
  }
  const std::string where = absl::StrCat(" at [", absl::StrJoin(index, ", "), "]");
  if (!std::isfinite(value)) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor ", name, " holds ", std::isnan(value) ? "NaN" : "an infinite value",
                     where, ": export an earlier checkpoint, from before training diverged"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "tensor ", name, " holds a weight of magnitude ", std::fabs(value), where, ", above ",
      kMaxExportedWeight,
      ", the largest F16 holds (llama.cpp stores weights in F16, and vLLM runs an FP32 "
      "model in F16): no trained model's weights are this large; export an earlier "
      "checkpoint, from before training diverged"));
}

absl::StatusOr<nlohmann::ordered_json> HfConfig(const ModelConfig& c,
                                                const HfExportOptions& options) {
  if (std::string why = UnexpressibleMoe(c, kMixtral); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot export as ", kHf, ": ", why));
  }
  const bool moe = c.moe.num_experts > 0;
  const int64_t F = ResolveDff(c.d_model, c.d_ff);
  nlohmann::ordered_json j;
  j["architectures"] = {moe ? "MixtralForCausalLM" : "LlamaForCausalLM"};
  j["model_type"] = moe ? "mixtral" : "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.d_model;
  j["intermediate_size"] = F;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_heads;
  j["head_dim"] = c.d_model / c.num_heads;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = options.max_position_embeddings;
  j["rms_norm_eps"] = c.norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = false;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  if (moe) {
    j["num_local_experts"] = c.moe.num_experts;
    j["num_experts_per_tok"] = c.moe.top_k;
    j["output_router_logits"] = false;
    j["router_aux_loss_coef"] = 0.0;
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
  } else {
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  }
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  if (options.bos >= 0) j["bos_token_id"] = options.bos;
  if (options.eos >= 0) j["eos_token_id"] = options.eos;
  j["torch_dtype"] = options.dtype == at::kBFloat16 ? "bfloat16" : "float32";
  return j;
}

absl::StatusOr<NamedTensors> ToHfTensors(const ModelConfig& c,
                                         const std::map<std::string, at::Tensor>& t,
                                         const std::map<int64_t, at::Tensor>& biases,
                                         const HfExportOptions& options) {
  if (std::string why = UnexpressibleMoe(c, kMixtral); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot export as ", kHf, ": ", why));
  }
  const int64_t D = c.d_model, V = c.vocab_size, F = ResolveDff(c.d_model, c.d_ff);
  const int64_t E = c.moe.num_experts;
  NamedTensors out;
  auto take = [&](const std::string& name, std::vector<int64_t> shape) -> absl::Status {
    if (auto s = CheckShape(t, name, std::move(shape)); !s.ok()) return s;
    return CheckExportableWeight(name, t.at(name));
  };
  if (auto s = CheckRoutingBiases(biases, options.drop_routing_bias, kHf, kMixtral); !s.ok()) {
    return s;
  }
  if (auto s = take("embed", {V, D}); !s.ok()) return s;
  out.emplace_back("model.embed_tokens.weight", t.at("embed"));
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = Layer(i), h = HfLayer(i);
    for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"attn_norm", {D}}, {"wqkv", {3 * D, D}}, {"wo", {D, D}}, {"ffn_norm", {D}}}) {
      if (auto s = take(p + name, shape); !s.ok()) return s;
    }
    const at::Tensor& wqkv = t.at(p + "wqkv");
    out.emplace_back(h + "input_layernorm.weight", t.at(p + "attn_norm"));
    out.emplace_back(h + "self_attn.q_proj.weight", wqkv.narrow(0, 0, D));
    out.emplace_back(h + "self_attn.k_proj.weight", wqkv.narrow(0, D, D));
    out.emplace_back(h + "self_attn.v_proj.weight", wqkv.narrow(0, 2 * D, D));
    out.emplace_back(h + "self_attn.o_proj.weight", t.at(p + "wo"));
    out.emplace_back(h + "post_attention_layernorm.weight", t.at(p + "ffn_norm"));
    if (E == 0) {
      for (auto [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
               {"w1", {F, D}}, {"w3", {F, D}}, {"w2", {D, F}}}) {
        if (auto s = take(p + name, shape); !s.ok()) return s;
      }
      out.emplace_back(h + "mlp.gate_proj.weight", t.at(p + "w1"));
      out.emplace_back(h + "mlp.up_proj.weight", t.at(p + "w3"));
      out.emplace_back(h + "mlp.down_proj.weight", t.at(p + "w2"));
      continue;
    }
    for (auto [name, shape] :
         std::vector<std::pair<std::string, std::vector<int64_t>>>{{"router", {E, D}},
                                                                   {"experts.w1", {E, F, D}},
                                                                   {"experts.w3", {E, F, D}},
                                                                   {"experts.w2", {E, D, F}}}) {
      if (auto s = take(p + name, shape); !s.ok()) return s;
    }
    const std::string m = h + "block_sparse_moe.";
    out.emplace_back(m + "gate.weight", t.at(p + "router"));
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = absl::StrCat(m, "experts.", e, ".");
      out.emplace_back(x + "w1.weight", t.at(p + "experts.w1")[e]);
      out.emplace_back(x + "w2.weight", t.at(p + "experts.w2")[e]);
      out.emplace_back(x + "w3.weight", t.at(p + "experts.w3")[e]);
    }
  }
  if (auto s = take("final_norm", {D}); !s.ok()) return s;
  if (auto s = take("head", {V, D}); !s.ok()) return s;
  out.emplace_back("model.norm.weight", t.at("final_norm"));
  out.emplace_back("lm_head.weight", t.at("head"));
  return out;
}

absl::StatusOr<ModelConfig> ModelConfigFromHf(const nlohmann::json& j, const std::string& path) {
  auto bad = [&](const std::string& field, auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", parts...));
  };
  if (!j.is_object()) return bad("", "is not a JSON object");
  auto integer = [&](const char* field, int64_t lo, int64_t hi, int64_t* out) -> absl::Status {
    auto it = j.find(field);
    if (it == j.end() || !it->is_number_integer()) {
      return bad(field, "is missing or not an integer");
    }
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > hi) return bad(field, "is ", v, ", outside [", lo, ", ", hi, "]");
    *out = v;
    return absl::OkStatus();
  };
  auto number = [&](const char* field, double fallback, double* out) -> absl::Status {
    auto it = j.find(field);
    if (it == j.end()) {
      *out = fallback;
      return absl::OkStatus();
    }
    if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() <= 0) {
      return bad(field, "must be a positive number");
    }
    *out = it->get<double>();
    return absl::OkStatus();
  };
  auto is_true = [&](const char* field) {
    auto it = j.find(field);
    return it != j.end() && it->is_boolean() && it->get<bool>();
  };
  const std::string type = StringOr(j, "model_type", "");
  if (type != "llama" && type != "mixtral") {
    return bad("model_type", "is \"", type.substr(0, 64),
               "\"; Tally builds \"llama\" (LlamaForCausalLM) and \"mixtral\" "
               "(MixtralForCausalLM) models");
  }
  ModelConfig c;
  int64_t heads = 0, kv = 0;
  if (auto s = integer("num_hidden_layers", 1, 256, &c.num_layers); !s.ok()) return s;
  if (auto s = integer("hidden_size", 1, 65536, &c.d_model); !s.ok()) return s;
  if (auto s = integer("num_attention_heads", 1, 1024, &heads); !s.ok()) return s;
  if (auto s = integer("intermediate_size", 1, 1 << 20, &c.d_ff); !s.ok()) return s;
  if (auto s = integer("vocab_size", 1, 1 << 22, &c.vocab_size); !s.ok()) return s;
  c.num_heads = heads;
  if (c.d_model % heads != 0 || (c.d_model / heads) % 2 != 0) {
    return bad("num_attention_heads", "is ", heads, ": it must divide hidden_size (", c.d_model,
               ") into heads of an even size");
  }
  kv = heads;
  if (j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()) {
    if (auto s = integer("num_key_value_heads", 1, 1024, &kv); !s.ok()) return s;
  }
  if (kv != heads) {
    return bad("num_key_value_heads", "is ", kv, " with ", heads,
               " query heads: grouped-query attention, which Tally's attention does not have");
  }
  if (j.contains("head_dim") && !j["head_dim"].is_null() &&
      (!j["head_dim"].is_number_integer() || j["head_dim"].get<int64_t>() != c.d_model / heads)) {
    return bad("head_dim", "is ", j["head_dim"].dump().substr(0, 32),
               "; Tally's heads are hidden_size / num_attention_heads = ", c.d_model / heads);
  }
  if (j.contains("hidden_act") && StringOr(j, "hidden_act", "") != "silu") {
    return bad("hidden_act", "must be \"silu\" (SwiGLU)");
  }
  if (is_true("attention_bias") || is_true("mlp_bias")) {
    return bad(is_true("attention_bias") ? "attention_bias" : "mlp_bias",
               "is true; Tally's linears have no biases");
  }
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    return bad("rope_scaling", "is set; Tally's RoPE is unscaled");
  }
  if (auto s = number("rope_theta", 10000.0, &c.rope_theta); !s.ok()) return s;
  if (auto s = number("rms_norm_eps", 1e-6, &c.norm_eps); !s.ok()) return s;
  if (type == "mixtral") {
    if (auto s = integer("num_local_experts", 2, 1024, &c.moe.num_experts); !s.ok()) return s;
    if (auto s = integer("num_experts_per_tok", 1, c.moe.num_experts, &c.moe.top_k); !s.ok()) {
      return s;
    }
    if (c.moe.top_k == 1) {
      return bad("num_experts_per_tok",
                 "is 1: Mixtral renormalises a single gate to 1, Tally keeps the raw score");
    }
    c.moe.every_n_layers = 1;
  }
  return c;
}

absl::StatusOr<std::map<std::string, at::Tensor>> FromHfTensors(const ModelConfig& c,
                                                                const NamedTensors& tensors,
                                                                bool tied_head,
                                                                const std::string& path) {
  std::map<std::string, at::Tensor> hf;
  for (const auto& [name, t] : tensors) hf[name] = t;
  std::set<std::string> used;
  auto get = [&](const std::string& name,
                 std::vector<int64_t> shape) -> absl::StatusOr<at::Tensor> {
    auto it = hf.find(name);
    if (it == hf.end()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no tensor ", name));
    }
    if (it->second.sizes().vec() != shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor ", name, " is [", absl::StrJoin(it->second.sizes(), ", "),
                       "], config.json makes it [", absl::StrJoin(shape, ", "), "]"));
    }
    used.insert(name);
    return it->second;
  };
  const int64_t D = c.d_model, V = c.vocab_size, F = ResolveDff(c.d_model, c.d_ff);
  const int64_t E = c.moe.num_experts;
  std::map<std::string, at::Tensor> out;
#define TALLY_GET(var, name, ...)               \
  auto var##_or = get(name, __VA_ARGS__);       \
  if (!var##_or.ok()) return var##_or.status(); \
  at::Tensor var = *var##_or
  TALLY_GET(embed, "model.embed_tokens.weight", {V, D});
  out["embed"] = embed;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = Layer(i), h = HfLayer(i);
    TALLY_GET(norm1, h + "input_layernorm.weight", {D});
    TALLY_GET(q, h + "self_attn.q_proj.weight", {D, D});
    TALLY_GET(k, h + "self_attn.k_proj.weight", {D, D});
    TALLY_GET(v, h + "self_attn.v_proj.weight", {D, D});
    TALLY_GET(o, h + "self_attn.o_proj.weight", {D, D});
    TALLY_GET(norm2, h + "post_attention_layernorm.weight", {D});
    out[p + "attn_norm"] = norm1;
    out[p + "wqkv"] = at::cat({q, k, v}, 0);
    out[p + "wo"] = o;
    out[p + "ffn_norm"] = norm2;
    if (E == 0) {
      TALLY_GET(gate, h + "mlp.gate_proj.weight", {F, D});
      TALLY_GET(up, h + "mlp.up_proj.weight", {F, D});
      TALLY_GET(down, h + "mlp.down_proj.weight", {D, F});
      out[p + "w1"] = gate;
      out[p + "w3"] = up;
      out[p + "w2"] = down;
      continue;
    }
    const std::string m = h + "block_sparse_moe.";
    TALLY_GET(router, m + "gate.weight", {E, D});
    out[p + "router"] = router;
    std::vector<at::Tensor> w1, w2, w3;
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = absl::StrCat(m, "experts.", e, ".");
      TALLY_GET(a, x + "w1.weight", {F, D});
      TALLY_GET(b, x + "w2.weight", {D, F});
      TALLY_GET(g, x + "w3.weight", {F, D});
      w1.push_back(a);
      w2.push_back(b);
      w3.push_back(g);
    }
    out[p + "experts.w1"] = at::stack(w1);
    out[p + "experts.w2"] = at::stack(w2);
    out[p + "experts.w3"] = at::stack(w3);
  }
  TALLY_GET(final_norm, "model.norm.weight", {D});
  out["final_norm"] = final_norm;
  if (tied_head && !hf.count("lm_head.weight")) {
    out["head"] = embed.clone();
  } else {
    TALLY_GET(head, "lm_head.weight", {V, D});
    out["head"] = head;
  }
#undef TALLY_GET
  for (const auto& [name, t] : hf) {
    if (!used.count(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", name, " has no place in a ",
          E > 0 ? "MixtralForCausalLM" : "LlamaForCausalLM", " as config.json describes it"));
    }
  }
  return out;
}

absl::StatusOr<HfModel> ReadHfFolder(const std::string& dir) {
  const std::string config_path = dir + "/config.json";
  struct stat st;
  if (::stat(config_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(config_path, ": no such file (model.init_from.hf ",
                                            "names a Hugging Face model folder)"));
  }
  if (st.st_size > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": larger than 1 MiB"));
  }
  std::ifstream in(config_path);
  std::stringstream text;
  text << in.rdbuf();
  if (data::JsonNestsDeeperThan(text.str(), 16)) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": nested too deeply"));
  }
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": not valid JSON"));
  }
  auto config = ModelConfigFromHf(j, config_path);
  if (!config.ok()) return config.status();
  const std::string weights = dir + "/model.safetensors";
  auto tensors = ReadSafetensors(weights);
  if (!tensors.ok()) {
    if (absl::IsNotFound(tensors.status())) {
      return absl::NotFoundError(
          absl::StrCat(weights,
                       ": no such file (a sharded model.safetensors.index.json is not read; "
                       "save the model as one file)"));
    }
    return tensors.status();
  }
  auto tie = j.find("tie_word_embeddings");
  const bool tied = tie != j.end() && tie->is_boolean() && tie->get<bool>();
  auto params = FromHfTensors(*config, *tensors, tied, weights);
  if (!params.ok()) return params.status();
  return HfModel{*config, *std::move(params)};
}

}  // namespace tally::model
