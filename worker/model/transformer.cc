#include "worker/model/transformer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "common/model_flops.h"
#include "worker/model/fused_ops.h"
#include "worker/model/ggml_quant.h"

namespace tally::model {

at::Tensor BlockCausalMask(const at::Tensor& segments_BT) {
  const int64_t T = segments_BT.size(1);
  at::Tensor same_BTT = segments_BT.unsqueeze(2).eq(segments_BT.unsqueeze(1));
  at::Tensor causal_TT =
      at::ones({T, T}, segments_BT.options().dtype(at::kBool)).tril();
  return same_BTT.logical_and(causal_TT).unsqueeze(1);
}

namespace {

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& gain, double eps) {
  // In FP32 whatever the input, then back: the norm is precision-sensitive.
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor r = at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + eps);
  return (xf * r).to(x.scalar_type()) * gain.to(x.scalar_type());
}

// w1 and w3 as one product, y13 = h [w1; w3]^T, over their joint storage
// (one [2F, D] block: the model allocates them so). Under autocast the
// operands are cast once, as autocast would, and saved cast for the
// backward, which computes dh and the joint weight gradient as one product
// each.
class GateUpProduct : public torch::autograd::Function<GateUpProduct> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& h,
                            const at::Tensor& w1, const at::Tensor& w3) {
    const int64_t F = w1.size(0), D = w1.size(1);
    at::Tensor w13 = at::empty({0}, w1.options()).set_(w1.storage(), w1.storage_offset(),
                                                        {2 * F, D}, {D, 1});
    at::Tensor hc = h;
    if (at::autocast::is_autocast_enabled(h.device().type())) {
      const at::ScalarType dtype = at::autocast::get_autocast_dtype(h.device().type());
      hc = h.to(dtype);
      w13 = w13.to(dtype);
    }
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    ctx->save_for_backward({hc, w13});
    ctx->saved_data["h_dtype"] = static_cast<int64_t>(h.scalar_type());
    return at::linear(hc, w13);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& hc = saved[0];
    const at::Tensor& w13 = saved[1];
    const int64_t F = w13.size(0) / 2, D = w13.size(1);
    const at::Tensor g = grads[0].to(w13.scalar_type());
    const at::Tensor g2 = g.reshape({-1, 2 * F});
    const at::Tensor gh = g.matmul(w13).to(
        static_cast<at::ScalarType>(ctx->saved_data["h_dtype"].toInt()));
    const at::Tensor gw = g2.t().matmul(hc.reshape({-1, D})).to(at::kFloat);
    return {gh, gw.narrow(0, 0, F), gw.narrow(0, F, F)};
  }
};

// Whether w1 and w3 are the row blocks of one storage, one after the other.
bool Joint(const at::Tensor& w1, const at::Tensor& w3) {
  return w1.is_contiguous() && w3.is_contiguous() && w1.sizes() == w3.sizes() &&
         w1.storage().is_alias_of(w3.storage()) &&
         w3.storage_offset() == w1.storage_offset() + w1.numel();
}

// Rotates pairs (x[..., i], x[..., i + K/2]) by position * theta^(-2i/K).
at::Tensor ApplyRope(const at::Tensor& x_BTHK, const at::Tensor& cos_BTK,
                     const at::Tensor& sin_BTK) {
  const int64_t half = x_BTHK.size(-1) / 2;
  at::Tensor x1 = x_BTHK.narrow(-1, 0, half);
  at::Tensor x2 = x_BTHK.narrow(-1, half, half);
  at::Tensor c = cos_BTK.unsqueeze(2).to(x_BTHK.scalar_type());
  at::Tensor s = sin_BTK.unsqueeze(2).to(x_BTHK.scalar_type());
  return at::cat({x1 * c - x2 * s, x1 * s + x2 * c}, -1);
}

}  // namespace

Transformer::Transformer(const ModelConfig& config, uint64_t seed, at::Device device)
    : config_(config) {
  config_.d_ff = tally::ResolveDff(config.d_model, config.d_ff);
  const int64_t D = config_.d_model, F = config_.d_ff, V = config_.vocab_size;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const double out_std = 0.02 / std::sqrt(2.0 * config_.num_layers);
  auto normal = [&](std::vector<int64_t> shape, double std) {
    return at::normal(0.0, std, shape, gen, f32);
  };
  auto add = [&](std::string name, at::Tensor t, bool decay) {
    t = t.to(device);
    t.set_requires_grad(true);
    params_.push_back({std::move(name), t, decay});
    return t;
  };
  embed_VD_ = add("embed", normal({V, D}, 0.02), false);
  for (int64_t l = 0; l < config_.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Layer layer;
    layer.prefix = p;
    layer.attn_norm_D = add(p + "attn_norm", at::ones({D}, f32), false);
    layer.wqkv_3DD = add(p + "wqkv", normal({3 * D, D}, 0.02), true);
    layer.wo_DD = add(p + "wo", normal({D, D}, out_std), true);
    layer.ffn_norm_D = add(p + "ffn_norm", at::ones({D}, f32), false);
    const auto& moe = config_.moe;
    layer.moe = moe.num_experts > 0 && (l % moe.every_n_layers) == moe.every_n_layers - 1;
    if (layer.moe) {
      const int64_t E = moe.num_experts;
      layer.router_ED = add(p + "router", normal({E, D}, 0.02), false);
      layer.w1_EFD = add(p + "experts.w1", normal({E, F, D}, 0.02), true);
      layer.w3_EFD = add(p + "experts.w3", normal({E, F, D}, 0.02), true);
      layer.w2_EDF = add(p + "experts.w2", normal({E, D, F}, out_std), true);
      layer.bias_E = at::zeros({E}, f32).to(device);
    }
    if (!layer.moe || moe.shared_expert) {
      // w1 and w3 in one [2F, D] block (the fused product reads it whole),
      // each a leaf of its own over its rows; drawn in the same order.
      const at::Tensor w1 = normal({F, D}, 0.02), w3 = normal({F, D}, 0.02);
      const at::Tensor joint = at::cat({w1, w3}).to(device);
      layer.w1_FD = add(p + "w1", joint.narrow(0, 0, F).detach(), true);
      layer.w3_FD = add(p + "w3", joint.narrow(0, F, F).detach(), true);
      layer.w2_DF = add(p + "w2", normal({D, F}, out_std), true);
    }
    layers_.push_back(std::move(layer));
  }
  final_norm_D_ = add("final_norm", at::ones({D}, f32), false);
  head_VD_ = add("head", normal({V, D}, 0.02), true);
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(
    const ModelConfig& config) {
  const int64_t D = config.d_model, F = tally::ResolveDff(config.d_model, config.d_ff),
                V = config.vocab_size, E = config.moe.num_experts;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"embed", {V, D}}};
  const int64_t every = std::max<int64_t>(1, config.moe.every_n_layers);
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    out.push_back({p + "attn_norm", {D}});
    out.push_back({p + "wqkv", {3 * D, D}});
    out.push_back({p + "wo", {D, D}});
    out.push_back({p + "ffn_norm", {D}});
    const bool moe = E > 0 && (l % every) == every - 1;
    if (moe) {
      out.push_back({p + "router", {E, D}});
      out.push_back({p + "experts.w1", {E, F, D}});
      out.push_back({p + "experts.w3", {E, F, D}});
      out.push_back({p + "experts.w2", {E, D, F}});
    }
    if (!moe || config.moe.shared_expert) {
      out.push_back({p + "w1", {F, D}});
      out.push_back({p + "w3", {F, D}});
      out.push_back({p + "w2", {D, F}});
    }
  }
  out.push_back({"final_norm", {D}});
  out.push_back({"head", {V, D}});
  return out;
}

at::Tensor LinearOverride::SwiGluLinear(const at::Tensor& y13, const at::Tensor& w2,
                                        const std::string& site) {
  return Linear(FusedSwiGlu(y13), w2, site);
}

at::Tensor Transformer::Linear(const at::Tensor& x, const at::Tensor& w, const Layer& layer,
                               const char* name) const {
  if (linear_ == nullptr) return at::linear(x, w);
  return linear_->Linear(x, w, layer.prefix + name);
}

int64_t Transformer::num_active_parameters() const {
  int64_t n = num_parameters();
  for (const Layer& l : layers_) {
    if (!l.moe) continue;
    const int64_t per_expert = l.w1_EFD[0].numel() + l.w3_EFD[0].numel() + l.w2_EDF[0].numel();
    n -= (config_.moe.num_experts - config_.moe.top_k) * per_expert;
  }
  return n;
}

std::vector<std::pair<int64_t, at::Tensor>> Transformer::expert_biases() const {
  std::vector<std::pair<int64_t, at::Tensor>> out;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (layers_[l].moe) out.emplace_back(static_cast<int64_t>(l), layers_[l].bias_E);
  }
  return out;
}

std::vector<std::string> Transformer::LinearSites() const {
  std::vector<std::string> out;
  for (const Layer& l : layers_) {
    out.push_back(l.prefix + "wqkv");
    out.push_back(l.prefix + "wo");
    if (l.moe) {
      for (int64_t e = 0; e < config_.moe.num_experts; ++e) {
        for (const char* w : {"w1", "w3", "w2"}) {
          out.push_back(l.prefix + "experts." + std::to_string(e) + "." + w);
        }
      }
    }
    if (l.w1_FD.defined()) {
      for (const char* w : {"w1", "w3", "w2"}) out.push_back(l.prefix + w);
    }
  }
  return out;
}

at::Tensor Transformer::SwiGlu(const at::Tensor& h, const Layer& layer) const {
  if (fused_ops_ && linear_ == nullptr && Joint(layer.w1_FD, layer.w3_FD)) {
    const at::Tensor y13 = GateUpProduct::apply(h, layer.w1_FD, layer.w3_FD);
    return Linear(FusedSwiGlu(y13), layer.w2_DF, layer, "w2");
  }
  if (fused_ops_ && linear_ != nullptr) {
    // The override's joint product (FP8: one cast of h, one product, each
    // weight under its own scale), then the fused SwiGLU into w2 (FP8: with
    // the cast of its output fused in, where the scale is known ahead).
    const at::Tensor y13 = linear_->GateUpLinear(h, layer.w1_FD, layer.w3_FD,
                                                 layer.prefix + "w1", layer.prefix + "w3");
    return linear_->SwiGluLinear(y13, layer.w2_DF, layer.prefix + "w2");
  }
  at::Tensor gate = at::silu(Linear(h, layer.w1_FD, layer, "w1"));
  return Linear(gate * Linear(h, layer.w3_FD, layer, "w3"), layer.w2_DF, layer, "w2");
}

at::Tensor Transformer::Norm(const at::Tensor& x, const at::Tensor& gain) const {
  if (fused_ops_ && x.scalar_type() == gain.scalar_type()) {
    return at::rms_norm(x, {x.size(-1)}, gain, config_.norm_eps);
  }
  return RmsNorm(x, gain, config_.norm_eps);
}

int64_t Transformer::num_parameters() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel() * (p.sharded ? expert_ranks_ : 1);
  return n;
}

int64_t Transformer::num_resident_parameters() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.value.numel();
  return n;
}

void Transformer::ShardExperts(int rank, int ranks) {
  const int64_t E = config_.moe.num_experts;
  TORCH_CHECK(expert_ranks_ == 1 && ranks > 0 && rank >= 0 && rank < ranks && E % ranks == 0,
              "ShardExperts: ", E, " experts over ", ranks, " ranks (rank ", rank, ")");
  if (ranks == 1) return;
  const int64_t M = E / ranks;
  auto shard = [&](at::Tensor& t) {
    at::Tensor block = t.detach().narrow(0, rank * M, M).clone();
    block.set_requires_grad(true);
    for (auto& p : params_) {
      if (p.value.is_same(t)) p.value = block, p.sharded = true;
    }
    t = block;
  };
  for (Layer& l : layers_) {
    if (!l.moe) continue;
    shard(l.w1_EFD);
    shard(l.w3_EFD);
    shard(l.w2_EDF);
  }
  expert_ranks_ = ranks;
}

double Transformer::TrainingFlopsPerToken(int64_t context) const {
  return tally::TrainingFlopsPerToken(num_active_parameters() - num_embedding_parameters(),
                                      config_.num_layers, config_.d_model, context);
}

at::Tensor Transformer::Attention(const Layer& layer, const at::Tensor& x_BTD,
                                  const ModelInput& in, const at::Tensor& cos_BTK,
                                  const at::Tensor& sin_BTK,
                                  AttentionKernel kernel) const {
  const int64_t B = x_BTD.size(0), T = x_BTD.size(1);
  const int64_t H = config_.num_heads, K = config_.d_model / config_.num_heads;
  at::Tensor qkv_BT3HK = Linear(x_BTD, layer.wqkv_3DD, layer, "wqkv").view({B, T, 3, H, K});
  at::Tensor q_BTHK, k_BTHK, v_BTHK;
  if (fused_ops_) {
    // One pass: q and k rotated, v passed through, in the dtype attention
    // takes (BF16 for flash).
    const at::ScalarType dtype =
        kernel == AttentionKernel::kVarlenFlash ? at::kBFloat16 : qkv_BT3HK.scalar_type();
    auto [q, k, v] = FusedRopeQkv(qkv_BT3HK, cos_BTK, sin_BTK, dtype);
    q_BTHK = q, k_BTHK = k, v_BTHK = v;
  } else {
    q_BTHK = ApplyRope(qkv_BT3HK.select(2, 0), cos_BTK, sin_BTK);
    k_BTHK = ApplyRope(qkv_BT3HK.select(2, 1), cos_BTK, sin_BTK);
    v_BTHK = qkv_BT3HK.select(2, 2);
  }
  at::Tensor out_BTD;
  if (kernel == AttentionKernel::kVarlenFlash) {
    // Flattened to N tokens; cu_seqlens keeps every segment to itself.
    const auto bf16 = at::kBFloat16;
    auto out = at::_flash_attention_forward(
        q_BTHK.reshape({B * T, H, K}).to(bf16), k_BTHK.reshape({B * T, H, K}).to(bf16),
        v_BTHK.reshape({B * T, H, K}).to(bf16), in.cu_seqlens_S, in.cu_seqlens_S,
        in.max_seqlen, in.max_seqlen, /*dropout_p=*/0.0, /*is_causal=*/true,
        /*return_debug_mask=*/false);
    out_BTD = std::get<0>(out).reshape({B, T, config_.d_model});
  } else {
    at::Tensor mask_B1TT = BlockCausalMask(in.segments_BT);
    at::Tensor o_BHTK = at::scaled_dot_product_attention(
        q_BTHK.transpose(1, 2), k_BTHK.transpose(1, 2), v_BTHK.transpose(1, 2), mask_B1TT);
    out_BTD = o_BHTK.transpose(1, 2).reshape({B, T, config_.d_model});
  }
  return Linear(out_BTD, layer.wo_DD, layer, "wo");
}

at::Tensor Transformer::Forward(const ModelInput& in, AttentionKernel kernel) const {
  return Run(in, kernel).logits_BTV;
}

Transformer::Layer Transformer::Quantized(const Layer& layer) const {
  Layer q = layer;
  const GgmlQuant format = quant_->format;
  auto fake = [&](at::Tensor& w) {
    if (w.defined()) w = FakeQuantize(w, format);
  };
  for (at::Tensor* w : {&q.w1_FD, &q.w3_FD, &q.w2_DF, &q.w1_EFD, &q.w3_EFD, &q.w2_EDF}) fake(*w);
  if (quant_->layers == QuantLayers::kAllLinear) {
    fake(q.wqkv_3DD);
    fake(q.wo_DD);
  }
  return q;
}

ForwardOutput Transformer::Run(const ModelInput& in, AttentionKernel kernel) const {
  ForwardOutput out;
  const int64_t K = config_.d_model / config_.num_heads;
  // RoPE tables for this batch's positions, in FP32.
  at::Tensor inv_freq_K = at::exp(
      at::arange(0, K / 2, in.positions_BT.options().dtype(at::kFloat)) *
      (-2.0 * std::log(config_.rope_theta) / static_cast<double>(K)));
  at::Tensor angles_BTK = in.positions_BT.to(at::kFloat).unsqueeze(-1) * inv_freq_K;
  at::Tensor cos_BTK = angles_BTK.cos(), sin_BTK = angles_BTK.sin();

  at::Tensor x_BTD = at::embedding(embed_VD_, in.tokens_BT);
  const int64_t B = in.tokens_BT.size(0), T = in.tokens_BT.size(1);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer quantized = quant_ ? Quantized(layers_[l]) : Layer();
    const Layer& layer = quant_ ? quantized : layers_[l];
    x_BTD = x_BTD + Attention(layer, Norm(x_BTD, layer.attn_norm_D), in, cos_BTK, sin_BTK,
                              kernel);
    at::Tensor h_BTD = Norm(x_BTD, layer.ffn_norm_D);
    if (!layer.moe) {
      x_BTD = x_BTD + SwiGlu(h_BTD, layer);
      continue;
    }
    MoeOutput moe = MoeForward(
        h_BTD.reshape({B * T, -1}), in.real_BT.defined() ? in.real_BT.reshape({-1}) : at::Tensor(),
        layer.router_ED, layer.bias_E, layer.w1_EFD, layer.w3_EFD, layer.w2_EDF, config_.moe,
        linear_, layer.prefix, experts_);
    at::Tensor y_BTD = moe.y_ND.reshape({B, T, -1});
    if (config_.moe.shared_expert) y_BTD = y_BTD + SwiGlu(h_BTD, layer);
    x_BTD = x_BTD + y_BTD;
    out.aux_loss = out.aux_loss.defined() ? out.aux_loss + moe.aux_loss : moe.aux_loss;
    out.z_loss = out.z_loss.defined() ? out.z_loss + moe.z_loss : moe.z_loss;
    out.moe.push_back({static_cast<int64_t>(l), std::move(moe.stats)});
  }
  out.logits_BTV = at::linear(Norm(x_BTD, final_norm_D_), head_VD_);
  return out;
}

}  // namespace tally::model
