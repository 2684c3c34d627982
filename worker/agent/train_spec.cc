#include "worker/agent/train_spec.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/spec_validation.h"

namespace tally::worker {

double PeakFlopsFor(const std::string& gpu_type) {
  const std::string t = absl::AsciiStrToLower(gpu_type);
  if (t == "h100" || t == "h200") return 989e12;
  if (t == "b200") return 2250e12;
  if (t == "a100") return 312e12;
  if (t == "l4") return 121e12;
  return 0;
}

namespace {

// A validated spec's format and layers.
model::WeightQuantization Quantization(const std::string& format, const std::string& layers) {
  return {model::ParseGgmlQuant(format).value_or(model::GgmlQuant::kQ8_0),
          model::ParseQuantLayers(layers).value_or(model::QuantLayers::kFfn)};
}

}  // namespace

absl::StatusOr<train::TrainConfig> TrainConfigFromSpec(tally::v1::JobSpec spec,
                                                       const DeviceOptions& device) {
  ApplySpecDefaults(&spec);
  if (absl::Status s = ValidateJobSpec(spec); !s.ok()) return s;
  const bool cuda = device.device != "cpu";
  const auto compute = spec.precision().compute();
  if (compute == tally::v1::PRECISION_FP32 && cuda) {
    return absl::InvalidArgumentError(
        "spec.precision.compute: CUDA workers train in BF16 with FP32 master weights; "
        "use PRECISION_BF16 or leave it unset");
  }
  train::TrainConfig c;
  c.parallel = device.parallel;
  const auto& m = spec.model();
  c.model.num_layers = m.num_layers();
  c.model.d_model = m.d_model();
  c.model.num_heads = m.num_heads();
  c.model.d_ff = m.d_ff();
  c.model.vocab_size = m.vocab_size();
  c.init_from_hf = m.init_from().hf();
  c.init_from_checkpoint = m.init_from().checkpoint();
  c.upcycle = m.init_from().has_upcycle();
  c.upcycle_noise_std = m.init_from().upcycle().noise_std();
  const auto& moe = m.moe();
  c.model.moe.num_experts = moe.num_experts();
  if (c.model.moe.num_experts > 0) {
    c.model.moe.top_k = moe.top_k();
    c.model.moe.every_n_layers = moe.every_n_layers();
    c.model.moe.shared_expert = moe.shared_expert();
    c.model.moe.sigmoid_router = moe.router() == "sigmoid";
    c.model.moe.capacity_factor = moe.capacity_factor();
    c.parallel.expert_parallel = moe.expert_parallel();
    c.optimizer.moe_aux_loss_coef = moe.aux_loss_coef();
    c.optimizer.moe_z_loss_coef = moe.z_loss_coef();
    c.optimizer.moe_bias_balancing = moe.bias_balancing();
  }
  const auto& d = spec.data();
  c.data.train_path = d.train_path();
  c.data.val_path = d.val_path();
  switch (d.packing()) {
    case tally::v1::PACKING_MODE_PAD_TO_SEQ_LEN:
      c.data.packing = data::PackingMode::kPadToSeqLen;
      break;
    case tally::v1::PACKING_MODE_PAD_TO_LONGEST:
      c.data.packing = data::PackingMode::kPadToLongest;
      break;
    default:
      c.data.packing = data::PackingMode::kPacked;
  }
  c.data.seq_len = d.seq_len();
  c.data.shuffle_window = d.shuffle_window();
  const auto& o = spec.optimizer();
  c.optimizer.lr = o.lr();
  c.optimizer.min_lr = o.min_lr();
  c.optimizer.weight_decay = o.weight_decay();
  c.optimizer.beta1 = o.beta1();
  c.optimizer.beta2 = o.beta2();
  c.optimizer.eps = o.eps();
  c.optimizer.grad_clip = o.grad_clip();
  c.optimizer.warmup_steps = o.warmup_steps();
  const auto& t = spec.training();
  c.max_steps = t.max_steps();
  c.global_batch_tokens = t.global_batch_tokens();
  c.micro_batch_rows = t.micro_batch_rows();
  c.eval_interval_steps = t.eval_interval_steps();
  c.eval_tokens = t.eval_tokens();
  c.checkpoint_interval_steps = t.checkpoint_interval_steps();
  c.seed = t.seed();
  if (t.has_distill()) {
    const auto& d = t.distill();
    c.distill.teacher_hf = d.teacher().hf();
    c.distill.teacher_checkpoint = d.teacher().checkpoint();
    c.distill.temperature = d.temperature();
    c.distill.alpha = d.alpha();
    if (d.teacher().has_model()) {
      const auto& tm = d.teacher().model();
      model::ModelConfig declared;
      declared.num_layers = tm.num_layers();
      declared.d_model = tm.d_model();
      declared.num_heads = tm.num_heads();
      declared.d_ff = tm.d_ff();
      declared.vocab_size = tm.vocab_size();
      declared.moe.num_experts = tm.moe().num_experts();
      declared.moe.top_k = std::max(1, tm.moe().top_k());
      declared.moe.every_n_layers = std::max(1, tm.moe().every_n_layers());
      declared.moe.shared_expert = tm.moe().shared_expert();
      c.distill.declared = declared;
    }
  }
  // CPU workers train in FP32 unless BF16 is asked for (autocast, as CUDA
  // runs it); CUDA workers always compute in BF16.
  if (t.has_qat()) {
    c.qat = Quantization(t.qat().format(), t.qat().layers());
  }
  if (!t.eval_quantized().empty()) {
    c.eval_quantized = Quantization(t.eval_quantized(), t.eval_quantized_layers());
  } else if (c.qat) {
    c.eval_quantized = c.qat;
  }
  c.bf16 = compute == tally::v1::PRECISION_BF16;
  c.fp8 = compute == tally::v1::PRECISION_FP8;
  if (c.fp8) {
    switch (spec.precision().fp8_recipe()) {
      case tally::v1::FP8_RECIPE_CURRENT:
        c.fp8_recipe.recipe = precision::Recipe::kCurrent;
        break;
      case tally::v1::FP8_RECIPE_ROWWISE:
        c.fp8_recipe.recipe = precision::Recipe::kRowwise;
        break;
      default:
        c.fp8_recipe.recipe = precision::Recipe::kDelayed;
    }
    c.fp8_recipe.history_len = spec.precision().amax_history_len();
    c.fp8_recipe.margin = spec.precision().fp8_margin();
  }
  c.device = device.device;
  c.checkpoint_dir = device.checkpoint_dir;
  c.peak_flops = device.peak_flops;
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

}  // namespace tally::worker
