// A decoder-only transformer in ATen: token embedding, then num_layers blocks
// of [RMSNorm -> causal multi-head attention with RoPE -> residual, RMSNorm ->
// SwiGLU feed-forward -> residual], a final RMSNorm and an output head (not
// tied to the embedding).
//
// Packing: attention never crosses a segment (document) boundary. On CPU the
// model uses a block-diagonal causal boolean mask with scaled-dot-product
// attention; on CUDA it uses the variable-length flash-attention kernel with
// cumulative sequence lengths, never a dense T x T mask. RoPE positions come
// from the batch, so they restart at 0 in every document.
//
// Init (fixed, so a seed reproduces a model): embedding, every linear weight
// and the head ~ N(0, 0.02); the two projections that write into the residual
// stream (attention output wo, feed-forward w2) ~ N(0, 0.02 / sqrt(2 *
// num_layers)) (GPT-2); RMSNorm gains 1. Drawn on the CPU from a generator
// seeded with `seed`, then moved to the device, so CPU and GPU start equal.
//
// Tensor names carry their shape. Legend: B rows, T row width, N = B*T
// tokens, D d_model, H heads, K head dim (D / H), F d_ff, V vocab, S segments.
//
// Not thread-safe: one trainer owns a model.
#ifndef TALLY_WORKER_MODEL_TRANSFORMER_H_
#define TALLY_WORKER_MODEL_TRANSFORMER_H_

#include <ATen/ATen.h>

#include "worker/model/moe.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tally::model {


enum class AttentionKernel {
  kMaskedSdpa,    // block-diagonal causal mask + scaled_dot_product_attention
  kVarlenFlash,   // at::_flash_attention_forward with cu_seqlens (CUDA, bf16)
};

struct ModelInput {
  at::Tensor tokens_BT;     // int64
  at::Tensor positions_BT;  // int64, restart at 0 in each segment
  at::Tensor segments_BT;   // int64, equal within a segment (kMaskedSdpa)
  at::Tensor cu_seqlens_S;  // int32, S + 1 segment starts over the flat N (kVarlenFlash)
  int64_t max_seqlen = 0;
  at::Tensor real_BT;       // bool, false for padding (MoE routing statistics); optional
};

struct MoeLayerStats {
  int64_t layer = 0;
  MoeStats stats;
};

struct ForwardOutput {
  at::Tensor logits_BTV;
  at::Tensor aux_loss;  // sum over MoE layers (undefined for a dense model)
  at::Tensor z_loss;    // sum over MoE layers
  std::vector<MoeLayerStats> moe;
};

// How the model computes its block linears (attention projections and
// feed-forward weights; never the output head). precision/ supplies FP8; the
// default is at::linear. `site` names the weight ("layers.0.wqkv").
class LinearOverride {
 public:
  virtual ~LinearOverride() = default;
  virtual at::Tensor Linear(const at::Tensor& x, const at::Tensor& w,
                            const std::string& site) = 0;
  // A feed-forward's w1 and w3 ([F, D] each) on the same x: [..., 2F], w1's
  // outputs first (what the fused SwiGLU takes). The default is two Linear
  // calls joined; an override may compute it as one product (FP8: one cast
  // of x, one product).
  virtual at::Tensor GateUpLinear(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3,
                                  const std::string& site1, const std::string& site3) {
    return at::cat({Linear(x, w1, site1), Linear(x, w3, site3)}, -1);
  }
  // The fused SwiGLU of GateUpLinear's output y13 into w2 [D, F]: [..., D].
  // The default is FusedSwiGlu (fused_ops.h), then Linear; an override may
  // fuse more (FP8: the SwiGLU and the cast of its output in one pass).
  virtual at::Tensor SwiGluLinear(const at::Tensor& y13, const at::Tensor& w2,
                                  const std::string& site);
};

struct Parameter {
  std::string name;
  at::Tensor value;  // FP32 master weight, requires grad
  bool weight_decay;  // false for embeddings and norms
  // Expert weights under expert parallelism: this rank's block of experts
  // (dim 0) only; the other ranks hold the others (ShardExperts).
  bool sharded = false;
};

class Transformer {
 public:
  Transformer(const ModelConfig& config, uint64_t seed, at::Device device);

  // Logits [B, T, V] (FP32 on CPU; the autocast dtype on CUDA).
  at::Tensor Forward(const ModelInput& input, AttentionKernel kernel) const;
  // The logits with the MoE layers' losses and routing statistics.
  ForwardOutput Run(const ModelInput& input, AttentionKernel kernel) const;
  // Per MoE layer (in layer order): its selection bias, not a parameter (the
  // trainer nudges it toward balance and checkpoints it).
  std::vector<std::pair<int64_t, at::Tensor>> expert_biases() const;
  // Every site name the model passes to its LinearOverride.
  std::vector<std::string> LinearSites() const;

  // Not owned; nullptr restores at::linear.
  void SetLinearOverride(LinearOverride* linear) { linear_ = linear; }
  // The fused forms of the same computation, for BF16 runs (CUDA's, and the
  // CPU's under precision.compute BF16): RMSNorm as one at::rms_norm; RoPE
  // on q and k (and v's copy to attention's dtype) as one pass
  // (fused_ops.h); each dense feed-forward's w1 and w3 as one product over
  // their joint storage (w1 and w3 are row blocks of one [2F, D] tensor, so
  // the fused product reads them without a copy and h once), then SwiGLU as
  // one pass. Off: the composite ops the FP32 golden losses are of. With a
  // LinearOverride (FP8) the feed-forward's w1 and w3 go to its
  // GateUpLinear as one call (FP8's: one cast of h, one product), and the
  // fused SwiGLU and w2 to its SwiGluLinear.
  void SetFusedOps(bool fused) { fused_ops_ = fused; }
  // Quantization-aware computation: the block linears `q` names compute
  // with their weights fake-quantized (ggml_quant.h FakeQuantize: the
  // forward value exactly what a GGUF export holds, the gradient straight
  // through to the FP32 weight), recomputed from the weights each forward.
  // Feed-forward weights are then separate products (no fused w1|w3).
  // nullopt: the weights as they are.
  void SetWeightQuantization(std::optional<WeightQuantization> q) { quant_ = q; }
  const std::optional<WeightQuantization>& weight_quantization() const { return quant_; }
  // The MoE layers' experts hook (moe.h; e.g. dist/expert_parallel.h);
  // nullptr: every expert here. Not owned.
  void SetExpertsHook(ExpertsHook* experts) { experts_ = experts; }
  // Keeps only rank's block of num_experts / ranks experts of every MoE
  // layer (the ones it computes under expert parallelism), as initialised
  // for the whole model; their parameters become `sharded`. Call before the
  // optimizer takes the parameters.
  void ShardExperts(int rank, int ranks);

  std::vector<Parameter>& parameters() { return params_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const ModelConfig& config() const { return config_; }
  // The whole model's, wherever its experts are held.
  int64_t num_parameters() const;
  // The ones this process holds (fewer with sharded experts).
  int64_t num_resident_parameters() const;
  int64_t num_embedding_parameters() const { return config_.vocab_size * config_.d_model; }
  // Parameters one token uses: all but the experts it is not routed to.
  int64_t num_active_parameters() const;
  // Training FLOPs per token (forward + backward) from the active
  // parameters, as common/model_flops.h defines them (tallyd prices jobs
  // with the same formula).
  double TrainingFlopsPerToken(int64_t context) const;

 private:
  struct Layer {
    std::string prefix;  // "layers.N."
    at::Tensor attn_norm_D, wqkv_3DD, wo_DD, ffn_norm_D, w1_FD, w3_FD, w2_DF;
    // MoE layers: router, selection bias, experts; w1/w3/w2 above are then
    // the shared expert (undefined without one).
    bool moe = false;
    at::Tensor router_ED, bias_E, w1_EFD, w3_EFD, w2_EDF;
  };
  at::Tensor SwiGlu(const at::Tensor& h, const Layer& layer) const;
  // `layer` with the weights quant_ names fake-quantized.
  Layer Quantized(const Layer& layer) const;
  at::Tensor Norm(const at::Tensor& x, const at::Tensor& gain) const;
  at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const Layer& layer,
                    const char* name) const;
  at::Tensor Attention(const Layer& layer, const at::Tensor& x_BTD, const ModelInput& in,
                       const at::Tensor& cos_BTK, const at::Tensor& sin_BTK,
                       AttentionKernel kernel) const;

  ModelConfig config_;
  at::Tensor embed_VD_, final_norm_D_, head_VD_;
  std::vector<Layer> layers_;
  std::vector<Parameter> params_;
  LinearOverride* linear_ = nullptr;
  ExpertsHook* experts_ = nullptr;
  bool fused_ops_ = false;
  int expert_ranks_ = 1;
  std::optional<WeightQuantization> quant_;
};

// The name and shape of every parameter a Transformer of `config` has, in
// the order parameters() lists them, without building it (to check weights
// from a file before a model of their claimed size is allocated).
std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes(
    const ModelConfig& config);

// The block-diagonal causal mask [B, 1, T, T]: query i sees key j when j <= i
// and both are in the same segment.
at::Tensor BlockCausalMask(const at::Tensor& segments_BT);

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_TRANSFORMER_H_
