#include "worker/train/trainer.h"

#include "worker/train/trainer_run.h"

#include <ATen/Parallel.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/model_flops.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"
#include "worker/dist/expert_parallel.h"
#include "worker/dist/grad_sync.h"
#include "worker/dist/group.h"
#include "worker/dist/step_reduce.h"
#include "worker/model/transformer.h"
#include "worker/precision/autocast.h"
#include "worker/precision/fp8.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checksum_file.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/model_io.h"
#include "worker/train/optimizer.h"
#include "worker/train/step.h"
#include "worker/train/train_state.h"

namespace tally::train {

absl::Status TrainConfig::Validate() const {
  std::vector<std::string> problems;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what);
  };
  const model::MoeConfig& moe = model.moe;
  need(init_from_hf.empty() || init_from_checkpoint.empty(),
       "model.init_from: name a Hugging Face folder (hf) or a checkpoint, not both");
  need(model.num_layers >= 1, "model.num_layers: must be >= 1");
  need(model.d_model >= 2 && model.num_heads >= 1 && model.d_model % model.num_heads == 0 &&
           (model.d_model / model.num_heads) % 2 == 0,
       "model.num_heads: must divide model.d_model into an even head size");
  need(model.vocab_size == 0 || (model.vocab_size >= 2 && model.vocab_size <= data::kMaxVocab),
       absl::StrCat("model.vocab_size: must be 0 (the dataset's) or between 2 and ",
                    data::kMaxVocab));
  need(!data.train_path.empty(), "data.train_path: is required");
  need(data.seq_len >= 2, "data.seq_len: must be >= 2");
  need(micro_batch_rows >= 1, "micro_batch_rows: must be >= 1");
  const int64_t micro_tokens = int64_t{data.seq_len} * micro_batch_rows;
  need(global_batch_tokens == 0 || global_batch_tokens % micro_tokens == 0,
       "global_batch_tokens: must be a multiple of data.seq_len * micro_batch_rows");
  need(max_steps >= 1, "max_steps: must be >= 1");
  need(optimizer.lr > 0 && std::isfinite(optimizer.lr),
       "optimizer.lr: must be a positive number");
  need(device == "cpu" || device.rfind("cuda", 0) == 0, "device: must be cpu or cuda:N");
  need(max_nonfinite_steps >= 1, "max_nonfinite_steps: must be >= 1");
  need(moe.num_experts == 0 || (moe.top_k >= 1 && moe.top_k <= moe.num_experts),
       "model.moe.top_k: must be between 1 and model.moe.num_experts");
  need(!(fp8 && bf16), "bf16: precision.compute is either BF16 or FP8, not both");
  need(!(qat && fp8),
       "training.qat: cannot be combined with FP8 compute (the FP8 linears would quantize the "
       "same weights to FP8): train with BF16 or FP32");
  need(!qat || (eval_quantized && *eval_quantized == *qat),
       "training.eval_quantized: with training.qat it must be QAT's own format and layers");
  if (qat || eval_quantized) {
    const int64_t F = tally::ResolveDff(model.d_model, model.d_ff);
    need(model.d_model % model::kGgmlBlock == 0 && F % model::kGgmlBlock == 0,
         absl::StrCat(qat ? "training.qat" : "training.eval_quantized",
                      ": quantizes blocks of 32 weights along each weight's input dimension, "
                      "so model.d_model (", model.d_model, ") and model.d_ff (", F,
                      ") must be multiples of 32"));
  }
  if (fp8) {
    for (std::string& p : precision::RecipeProblems(fp8_recipe)) problems.push_back(std::move(p));
  }
  const int world = parallel.world_size;
  need(world >= 1 && parallel.rank >= 0 && parallel.rank < world,
       absl::StrCat("parallel.rank: ", parallel.rank, " is not in a world of size ", world));
  need(world == 1 || !parallel.rendezvous.empty(),
       "parallel.rendezvous: is required with more than one rank (host:port of rank 0's "
       "store)");
  const int64_t micro_per_step =
      global_batch_tokens > 0 && micro_tokens > 0 ? global_batch_tokens / micro_tokens : 1;
  need(world <= 1 || micro_per_step % world == 0,
       absl::StrCat("global_batch_tokens: with ", world,
                    " ranks it must be a multiple of data.seq_len * micro_batch_rows * ", world,
                    " (", micro_tokens * std::max(1, world), "), so every rank gets the "
                    "same number of micro-batches"));
  need(parallel.collective_timeout_seconds > 0,
       "parallel.collective_timeout_seconds: must be > 0");
  need(!parallel.expert_parallel || world <= 1 ||
           (moe.num_experts > 0 && moe.num_experts % world == 0),
       absl::StrCat("parallel.expert_parallel: model.moe.num_experts (", moe.num_experts,
                    ") must be a multiple of the number of ranks (", world, ")"));
  need(test_preempt_checkpoint_delay_seconds >= 0 &&
           std::isfinite(test_preempt_checkpoint_delay_seconds),
       absl::StrCat("test_preempt_checkpoint_delay_seconds: must be a number >= 0 (0: off), got ",
                    test_preempt_checkpoint_delay_seconds));
  need(moe.test_forced_expert >= -1 &&
           (moe.num_experts == 0 || moe.test_forced_expert < moe.num_experts),
       absl::StrCat("model.moe.test_forced_expert: must be -1 (off) or an expert below "
                    "model.moe.num_experts (", moe.num_experts, "), got ",
                    moe.test_forced_expert));
  if (problems.empty()) return absl::OkStatus();
  std::string msg;
  for (const auto& p : problems) absl::StrAppend(&msg, msg.empty() ? "" : "; ", p);
  return absl::InvalidArgumentError(msg);
}

namespace internal {

EvalMetrics Run::Evaluate() {
  at::NoGradGuard no_grad;
  // Evaluation computes like training but never moves the FP8 scales; its
  // autocast region reads the weights as they are now.
  precision::AutocastRegion autocast(device_.type(), autocast_);
  if (fp8_) fp8_->SetTraining(false);
  // val_loss is the high-precision weights' (QAT's too); the quantized
  // loss is the model as its GGUF export computes: those layers quantized,
  // every product of dequantized weights (never FP8).
  const std::optional<model::WeightQuantization> trained = model_->weight_quantization();
  model_->SetWeightQuantization(std::nullopt);
  EvalMetrics e = ScoreEvalSample();
  if (c_.eval_quantized) {
    model_->SetWeightQuantization(c_.eval_quantized);
    if (fp8_) model_->SetLinearOverride(nullptr);
    e.quantized_val_loss = ScoreEvalSample().val_loss;
    if (fp8_) model_->SetLinearOverride(fp8_.get());
  }
  model_->SetWeightQuantization(trained);
  state_.last_eval_step = state_.step;
  if (fp8_) fp8_->SetTraining(true);
  return e;
}

EvalMetrics Run::ScoreEvalSample() {
  const std::vector<data::Row>& eval_rows = eval_.rows;
  // Per sampled document (in eval_.docs' order): its loss and target sums,
  // then the token-weighted totals, summed over the ranks in one vector.
  const size_t num_docs = eval_.docs.size();
  std::vector<double> sums(2 * num_docs + 3, 0.0);
  double& loss_sum = sums[2 * num_docs];
  double& targets = sums[2 * num_docs + 1];
  double& text_targets = sums[2 * num_docs + 2];
  auto doc_slot = [&](int64_t doc) {
    return static_cast<size_t>(std::lower_bound(eval_.docs.begin(), eval_.docs.end(), doc) -
                               eval_.docs.begin());
  };
  // Chunks of micro_batch_rows rows, dealt round-robin to the ranks. With
  // expert parallelism every rank runs as many forward passes as the
  // busiest (they exchange tokens in each), discarding the extra ones.
  const size_t rows = static_cast<size_t>(c_.micro_batch_rows);
  const size_t chunks = (eval_rows.size() + rows - 1) / rows;
  const size_t W = static_cast<size_t>(c_.parallel.world_size);
  const size_t passes = exchange_ ? (chunks + W - 1) / W : chunks;
  for (size_t t = 0; t < passes; ++t) {
    const size_t chunk = exchange_ ? t * W + c_.parallel.rank : t;
    // Another rank's chunk.
    if (!exchange_ && chunk % W != static_cast<size_t>(c_.parallel.rank)) continue;
    const bool extra = chunk >= chunks;
    const size_t i = (extra ? 0 : chunk) * rows;
    const size_t n = std::min(rows, eval_rows.size() - i);
    const data::MicroBatch mb = data::BuildMicroBatch(
        *val_, absl::MakeConstSpan(eval_rows).subspan(i, n), c_.data.seq_len,
        data::PackingMode::kPacked);
    const DeviceBatch d = ToDevice(mb, device_);
    const at::Tensor logits_BTV = model_->Run(d.input, kernel_).logits_BTV;
    if (extra) continue;
    // The per-token losses (0 where there is no target), once: summed per
    // segment (each document's share) and in all (the evaluation's), in one
    // copy to the host, the total last.
    const at::Tensor ce_N =
        at::cross_entropy_loss(logits_BTV.reshape({-1, logits_BTV.size(-1)}).to(at::kFloat),
                               d.targets_N, {}, at::Reduction::None, data::kIgnoreTarget);
    const size_t num_segments = mb.segment_docs.size();
    const at::Tensor sums_S =
        at::cat({at::zeros({static_cast<int64_t>(num_segments)}, ce_N.options())
                     .index_add_(0, d.input.segments_BT.reshape({-1}), ce_N),
                 ce_N.sum().reshape({1})})
            .to(at::kCPU, at::kDouble);
    const double* seg_loss = sums_S.data_ptr<double>();
    for (size_t s = 0; s < num_segments; ++s) {
      if (mb.segment_docs[s] < 0) continue;  // padding
      const size_t slot = doc_slot(mb.segment_docs[s]);
      sums[2 * slot] += seg_loss[s];
      sums[2 * slot + 1] += (mb.cu_seqlens[s + 1] - mb.cu_seqlens[s]) - 1;
    }
    loss_sum += seg_loss[num_segments];
    targets += static_cast<double>(mb.num_targets);
    text_targets += static_cast<double>(mb.text_targets);
  }
  SumOverRanks(&sums);
  EvalMetrics e;
  e.step = state_.step;
  e.tokens = state_.tokens;
  e.target_tokens = static_cast<int64_t>(targets);
  e.val_loss = targets > 0 ? loss_sum / targets : 0;
  double doc_means = 0;
  for (size_t k = 0; k < num_docs; ++k) {
    if (sums[2 * k + 1] <= 0) continue;  // a one-token document has no target
    doc_means += sums[2 * k] / sums[2 * k + 1];
    ++e.docs;
  }
  e.doc_val_loss = e.docs > 0 ? doc_means / static_cast<double>(e.docs) : 0;
  // Bits per byte of text whatever the tokenizer: the text targets stand
  // for the bytes of text they were prepared from (tally-prep records the
  // ratio; 1 for the byte tokenizer, unknown for pre-tokenized input).
  const double target_bytes = text_targets * val_->bytes_per_text_token();
  e.bits_per_byte = target_bytes > 0 ? loss_sum / std::log(2.0) / target_bytes : 0;
  return e;
}

std::optional<TrainResult> Run::EvaluateAndReport(TrainEvents* report) {
  const EvalMetrics e = Evaluate();
  if (std::isfinite(e.val_loss) || evaluated_finite_) {
    evaluated_finite_ = evaluated_finite_ || std::isfinite(e.val_loss);
    report->OnEval(e);
    return std::nullopt;
  }
  const bool initial = e.step == 0;
  const bool init_from = !c_.init_from_hf.empty() || !c_.init_from_checkpoint.empty();
  return Fail(
      absl::StrCat(
          "the evaluation at step ", e.step, " gave val_loss ", e.val_loss,
          ": the model's computation overflows; the parameter with the largest magnitude is ",
          LargestWeight(),
          initial && init_from
              ? absl::StrCat(" (model.init_from ",
                             c_.init_from_hf.empty() ? c_.init_from_checkpoint : c_.init_from_hf,
                             "): start from finite weights of a sane magnitude")
          : initial ? ": check the model's shape and initialisation"
                    : ": lower optimizer.lr or set optimizer.grad_clip"),
      false);
}

std::string Run::LargestWeight() {
  at::NoGradGuard no_grad;
  std::string name;
  double largest = -1;
  for (const auto& p : model_->parameters()) {
    if (p.value.numel() == 0) continue;
    // NaN compares false: a NaN anywhere makes its parameter the one named.
    const at::Tensor a = p.value.detach().abs().to(at::kDouble);
    const double m = at::isnan(a).any().item<bool>() ? NAN : a.max().item<double>();
    if (std::isnan(m) || m > largest) {
      name = p.name;
      largest = m;
      if (std::isnan(m)) break;
    }
  }
  return absl::StrCat(name, " (|weight| up to ", largest, ")");
}

void Run::SumOverRanks(std::vector<double>* v) {
  if (!group_ || v->empty()) return;
  at::Tensor t = at::tensor(*v, at::kDouble);
  group_->AllReduceSum({t});
  std::copy(t.data_ptr<double>(), t.data_ptr<double>() + v->size(), v->begin());
}


TrainResult Run::Go() {
  if (absl::Status s = c_.Validate(); !s.ok()) return Fail(std::string(s.message()), false);
  if (device_.is_cuda()) kernel_ = model::AttentionKernel::kVarlenFlash;
  std::optional<InitialWeights> init;
  if (!c_.init_from_hf.empty() || !c_.init_from_checkpoint.empty()) {
    // The shape first (the data's vocabulary is checked against it), the
    // weights once the model exists; a resume takes its own weights.
    auto w = ReadInitialWeights(c_.init_from_hf, c_.init_from_checkpoint);
    if (!w.ok()) return Fail("model.init_from: " + std::string(w.status().message()), false);
    if (absl::Status s = c_.upcycle
                             ? UpcycleWeights(c_.upcycle_noise_std, c_.seed, &c_.model, &*w)
                             : ReconcileModel(w->config, w->source, &c_.model);
        !s.ok()) {
      return Fail(std::string(s.message()), false);
    }
    init_from_json_ = w->provenance;
    init = *std::move(w);
  }
  if (auto failed = OpenData()) return *failed;
  BuildModel();
  if (init && c_.resume_path.empty()) {
    if (absl::Status s = LoadInitialWeights(*init); !s.ok()) {
      return Fail("model.init_from: " + std::string(s.message()), false);
    }
  }
  init.reset();
  if (c_.distill.on()) {
    if (absl::Status s = LoadTeacher(); !s.ok()) {
      return Fail("training.distill.teacher: " + std::string(s.message()), false);
    }
  }
  if (!c_.resume_path.empty()) {
    if (absl::Status s = LoadCheckpoint(); !s.ok()) {
      TrainResult failed = Fail("resume: " + std::string(s.message()), false);
      if (IsCheckpointDamage(s)) failed.damaged_checkpoint = c_.resume_path;
      return failed;
    }
  }
  if (auto failed = JoinGroup()) return *failed;
  const int64_t micro_tokens = int64_t{c_.data.seq_len} * c_.micro_batch_rows;
  micro_per_step_ = c_.global_batch_tokens > 0 ? c_.global_batch_tokens / micro_tokens : 1;
  const RunInfo info = Info();
  flops_per_token_ = info.flops_per_token;
  events_->OnStart(info);
  // Only rank 0 reports steps, evaluations and checkpoints.
  TrainEvents silent;
  TrainEvents* report = lead() ? events_ : &silent;

  // A fresh run evaluates its initial state; a resumed one evaluates only a
  // step the schedule names that its checkpoint was not evaluated at (a
  // preemption skips that evaluation to save time: this one makes it up).
  if (val_ && !state_.evaluated_this_step() &&
      (state_.step == 0 || state_.step % c_.eval_interval_steps == 0)) {
    if (auto failed = EvaluateAndReport(report)) return *failed;
  }
  NonFiniteGuard guard(c_.max_nonfinite_steps);
  // FP8 statistics "go bad" when over 1% of the values a step quantizes
  // overflow, or an amax is not finite: stop rather than drift.
  NonFiniteGuard fp8_guard(c_.max_nonfinite_steps);
  while (state_.step < c_.max_steps) {
    // In a group the ranks vote at the end of a step instead (ReduceStep): a
    // rank that left here would fail its peers' next collective.
    if (!group_) {
      const StopKind stop = stop_->requested();
      if (stop == StopKind::kNow) return Stopped();
      if (stop == StopKind::kPreempt) return StopPreempting();
      if (stop == StopKind::kKeepState) return StopKeepingState(report);
    }
    if (auto done = TrainStep(report, &guard, &fp8_guard)) return *done;
  }
  return {TrainResult::Outcome::kSucceeded,
          absl::StrCat("trained ", state_.step, " steps, ", state_.tokens, " tokens"), state_.step,
          false};
}

std::optional<TrainResult> Run::TrainStep(TrainEvents* report, NonFiniteGuard* guard,
                                          NonFiniteGuard* fp8_guard) {
  const auto t0 = Clock::now();
  const StepBatch batch = NextStepBatch(c_, micro_per_step_, *train_, rows_.get());
  // The ranks stop together, at the end of the step (ReduceStep); a stop
  // that keeps the state lets the step finish.
  std::optional<StepTotals> totals;
  {
    // Every micro-batch of the step casts each weight once; the cache is
    // cleared when the region ends, before the optimizer moves the weights.
    precision::AutocastRegion autocast(device_.type(), autocast_);
    totals = ForwardBackward(
        c_, micro_per_step_, batch,
        {model_.get(), device_, kernel_, sync_.get(), c_.test_sync_check, teacher_.get(),
         c_.distill.temperature, c_.distill.alpha},
        [&] { return !group_ && stop_->requested() == StopKind::kNow; });
  }
  if (!totals) return Stopped();
  StepTotals& t = *totals;
  if (fp8_) {
    // Delayed scaling steps from the largest amax any rank saw; the step's
    // statistics (one read) then see what every rank will step from.
    if (group_) group_->AllReduceMax(fp8_->StepAmaxToReduce());
    t.fp8 = fp8_->TakeStats();
  }
  dist::StepEnd end = dist::StepEnd::kContinue;
  if (group_) {
    absl::StatusOr<dist::StepEnd> reduced = ReduceStep(&t);
    if (!reduced.ok()) return Fail(std::string(reduced.status().message()), false);
    end = *reduced;
    if (end == dist::StepEnd::kStopNow) return Stopped();
  }

  StepMetrics m;
  m.moe_aux_loss = t.aux_loss_sum;
  m.distill_kl = t.distill_kl_sum / static_cast<double>(std::max<int64_t>(1, batch.targets));
  ReportMoeLoads(t.moe, &m);
  m.step = state_.step + 1;
  m.lr = LearningRate(m.step, c_.optimizer.lr, c_.optimizer.min_lr, c_.optimizer.warmup_steps,
                      c_.max_steps);
  m.train_loss = t.loss_sum / static_cast<double>(std::max<int64_t>(1, batch.targets));
  if (auto failed = ApplyStep(t, guard, fp8_guard, &m)) return failed;
  state_.AdvanceStep(t.real_tokens, t.padding_tokens);
  const int64_t real = t.real_tokens, padding = t.padding_tokens;
  m.step_seconds = Seconds(t0, Clock::now());
  m.tokens = state_.tokens;
  m.padding_tokens = state_.padding_tokens;
  m.step_tokens = real;
  m.step_padding_tokens = padding;
  m.useful_tokens_per_second = m.step_seconds > 0 ? real / m.step_seconds : 0;
  m.padding_fraction = static_cast<double>(padding) / static_cast<double>(real + padding);
  if (c_.peak_flops > 0 && m.step_seconds > 0) {
    const double peak = c_.peak_flops * c_.parallel.world_size * m.step_seconds;
    m.mfu = flops_per_token_ * real / peak;
    // Attention as executed over the step's documents, not the whole
    // context; a teacher's forward pass is a third of its training FLOPs.
    const double context = static_cast<double>(c_.data.seq_len);
    double attention_per_token = 0, attention_executed = 0;
    for (const model::Transformer* net : {model_.get(), teacher_.get()}) {
      if (net == nullptr) continue;
      const auto& mc = net->config();
      const double share = net == teacher_.get() ? 1.0 / 3 : 1.0;
      attention_per_token += share * AttentionTrainingFlops(mc.num_layers, mc.d_model, context);
      attention_executed +=
          share * AttentionTrainingFlops(mc.num_layers, mc.d_model, batch.attended_keys);
    }
    m.mfu_executed =
        ((flops_per_token_ - attention_per_token) * real + attention_executed) / peak;
  }
  report->OnStep(m);
  return AfterStep(end, report);
}

absl::StatusOr<dist::StepEnd> Run::ReduceStep(StepTotals* t) {
  auto& params = model_->parameters();
  // Every count of the step in one collective: losses, tokens, the stop
  // votes, FP8 counts, which gradients exist, MoE loads.
  dist::StepSums local;
  local.loss_sum = t->loss_sum;
  local.aux_loss_sum = t->aux_loss_sum;
  local.distill_kl_sum = t->distill_kl_sum;
  local.real_tokens = t->real_tokens;
  local.padding_tokens = t->padding_tokens;
  const StopKind stop = stop_->requested();
  local.votes.now = stop == StopKind::kNow;
  local.votes.keep_state = stop == StopKind::kKeepState;
  local.votes.preempt = stop == StopKind::kPreempt;
  local.fp8 = {t->fp8.overflows, t->fp8.underflows, t->fp8.elements, t->fp8.fp8_products,
               t->fp8.total_products};
  bool amax_finite = true;
  for (const auto& [group, amax] : t->fp8.amax) amax_finite &= std::isfinite(amax);
  local.ranks_with_nonfinite_amax = amax_finite ? 0 : 1;
  // Read before the gradients are summed.
  for (const auto& p : params) local.ranks_with_grad.push_back(p.value.grad().defined());
  // Gradients first (most buckets are under way already), then the counts.
  sync_->Finish();
  // Sharded experts' share of the gradient norm: each rank has its own.
  local.sharded_grad_square_sum = ShardedGradSquareSum(params);
  // Every MoE layer takes part on every rank, whether its tokens reached it
  // here or not.
  const auto biases = model_->expert_biases();
  for (const auto& [layer, bias] : biases) {
    dist::MoeLayerLoad& load = t->moe[layer];
    load.tokens_per_expert.resize(c_.model.moe.num_experts, 0);
    local.moe_layers.push_back(load);
  }
  std::vector<double> packed = dist::PackStepSums(local);
  SumOverRanks(&packed);
  ASSIGN_OR_RETURN(const dist::StepSums sum,
                   dist::UnpackStepSums(packed, dist::LayoutOf(local)));
  // A rank asked to keep the state, or preempted: all finish this step and
  // keep it (those votes outweigh one to stop at once, since the checkpoint
  // needs every rank). A preemption skips the evaluation.
  const dist::StepEnd end = sum.votes.Decide();
  if (end == dist::StepEnd::kStopNow) return end;
  t->loss_sum = sum.loss_sum;
  t->aux_loss_sum = sum.aux_loss_sum;
  t->distill_kl_sum = sum.distill_kl_sum;
  t->real_tokens = sum.real_tokens;
  t->padding_tokens = sum.padding_tokens;
  t->fp8.overflows = sum.fp8.overflows;
  t->fp8.underflows = sum.fp8.underflows;
  t->fp8.elements = sum.fp8.elements;
  t->fp8.fp8_products = sum.fp8.fp8_products;
  t->fp8.total_products = sum.fp8.total_products;
  if (sum.ranks_with_nonfinite_amax > 0) t->fp8.amax["any rank"] = std::nan("");
  for (size_t i = 0; i < biases.size(); ++i) t->moe[biases[i].first] = sum.moe_layers[i];
  // A parameter no local batch reached (an expert without tokens here)
  // joined the sum as zeros; one no rank reached has no gradient, as in a
  // single process. A sharded block no token reached has zeros where some
  // other block had tokens, as the whole tensor would in a single process.
  for (size_t i = 0; i < params.size(); ++i) {
    at::Tensor& g = params[i].value.mutable_grad();
    if (sum.ranks_with_grad[i] == 0) {
      g = at::Tensor();
    } else if (params[i].sharded && !g.defined()) {
      g = at::zeros_like(params[i].value);
    }
  }
  t->sharded_grad_square_sum = sum.sharded_grad_square_sum;
  return end;
}

std::optional<TrainResult> Run::ApplyStep(const StepTotals& t, NonFiniteGuard* guard,
                                          NonFiniteGuard* fp8_guard, StepMetrics* m) {
  at::NoGradGuard no_grad;
  auto& params = model_->parameters();
  bool finite = false;
  if (opt_->fused()) {
    // The norm, the clipping and the decision to skip a non-finite step on
    // the device; the norm is read afterwards, for the report and the guard.
    const at::Tensor norm = GradientNormOnDevice(params, t.sharded_grad_square_sum);
    const bool loss_finite = std::isfinite(m->train_loss);
    if (loss_finite) {
      ClipGradientsOnDevice(&params, norm, c_.optimizer.grad_clip);
      opt_->StepFused(m->lr, at::isfinite(norm).logical_not().to(at::kFloat));
    }
    m->grad_norm = norm.item<double>();
    finite = loss_finite && std::isfinite(m->grad_norm);
    if (loss_finite && !finite) opt_->Unstep();  // the device skipped it
  } else {
    m->grad_norm = GradientNorm(params, t.sharded_grad_square_sum);
    finite = std::isfinite(m->train_loss) && std::isfinite(m->grad_norm);
  }
  if (guard->Observe(finite)) {
    return Fail(absl::StrCat("loss or gradient was NaN/Inf for ", guard->streak(),
                             " consecutive steps (last loss ", m->train_loss, ", grad norm ",
                             m->grad_norm, ") at step ", m->step,
                             ": lower optimizer.lr or set optimizer.grad_clip"),
                false);
  }
  if (finite && !opt_->fused()) {
    ClipGradients(&params, m->grad_norm, c_.optimizer.grad_clip);
    opt_->Step(m->lr);
  }
  m->skipped = !finite;
  if (c_.optimizer.moe_bias_balancing) {
    auto biases = model_->expert_biases();
    for (size_t i = 0; i < biases.size() && i < m->moe.size(); ++i) {
      model::NudgeBias(biases[i].second, m->moe[i].tokens_per_expert, c_.optimizer.moe_bias_rate);
    }
  }
  if (fp8_) {
    fp8_->OnOptimizerStep();
    m->fp8_grouped_off = fp8_->grouped_off();
    const Fp8Health h = Fp8Report(t.fp8, m);
    if (fp8_guard->Observe(h.good())) {
      return Fail(absl::StrFormat("FP8 statistics went bad for %d steps in a row (step %d: "
                                  "%.2f%% of values overflowed, amax %s): raise "
                                  "precision.fp8_margin or use the current recipe",
                                  fp8_guard->streak(), m->step, 100 * h.overflow_fraction,
                                  h.amax_finite ? "finite" : "not finite"),
                  false);
    }
  }
  for (auto& p : params) p.value.mutable_grad() = at::Tensor();
  return std::nullopt;
}

std::optional<TrainResult> Run::AfterStep(dist::StepEnd end, TrainEvents* report) {
  const bool last = state_.step == c_.max_steps;
  // One rank reads its own flag here, once the step is applied (a group
  // voted in ReduceStep): a preemption skips even a scheduled evaluation.
  if (!group_ && stop_->requested() == StopKind::kPreempt) end = dist::StepEnd::kPreempt;
  const bool preempting = end == dist::StepEnd::kPreempt && !last;
  if (val_ && !preempting && (state_.step % c_.eval_interval_steps == 0 || last)) {
    if (auto failed = EvaluateAndReport(report)) return *failed;
  }
  const bool checkpoint = !c_.checkpoint_dir.empty() &&
                          ((c_.checkpoint_interval_steps > 0 &&
                            state_.step % c_.checkpoint_interval_steps == 0) ||
                           last);
  if (checkpoint) {
    if (auto failed = CheckpointOnAllRanks()) return *failed;
  } else if (group_ && c_.parallel.param_check_interval_steps > 0 &&
             state_.step % c_.parallel.param_check_interval_steps == 0) {
    if (absl::Status s = CheckParametersAgree(); !s.ok()) {
      return Fail(absl::StrCat(s.message(), "; resuming from the last checkpoint re-syncs them"),
                  true);
    }
  }
  if (preempting) return StopPreempting();
  if (end == dist::StepEnd::kKeepState && state_.step < c_.max_steps) {
    return StopKeepingState(report);
  }
  return std::nullopt;
}

std::optional<TrainResult> Run::CheckpointOnAllRanks() {
  // A checkpoint holds rank 0's parameters: check they are everyone's.
  if (absl::Status s = CheckParametersAgree(); !s.ok()) {
    return Fail(absl::StrCat(s.message(), "; resuming from the last checkpoint re-syncs them"),
                true);
  }
  const auto whole = GatherShards();  // every rank
  if (lead()) {
    if (absl::Status s = SaveCheckpoint(whole); !s.ok()) {
      return Fail("checkpoint: " + std::string(s.message()), true);
    }
  }
  state_.last_checkpoint_step = state_.step;  // on every rank, which decide alike
  return std::nullopt;
}

TrainResult Run::StopKeepingState(TrainEvents* report) {
  if (c_.checkpoint_dir.empty()) return Stopped(" (no checkpoint directory to keep it in)");
  if (val_ && !state_.evaluated_this_step()) {  // every rank
    if (auto failed = EvaluateAndReport(report)) return *failed;
  }
  if (!state_.checkpointed_this_step()) {
    if (auto failed = CheckpointOnAllRanks()) return *failed;
  }
  return Stopped(", state kept in its checkpoint");
}

TrainResult Run::StopPreempting() {
  // Every rank decides alike: the checkpoint directory, the step and the
  // latest checkpoint's step are the same on all of them.
  if (c_.checkpoint_dir.empty()) {
    return Preempted("; no checkpoint could be kept (no checkpoint directory)");
  }
  if (state_.checkpointed_this_step()) return Preempted(", its checkpoint is of this step");
  if (state_.step == 0) return Preempted(", before any step: nothing to keep");
  if (c_.test_preempt_checkpoint_delay_seconds > 0) {
    std::this_thread::sleep_for(
        std::chrono::duration<double>(c_.test_preempt_checkpoint_delay_seconds));
  }
  if (std::optional<TrainResult> failed = CheckpointOnAllRanks()) {
    // Still a preemption, not the job's failure: the attempt resumes from
    // the previous checkpoint (writes are atomic, so it is intact).
    return Preempted(absl::StrCat("; its checkpoint failed (", failed->reason,
                                  "), the previous one stays valid"));
  }
  return Preempted(", state kept in its checkpoint");
}

}  // namespace internal

namespace {

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

}  // namespace

void SetCpuThreads(int num_threads) {
  if (num_threads > 0) at::set_num_threads(num_threads);  // ATen/Parallel.h
}

absl::Status CheckDevice(const std::string& device) {
  if (device == "cpu") return absl::OkStatus();
  if (!at::hasCUDA()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", device, ": this build or machine has no CUDA (build with "
                     "-DTALLY_TORCH_CUDA=ON on a machine with a GPU, or use --device=cpu)"));
  }
  try {
    at::empty({1}, at::TensorOptions().device(at::Device(device)));
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device ", device, ": ", FirstLine(e.what_without_backtrace())));
  }
  return absl::OkStatus();
}

TrainResult Train(const TrainConfig& config, TrainEvents* events, const StopFlag* stop) {
  TrainEvents none;
  const StopFlag never;
  internal::Run run(config, events ? events : &none, stop ? stop : &never);
  auto failed = [&](std::string reason) {
    return TrainResult{TrainResult::Outcome::kFailed,
                       absl::StrCat(reason, " (at step ", run.step(), ")"), run.step(), false};
  };
  try {
    return run.Go();
  } catch (const dist::CollectiveError& e) {
    // A peer died or hung: the attempt as a whole is lost, not the job.
    TrainResult r = failed(std::string("a rank was lost: ") + e.what());
    r.retryable = true;
    return r;
  } catch (const c10::OutOfMemoryError& e) {
    return failed("out of memory: " + FirstLine(e.what_without_backtrace()) +
                  "; lower training.micro_batch_rows or data.seq_len");
  } catch (const c10::Error& e) {
    const std::string what = FirstLine(e.what_without_backtrace());
    if (config.parallel.world_size > 1 && what.find(" failed on rank ") != std::string::npos) {
      // A collective inside the backward pass (expert all-to-all) comes
      // back through autograd's own error.
      TrainResult r = failed("a rank was lost: " + what);
      r.retryable = true;
      return r;
    }
    return failed("LibTorch error: " + what);
  } catch (const std::exception& e) {
    return failed(std::string("error: ") + e.what());
  }
}

}  // namespace tally::train
