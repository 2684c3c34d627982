// The trainer's set-up: the data, the model and its optimizer, the process
// group, the weights a run starts from (model.init_from) and a distillation
// teacher.
#include "worker/train/trainer_run.h"

#include "worker/precision/activation_memory.h"

namespace tally::train::internal {
namespace {

// Copies `w` into `m`'s parameters (this rank's block of sharded experts),
// checking each is there, of its shape, finite and of a sane magnitude.
absl::Status CopyWeights(const InitialWeights& w, int rank, model::Transformer* m) {
  at::NoGradGuard no_grad;
  for (auto& p : m->parameters()) {
    if (w.keep_init.count(p.name)) continue;
    auto it = w.parameters.find(p.name);
    if (it == w.parameters.end()) {
      return absl::InvalidArgumentError(absl::StrCat(w.source, " has no weights for ", p.name));
    }
    at::Tensor src = it->second;
    if (p.sharded) src = src.narrow(0, rank * p.value.size(0), p.value.size(0));
    if (src.sizes() != p.value.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(w.source, ": ", p.name, " is ",
                                                     c10::str(src.sizes()), ", the model's is ",
                                                     c10::str(p.value.sizes())));
    }
    if (!at::isfinite(src).all().item<bool>()) {
      return absl::InvalidArgumentError(
          absl::StrCat(w.source, ": ", p.name, " holds NaN or infinite values"));
    }
    if (src.numel() > 0) {
      const double largest = src.abs().max().item<double>();
      if (largest > kMaxInitialWeight) {
        return absl::InvalidArgumentError(absl::StrCat(
            w.source, ": ", p.name, " holds a weight of magnitude ", largest, ", above ",
            kMaxInitialWeight,
            ": no trained model's weights are this large, and they overflow this model's "
            "products; check the file that was exported"));
      }
    }
    p.value.copy_(src);
  }
  for (auto& [layer, bias] : m->expert_biases()) {
    auto it = w.biases.find(layer);
    if (it != w.biases.end() && it->second.sizes() == bias.sizes()) bias.copy_(it->second);
  }
  return absl::OkStatus();
}

// The first field of `declared` (the spec's training.distill.teacher.model)
// that `actual` (the teacher file's) does not match, as a message; empty
// when they agree. Zero d_ff and vocab_size are not stated.
std::string DeclaredShapeMismatch(const model::ModelConfig& declared,
                                  const model::ModelConfig& actual) {
  auto differs = [&](const char* field, int64_t stated, int64_t theirs) {
    return absl::StrCat("training.distill.teacher.model.", field, " is ", stated,
                        " but the teacher has ", theirs);
  };
  if (declared.num_layers != actual.num_layers) {
    return differs("num_layers", declared.num_layers, actual.num_layers);
  }
  if (declared.d_model != actual.d_model) return differs("d_model", declared.d_model, actual.d_model);
  if (declared.num_heads != actual.num_heads) {
    return differs("num_heads", declared.num_heads, actual.num_heads);
  }
  const int64_t ff = ResolveDff(actual.d_model, actual.d_ff);
  if (declared.d_ff != 0 && declared.d_ff != ff) return differs("d_ff", declared.d_ff, ff);
  if (declared.vocab_size != 0 && declared.vocab_size != actual.vocab_size) {
    return differs("vocab_size", declared.vocab_size, actual.vocab_size);
  }
  if (declared.moe.num_experts != actual.moe.num_experts) {
    return differs("moe.num_experts", declared.moe.num_experts, actual.moe.num_experts);
  }
  if (actual.moe.num_experts > 0) {
    if (declared.moe.top_k != actual.moe.top_k) {
      return differs("moe.top_k", declared.moe.top_k, actual.moe.top_k);
    }
    if (declared.moe.every_n_layers != std::max<int64_t>(1, actual.moe.every_n_layers)) {
      return differs("moe.every_n_layers", declared.moe.every_n_layers,
                     actual.moe.every_n_layers);
    }
  }
  return "";
}

}  // namespace

absl::Status Run::LoadInitialWeights(const InitialWeights& w) {
  if (w.tokenizer.is_object()) {
    if (absl::Status s = CheckTokenizer(w.tokenizer, w.source); !s.ok()) return s;
  }
  return CopyWeights(w, c_.parallel.rank, model_.get());
}

absl::Status Run::LoadTeacher() {
  auto w = ReadInitialWeights(c_.distill.teacher_hf, c_.distill.teacher_checkpoint);
  if (!w.ok()) return w.status();
  if (c_.distill.declared) {
    if (std::string bad = DeclaredShapeMismatch(*c_.distill.declared, w->config); !bad.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          bad, " (", w->source, ": ", ShapeString(w->config),
          "); state the teacher's shape as it is, or leave training.distill.teacher.model out"));
    }
  }
  if (w->tokenizer.is_object()) {
    if (absl::Status s = CheckTokenizer(w->tokenizer, w->source); !s.ok()) return s;
  }
  const int64_t vocab = model_->config().vocab_size;
  if (w->config.vocab_size != vocab) {
    return absl::FailedPreconditionError(absl::StrCat(
        w->source, " has a vocabulary of ", w->config.vocab_size, " tokens, the student (",
        "this job's data.train_path, tokenizer ", TokenizerJson().dump(), ") ", vocab,
        ": teacher and student must share the tokenizer"));
  }
  model::ModelConfig tc = w->config;
  tc.moe.every_n_layers = std::max<int64_t>(1, tc.moe.every_n_layers);
  teacher_ = std::make_unique<model::Transformer>(tc, c_.seed, device_);
  teacher_->SetFusedOps(autocast_);
  if (absl::Status s = CopyWeights(*w, 0, teacher_.get()); !s.ok()) return s;
  for (auto& p : teacher_->parameters()) p.value.set_requires_grad(false);
  return absl::OkStatus();
}

nlohmann::json Run::TokenizerJson() const {
  const data::DatasetMetadata& m = train_->metadata();
  nlohmann::json t = {
      {"kind", m.tokenizer}, {"vocab_size", m.vocab_size}, {"bos", m.bos}, {"eos", m.eos}};
  if (!m.tokenizer_model_sha256.empty()) {
    t["model_path"] = m.tokenizer_model_path;
    t["model_sha256"] = m.tokenizer_model_sha256;
  }
  return t;
}

absl::Status Run::CheckTokenizer(const nlohmann::json& theirs, const std::string& source) const {
  const nlohmann::json ours = TokenizerJson();
  for (const char* key : {"kind", "vocab_size", "bos", "eos", "model_sha256"}) {
    auto it = theirs.find(key);
    const auto mine = ours.find(key);
    if ((it == theirs.end()) != (mine == ours.end()) || (it != theirs.end() && *it != *mine)) {
      return absl::FailedPreconditionError(
          absl::StrCat(source, " was trained with tokenizer ", theirs.dump().substr(0, 256),
                       ", this job's data.train_path with ", ours.dump(), " (", key,
                       " differs): tokenize the data with the model's tokenizer"));
    }
  }
  return absl::OkStatus();
}

std::optional<TrainResult> Run::OpenData() {
  auto train = data::Dataset::Open(c_.data.train_path, c_.model.vocab_size);
  if (!train.ok()) return Fail("data.train_path: " + std::string(train.status().message()), false);
  train_ = std::move(*train);
  const std::string val_path =
      c_.data.val_path.empty() ? data::ValidationPrefixFor(c_.data.train_path) : c_.data.val_path;
  if (c_.eval_interval_steps > 0) {
    auto val = data::Dataset::Open(val_path, train_->metadata().vocab_size);
    if (!val.ok()) return Fail("data.val_path: " + std::string(val.status().message()), false);
    val_ = std::move(*val);
    eval_ = data::PlanEvalSample(val_->DocLengths(), c_.data.seq_len, c_.eval_tokens);
  }
  data::PackOptions pack;
  pack.seq_len = c_.data.seq_len;
  pack.shuffle_window = c_.data.shuffle_window;
  pack.seed = c_.seed;
  pack.mode = c_.data.packing;
  rows_ = std::make_unique<data::RowStream>(train_.get(), pack);
  return std::nullopt;
}

void Run::BuildModel() {
  model::ModelConfig mc = c_.model;
  if (mc.vocab_size == 0) mc.vocab_size = train_->metadata().vocab_size;
  mc.moe.every_n_layers = std::max<int64_t>(1, mc.moe.every_n_layers);
  model_ = std::make_unique<model::Transformer>(mc, c_.seed, device_);
  // BF16 runs take the fused norm and gate/up product (CUDA's path, and
  // the CPU's under precision.compute BF16); FP32 keeps the composite ops.
  model_->SetFusedOps(autocast_);
  model_->SetWeightQuantization(c_.qat);
  // Each rank holds, updates and keeps optimizer state for its own experts.
  if (expert_parallel()) model_->ShardExperts(c_.parallel.rank, c_.parallel.world_size);
  AdamWOptions adamw;
  adamw.beta1 = c_.optimizer.beta1;
  adamw.beta2 = c_.optimizer.beta2;
  adamw.eps = c_.optimizer.eps;
  adamw.weight_decay = c_.optimizer.weight_decay;
  // CUDA runs the fused optimizer; the CPU the per-parameter one (the golden
  // losses are its), unless a test asks for the fused one there.
  opt_ = std::make_unique<AdamW>(&model_->parameters(), adamw,
                                 device_.is_cuda() || c_.optimizer.fused_on_cpu);
  if (c_.fp8) {
    fp8_ = std::make_unique<precision::Fp8Linears>(c_.fp8_recipe, device_);
    // Every layer's scaling state up front, in one order on every rank.
    fp8_->Declare(model_->LinearSites());
    if (!c_.test_fp8_grouped_off.empty()) fp8_->TurnGroupedOff(c_.test_fp8_grouped_off);
    model_->SetLinearOverride(fp8_.get());
  }
}

std::optional<TrainResult> Run::JoinGroup() {
  if (c_.parallel.world_size <= 1 && c_.parallel.rendezvous.empty()) return std::nullopt;
  // (One rank with a rendezvous still joins a group.)
  dist::GroupOptions g;
  g.rank = c_.parallel.rank;
  g.world_size = c_.parallel.world_size;
  g.store_address = c_.parallel.rendezvous;
  g.prefix = c_.parallel.rendezvous_prefix;
  g.local_host = c_.parallel.rendezvous_local_host;
  g.device = c_.device;
  g.timeout_seconds = c_.parallel.collective_timeout_seconds;
  auto group = dist::Group::Create(g);
  if (!group.ok()) return Fail("rendezvous: " + std::string(group.status().message()), true);
  group_ = std::move(*group);
  // Sharded experts get every rank's gradient through the all-to-all:
  // nothing to sum.
  std::vector<at::Tensor> values;
  for (const auto& p : model_->parameters()) {
    if (!p.sharded) values.push_back(p.value);
  }
  sync_ = std::make_unique<dist::GradientSync>(group_.get(), std::move(values),
                                               c_.parallel.bucket_bytes);
  if (expert_parallel()) {
    // Its own group: expert all-to-alls run inside the backward pass, beside
    // the gradient buckets, and the two need no common order.
    auto experts = group_->NewGroup("experts");
    if (!experts.ok()) return Fail("rendezvous: " + std::string(experts.status().message()), true);
    expert_group_ = std::move(*experts);
    exchange_ = std::make_unique<dist::GroupExchange>(expert_group_.get());
    experts_ = std::make_unique<dist::ExpertParallel>(exchange_.get());
    model_->SetExpertsHook(experts_.get());
  }
  // Same seed, same checkpoint: the ranks must start from the same
  // parameters; anything else is a configuration error, not bad luck.
  if (absl::Status s = CheckParametersAgree(); !s.ok()) {
    return Fail(absl::StrCat("ranks start from different parameters: ", s.message()), false);
  }
  return std::nullopt;
}

RunInfo Run::Info() const {
  RunInfo info;
  info.num_parameters = model_->num_parameters();
  info.num_resident_parameters = model_->num_resident_parameters();
  info.num_embedding_parameters = model_->num_embedding_parameters();
  info.num_active_parameters = model_->num_active_parameters();
  info.flops_per_token = model_->TrainingFlopsPerToken(c_.data.seq_len);
  if (teacher_) {
    // The teacher's forward pass: a third of its training FLOPs.
    info.teacher_parameters = teacher_->num_parameters();
    info.teacher_flops_per_token = teacher_->TrainingFlopsPerToken(c_.data.seq_len) / 3;
    info.flops_per_token += info.teacher_flops_per_token;
  }
  info.state_bytes = 16 * info.num_resident_parameters + 4 * info.teacher_parameters;
  if (device_.is_cuda()) {
    model::ModelConfig shape = model_->config();
    if (expert_parallel()) shape.moe.num_experts /= c_.parallel.world_size;  // held here
    const precision::StepMemory m = precision::EstimateStepMemory(
        shape, c_.micro_batch_rows * c_.data.seq_len,
        c_.fp8 ? precision::StepPrecision::kFp8 : precision::StepPrecision::kBf16);
    info.activation_bytes = m.activation_bytes;
    info.weight_cast_bytes = m.weight_cast_bytes;
  }
  info.micro_batches_per_step = micro_per_step_;
  info.start_step = state_.step;
  info.train_docs = train_->num_docs();
  info.val_docs = val_ ? val_->num_docs() : 0;
  if (val_) info.eval_coverage = eval_.Coverage();
  info.packing_efficiency = rows_->epoch_stats().efficiency();
  info.device = c_.device;
  info.attention = kernel_ == model::AttentionKernel::kVarlenFlash ? "varlen flash"
                                                                    : "block-diagonal mask";
  info.world_size = c_.parallel.world_size;
  info.backend = group_ ? group_->backend() : "";
  info.expert_parallel = exchange_ != nullptr;
  return info;
}

}  // namespace tally::train::internal
