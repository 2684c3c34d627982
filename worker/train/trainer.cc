#include "worker/train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/Reduction.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"
#include "worker/model/transformer.h"
#include "worker/precision/fp8.h"
#include "worker/train/checkpoint.h"
#include "worker/train/lr_schedule.h"

namespace tally::train {

absl::Status TrainConfig::Validate() const {
  std::vector<std::string> problems;
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) problems.push_back(what);
  };
  need(num_layers >= 1, "num_layers: must be >= 1");
  need(d_model >= 2 && num_heads >= 1 && d_model % num_heads == 0 &&
           (d_model / num_heads) % 2 == 0,
       "num_heads: must divide d_model into an even head size");
  need(vocab_size == 0 || vocab_size >= data::ByteTokenizer::kVocabSize,
       absl::StrCat("vocab_size: must be 0 or >= ", data::ByteTokenizer::kVocabSize,
                    " (the byte tokenizer's)"));
  need(!train_path.empty(), "train_path: is required");
  need(seq_len >= 2, "seq_len: must be >= 2");
  need(micro_batch_rows >= 1, "micro_batch_rows: must be >= 1");
  const int64_t micro_tokens = int64_t{seq_len} * micro_batch_rows;
  need(global_batch_tokens == 0 || global_batch_tokens % micro_tokens == 0,
       "global_batch_tokens: must be a multiple of seq_len * micro_batch_rows");
  need(max_steps >= 1, "max_steps: must be >= 1");
  need(lr > 0 && std::isfinite(lr), "lr: must be a positive number");
  need(device == "cpu" || device.rfind("cuda", 0) == 0, "device: must be cpu or cuda:N");
  need(max_nonfinite_steps >= 1, "max_nonfinite_steps: must be >= 1");
  need(moe_num_experts == 0 || (moe_top_k >= 1 && moe_top_k <= moe_num_experts),
       "moe_top_k: must be between 1 and moe_num_experts");
  need(!fp8 || (amax_history_len >= 1 && amax_history_len <= 1024),
       "amax_history_len: must be between 1 and 1024");
  need(!fp8 || (fp8_margin >= 0 && fp8_margin <= 8), "fp8_margin: must be between 0 and 8");
  if (problems.empty()) return absl::OkStatus();
  std::string msg;
  for (const auto& p : problems) absl::StrAppend(&msg, msg.empty() ? "" : "; ", p);
  return absl::InvalidArgumentError(msg);
}

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// AdamW with decoupled weight decay (Loshchilov & Hutter), FP32 state.
class AdamW {
 public:
  AdamW(std::vector<model::Parameter>* params, const TrainConfig& c)
      : params_(params), c_(c) {
    for (const auto& p : *params_) {
      m_.push_back(at::zeros_like(p.value));
      v_.push_back(at::zeros_like(p.value));
    }
  }
  void Step(double lr) {
    at::NoGradGuard no_grad;
    ++step_;
    const double bc1 = 1.0 - std::pow(c_.beta1, static_cast<double>(step_));
    const double bc2 = 1.0 - std::pow(c_.beta2, static_cast<double>(step_));
    for (size_t i = 0; i < params_->size(); ++i) {
      at::Tensor p = (*params_)[i].value;
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      if ((*params_)[i].weight_decay && c_.weight_decay > 0) p.mul_(1.0 - lr * c_.weight_decay);
      m_[i].lerp_(g, 1.0 - c_.beta1);
      v_[i].mul_(c_.beta2).addcmul_(g, g, 1.0 - c_.beta2);
      at::Tensor denom = (v_[i].sqrt() / std::sqrt(bc2)).add_(c_.eps);
      p.addcdiv_(m_[i], denom, -lr / bc1);
    }
  }
  int64_t step() const { return step_; }
  void set_step(int64_t s) { step_ = s; }
  std::vector<at::Tensor>& m() { return m_; }
  std::vector<at::Tensor>& v() { return v_; }

 private:
  std::vector<model::Parameter>* params_;
  const TrainConfig& c_;
  std::vector<at::Tensor> m_, v_;
  int64_t step_ = 0;
};

struct DeviceBatch {
  model::ModelInput input;
  at::Tensor targets_N;
};

DeviceBatch ToDevice(const data::MicroBatch& b, at::Device device) {
  auto longs = [&](const std::vector<int64_t>& v, bool shaped) {
    at::Tensor t = at::tensor(v, at::kLong);
    if (shaped) t = t.view({b.rows, b.width});
    return t.to(device);
  };
  DeviceBatch d;
  d.input.tokens_BT = longs(b.tokens, true);
  d.input.positions_BT = longs(b.positions, true);
  d.input.segments_BT = longs(b.segment_ids, true);
  d.input.cu_seqlens_S = at::tensor(b.cu_seqlens, at::kInt).to(device);
  d.input.max_seqlen = b.max_seqlen;
  d.input.real_BT = at::tensor(std::vector<int64_t>(b.real.begin(), b.real.end()), at::kLong)
                        .view({b.rows, b.width})
                        .to(device, at::kBool);
  d.targets_N = longs(b.targets, false);
  return d;
}

struct Losses {
  at::Tensor ce_sum;  // cross-entropy summed over the batch's target tokens, FP32
  at::Tensor aux;     // MoE load-balancing loss (undefined when dense)
  at::Tensor z;       // MoE router z-loss
  std::vector<model::MoeLayerStats> moe;
};

Losses LossSum(const model::Transformer& m, const DeviceBatch& d, model::AttentionKernel kernel) {
  model::ForwardOutput out = m.Run(d.input, kernel);
  at::Tensor logits_BTV = out.logits_BTV;
  return {at::cross_entropy_loss(logits_BTV.reshape({-1, logits_BTV.size(-1)}).to(at::kFloat),
                                 d.targets_N, {}, at::Reduction::Sum, data::kIgnoreTarget),
          out.aux_loss, out.z_loss, std::move(out.moe)};
}

class Run {
 public:
  Run(const TrainConfig& c, TrainEvents* events, const std::atomic<bool>* stop)
      : c_(c), events_(events), stop_(stop), device_(c.device) {}

  TrainResult Go();
  int64_t step() const { return step_; }

 private:
  TrainResult Fail(std::string reason, bool retryable) {
    return {TrainResult::Outcome::kFailed, std::move(reason), step_, retryable};
  }
  EvalMetrics Evaluate();
  absl::Status SaveCheckpoint();
  absl::Status LoadCheckpoint();
  std::string Fingerprint() const;

  const TrainConfig& c_;
  TrainEvents* events_;
  const std::atomic<bool>* stop_;
  at::Device device_;
  model::AttentionKernel kernel_ = model::AttentionKernel::kMaskedSdpa;
  std::unique_ptr<data::Dataset> train_, val_;
  std::unique_ptr<data::RowStream> rows_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<precision::Fp8Linears> fp8_;
  std::vector<data::Row> eval_rows_;
  int64_t step_ = 0, tokens_ = 0, padding_tokens_ = 0;
  int64_t last_eval_step_ = -1, last_checkpoint_step_ = -1;
};

std::string Run::Fingerprint() const {
  return absl::StrCat(
      "layers=", c_.num_layers, " d_model=", c_.d_model, " heads=", c_.num_heads,
      " d_ff=", model_->config().d_ff, " vocab=", model_->config().vocab_size,
      " seq_len=", c_.seq_len, " packing=", data::PackingModeName(c_.packing),
      " seed=", c_.seed,
      c_.moe_num_experts > 0
          ? absl::StrCat(" moe=", c_.moe_num_experts, "x", c_.moe_top_k, "/every",
                         c_.moe_every_n_layers, c_.moe_shared_expert ? "/shared" : "",
                         c_.moe_sigmoid_router ? "/sigmoid" : "/softmax", "/cap",
                         c_.moe_capacity_factor)
          : "",
      c_.fp8 ? absl::StrCat(" fp8=",
                            c_.fp8_recipe == Fp8Recipe::kDelayed   ? "delayed"
                            : c_.fp8_recipe == Fp8Recipe::kCurrent ? "current"
                                                                   : "rowwise",
                            "/", c_.amax_history_len, "/", c_.fp8_margin)
             : "");
}

EvalMetrics Run::Evaluate() {
  at::NoGradGuard no_grad;
  // Evaluation computes like training but never moves the FP8 scales.
  if (fp8_) fp8_->SetTraining(false);
  double loss_sum = 0;
  int64_t targets = 0, target_bytes = 0;
  for (size_t i = 0; i < eval_rows_.size(); i += c_.micro_batch_rows) {
    const size_t n = std::min<size_t>(c_.micro_batch_rows, eval_rows_.size() - i);
    const data::MicroBatch mb = data::BuildMicroBatch(
        *val_, absl::MakeConstSpan(eval_rows_).subspan(i, n), c_.seq_len,
        data::PackingMode::kPacked);
    loss_sum += LossSum(*model_, ToDevice(mb, device_), kernel_).ce_sum.item<double>();
    targets += mb.num_targets;
    target_bytes += mb.target_bytes;
  }
  EvalMetrics e;
  e.step = step_;
  e.tokens = tokens_;
  e.target_tokens = targets;
  e.val_loss = targets ? loss_sum / targets : 0;
  e.bits_per_byte = target_bytes ? loss_sum / std::log(2.0) / target_bytes : 0;
  last_eval_step_ = step_;
  if (fp8_) fp8_->SetTraining(true);
  return e;
}

absl::Status Run::SaveCheckpoint() {
  std::error_code ec;
  std::filesystem::create_directories(c_.checkpoint_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", c_.checkpoint_dir, ": ", ec.message()));
  }
  const std::string path =
      absl::StrFormat("%s/step-%08d.ckpt", c_.checkpoint_dir, step_);
  CheckpointData data;
  const data::DataCursor cursor = rows_->cursor();
  nlohmann::json meta = {{"step", step_},           {"tokens", tokens_},
                         {"padding_tokens", padding_tokens_},
                         {"optimizer_step", opt_->step()},
                         {"cursor_epoch", cursor.epoch}, {"cursor_row", cursor.row},
                         {"fingerprint", Fingerprint()}};
  data.metadata_json = meta.dump();
  auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    data.tensors.emplace_back("model." + params[i].name, params[i].value);
    data.tensors.emplace_back("adamw.m." + params[i].name, opt_->m()[i]);
    data.tensors.emplace_back("adamw.v." + params[i].name, opt_->v()[i]);
  }
  if (fp8_) {
    for (auto& t : fp8_->State()) data.tensors.push_back(std::move(t));
  }
  for (const auto& [layer, bias] : model_->expert_biases()) {
    data.tensors.emplace_back(absl::StrCat("moe.layers.", layer, ".bias"), bias);
  }
  auto sha = WriteCheckpoint(path, data);
  if (!sha.ok()) return sha.status();
  last_checkpoint_step_ = step_;
  events_->OnCheckpoint({step_, tokens_, path, *sha});
  return absl::OkStatus();
}

absl::Status Run::LoadCheckpoint() {
  auto data = ReadCheckpoint(c_.resume_path, c_.resume_sha256);
  if (!data.ok()) return data.status();
  nlohmann::json meta = nlohmann::json::parse(data->metadata_json, nullptr, false);
  if (meta.is_discarded() || !meta.contains("fingerprint")) {
    return absl::DataLossError("checkpoint " + c_.resume_path + ": unreadable metadata");
  }
  if (meta["fingerprint"] != Fingerprint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", c_.resume_path, " was written for a different job (",
        meta["fingerprint"].get<std::string>(), "; this job: ", Fingerprint(), ")"));
  }
  std::map<std::string, at::Tensor> by_name(data->tensors.begin(), data->tensors.end());
  auto& params = model_->parameters();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto [prefix, dst] : {std::pair{"model.", params[i].value},
                               std::pair{"adamw.m.", opt_->m()[i]},
                               std::pair{"adamw.v.", opt_->v()[i]}}) {
      auto it = by_name.find(prefix + params[i].name);
      if (it == by_name.end() || !it->second.sizes().equals(dst.sizes())) {
        return absl::DataLossError(absl::StrCat("checkpoint ", c_.resume_path, ": tensor ",
                                                prefix, params[i].name,
                                                " is missing or has the wrong shape"));
      }
      dst.copy_(it->second);
    }
  }
  for (auto& [layer, bias] : model_->expert_biases()) {
    auto it = by_name.find(absl::StrCat("moe.layers.", layer, ".bias"));
    if (it == by_name.end() || !it->second.sizes().equals(bias.sizes())) {
      return absl::DataLossError(absl::StrCat("checkpoint ", c_.resume_path,
                                              ": expert bias of layer ", layer, " is missing"));
    }
    bias.copy_(it->second);
  }
  if (fp8_) {
    std::string bad;
    if (!fp8_->LoadState(by_name, &bad)) {
      return absl::DataLossError(absl::StrCat("checkpoint ", c_.resume_path,
                                              ": FP8 scaling state ", bad, " is unreadable"));
    }
  }
  step_ = meta["step"].get<int64_t>();
  tokens_ = meta["tokens"].get<int64_t>();
  padding_tokens_ = meta["padding_tokens"].get<int64_t>();
  opt_->set_step(meta["optimizer_step"].get<int64_t>());
  rows_->Seek({meta["cursor_epoch"].get<int64_t>(), meta["cursor_row"].get<int64_t>()});
  last_checkpoint_step_ = step_;
  return absl::OkStatus();
}

TrainResult Run::Go() {
  if (absl::Status s = c_.Validate(); !s.ok()) return Fail(std::string(s.message()), false);
  if (device_.is_cuda()) {
    kernel_ = model::AttentionKernel::kVarlenFlash;
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  }
  auto train = data::Dataset::Open(c_.train_path);
  if (!train.ok()) return Fail("data.train_path: " + std::string(train.status().message()), false);
  train_ = std::move(*train);
  const std::string val_path =
      c_.val_path.empty() ? data::ValidationPrefixFor(c_.train_path) : c_.val_path;
  if (c_.eval_interval_steps > 0) {
    auto val = data::Dataset::Open(val_path);
    if (!val.ok()) return Fail("data.val_path: " + std::string(val.status().message()), false);
    val_ = std::move(*val);
    data::PackOptions eval_opts;
    eval_opts.seq_len = c_.seq_len;
    eval_opts.shuffle = false;
    int64_t taken = 0;
    for (data::Row& r : data::PlanEpoch(val_->DocLengths(), eval_opts, 0)) {
      if (c_.eval_tokens > 0 && taken >= c_.eval_tokens) break;
      taken += r.num_tokens;
      eval_rows_.push_back(std::move(r));
    }
  }
  data::PackOptions pack;
  pack.seq_len = c_.seq_len;
  pack.shuffle_window = c_.shuffle_window;
  pack.seed = c_.seed;
  pack.mode = c_.packing;
  rows_ = std::make_unique<data::RowStream>(train_.get(), pack);

  model::ModelConfig mc;
  mc.num_layers = c_.num_layers;
  mc.d_model = c_.d_model;
  mc.num_heads = c_.num_heads;
  mc.d_ff = c_.d_ff;
  mc.vocab_size = c_.vocab_size ? c_.vocab_size : data::ByteTokenizer::kVocabSize;
  mc.moe.num_experts = c_.moe_num_experts;
  mc.moe.top_k = c_.moe_top_k;
  mc.moe.every_n_layers = std::max<int64_t>(1, c_.moe_every_n_layers);
  mc.moe.shared_expert = c_.moe_shared_expert;
  mc.moe.sigmoid_router = c_.moe_sigmoid_router;
  mc.moe.capacity_factor = c_.moe_capacity_factor;
  model_ = std::make_unique<model::Transformer>(mc, c_.seed, device_);
  opt_ = std::make_unique<AdamW>(&model_->parameters(), c_);
  if (c_.fp8) {
    precision::RecipeConfig rc;
    rc.recipe = c_.fp8_recipe == Fp8Recipe::kDelayed   ? precision::Recipe::kDelayed
                : c_.fp8_recipe == Fp8Recipe::kCurrent ? precision::Recipe::kCurrent
                                                       : precision::Recipe::kRowwise;
    rc.history_len = c_.amax_history_len;
    rc.margin = c_.fp8_margin;
    fp8_ = std::make_unique<precision::Fp8Linears>(rc);
    model_->SetLinearOverride(fp8_.get());
  }
  if (!c_.resume_path.empty()) {
    if (absl::Status s = LoadCheckpoint(); !s.ok()) {
      return Fail("resume: " + std::string(s.message()), false);
    }
  }

  const int64_t micro_tokens = int64_t{c_.seq_len} * c_.micro_batch_rows;
  const int64_t micro_per_step =
      c_.global_batch_tokens > 0 ? c_.global_batch_tokens / micro_tokens : 1;
  RunInfo info;
  info.num_parameters = model_->num_parameters();
  info.num_embedding_parameters = model_->num_embedding_parameters();
  info.num_active_parameters = model_->num_active_parameters();
  info.flops_per_token = model_->TrainingFlopsPerToken(c_.seq_len);
  info.micro_batches_per_step = micro_per_step;
  info.start_step = step_;
  info.train_docs = train_->num_docs();
  info.val_docs = val_ ? val_->num_docs() : 0;
  info.packing_efficiency = rows_->epoch_stats().efficiency();
  info.device = c_.device;
  info.attention = kernel_ == model::AttentionKernel::kVarlenFlash ? "varlen flash"
                                                                    : "block-diagonal mask";
  events_->OnStart(info);

  if (val_ && step_ == 0) events_->OnEval(Evaluate());
  NonFiniteGuard guard(c_.max_nonfinite_steps);
  // FP8 statistics "go bad" when over 1% of the values a step quantizes
  // overflow, or an amax is not finite: stop rather than drift.
  NonFiniteGuard fp8_guard(c_.max_nonfinite_steps);
  while (step_ < c_.max_steps) {
    if (stop_->load()) {
      return {TrainResult::Outcome::kStopped, absl::StrCat("stopped at step ", step_), step_,
              false};
    }
    const auto t0 = Clock::now();
    std::vector<data::MicroBatch> micro(micro_per_step);
    int64_t targets = 0, real = 0, padding = 0;
    for (auto& mb : micro) {
      mb = data::BuildMicroBatch(*train_, rows_->Next(c_.micro_batch_rows), c_.seq_len,
                                 c_.packing);
      targets += mb.num_targets;
      real += mb.real_tokens;
      padding += mb.padding_tokens;
    }
    double loss_sum = 0, aux_sum = 0;
    std::map<int64_t, StepMetrics::MoeLayer> moe_layers;
    std::map<int64_t, int64_t> moe_assignments, moe_dropped;
    for (const auto& mb : micro) {
      if (stop_->load()) {
        return {TrainResult::Outcome::kStopped, absl::StrCat("stopped at step ", step_),
                step_, false};
      }
      Losses l = LossSum(*model_, ToDevice(mb, device_), kernel_);
      loss_sum += l.ce_sum.item<double>();
      at::Tensor loss = l.ce_sum / static_cast<double>(std::max<int64_t>(1, targets));
      if (l.aux.defined()) {
        // The MoE losses are means already: one share per micro-batch.
        const double share = 1.0 / static_cast<double>(micro_per_step);
        loss = loss + (c_.moe_aux_loss_coef * share) * l.aux +
               (c_.moe_z_loss_coef * share) * l.z;
        aux_sum += l.aux.item<double>() * share;
        for (const auto& ls : l.moe) {
          auto& agg = moe_layers[ls.layer];
          agg.layer = ls.layer;
          if (agg.tokens_per_expert.empty()) {
            agg.tokens_per_expert.assign(ls.stats.tokens_per_expert.size(), 0);
          }
          for (size_t e = 0; e < ls.stats.tokens_per_expert.size(); ++e) {
            agg.tokens_per_expert[e] += ls.stats.tokens_per_expert[e];
          }
          agg.router_entropy += ls.stats.router_entropy * share;
          moe_assignments[ls.layer] += ls.stats.assignments;
          moe_dropped[ls.layer] += ls.stats.dropped;
        }
      }
      loss.backward();
    }
    StepMetrics m;
    m.moe_aux_loss = aux_sum;
    for (auto& [layer, agg] : moe_layers) {
      int64_t total = 0, max = 0;
      for (int64_t n : agg.tokens_per_expert) total += n, max = std::max(max, n);
      const double mean = static_cast<double>(total) / agg.tokens_per_expert.size();
      agg.max_over_mean_load = mean > 0 ? max / mean : 0;
      agg.dropped_fraction =
          moe_assignments[layer] ? static_cast<double>(moe_dropped[layer]) / moe_assignments[layer]
                                 : 0;
      m.moe_max_over_mean_load = std::max(m.moe_max_over_mean_load, agg.max_over_mean_load);
      m.moe.push_back(agg);
    }
    m.step = step_ + 1;
    m.lr = LearningRate(m.step, c_.lr, c_.min_lr, c_.warmup_steps, c_.max_steps);
    m.train_loss = loss_sum / static_cast<double>(std::max<int64_t>(1, targets));
    {
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> norms;
      for (auto& p : model_->parameters()) {
        if (p.value.grad().defined()) norms.push_back(p.value.grad().norm().to(at::kFloat));
      }
      m.grad_norm = at::stack(norms).norm().item<double>();
      const bool finite = std::isfinite(m.train_loss) && std::isfinite(m.grad_norm);
      if (guard.Observe(finite)) {
        return Fail(absl::StrCat("loss or gradient was NaN/Inf for ", guard.streak(),
                                 " consecutive steps (last loss ", m.train_loss,
                                 ", grad norm ", m.grad_norm, ") at step ", m.step,
                                 ": lower optimizer.lr or set optimizer.grad_clip"),
                    false);
      }
      if (finite) {
        if (c_.grad_clip > 0 && m.grad_norm > c_.grad_clip) {
          const double scale = c_.grad_clip / (m.grad_norm + 1e-6);
          for (auto& p : model_->parameters()) {
            if (p.value.grad().defined()) p.value.mutable_grad().mul_(scale);
          }
        }
        opt_->Step(m.lr);
      }
      m.skipped = !finite;
      if (c_.moe_bias_balancing) {
        auto biases = model_->expert_biases();
        for (size_t i = 0; i < biases.size() && i < m.moe.size(); ++i) {
          model::NudgeBias(biases[i].second, m.moe[i].tokens_per_expert, c_.moe_bias_rate);
        }
      }
      if (fp8_) {
        fp8_->OnOptimizerStep();
        const precision::Fp8Stats st = fp8_->TakeStats();
        m.fp8_overflows = st.overflows;
        m.fp8_underflows = st.underflows;
        m.fp8_product_fraction =
            st.total_products ? static_cast<double>(st.fp8_products) / st.total_products : 0;
        bool amax_finite = true;
        for (const auto& [group, amax] : st.amax) {
          m.fp8_amax.emplace_back(group, amax);
          amax_finite = amax_finite && std::isfinite(amax);
        }
        const double overflow_fraction =
            st.elements ? static_cast<double>(st.overflows) / st.elements : 0;
        if (fp8_guard.Observe(amax_finite && overflow_fraction <= 0.01)) {
          return Fail(absl::StrFormat("FP8 statistics went bad for %d steps in a row (step %d: "
                                      "%.2f%% of values overflowed, amax %s): raise "
                                      "precision.fp8_margin or use the current recipe",
                                      fp8_guard.streak(), m.step, 100 * overflow_fraction,
                                      amax_finite ? "finite" : "not finite"),
                      false);
        }
      }
      for (auto& p : model_->parameters()) p.value.mutable_grad() = at::Tensor();
    }
    ++step_;
    tokens_ += real;
    padding_tokens_ += padding;
    m.step_seconds = Seconds(t0, Clock::now());
    m.tokens = tokens_;
    m.padding_tokens = padding_tokens_;
    m.step_tokens = real;
    m.step_padding_tokens = padding;
    m.useful_tokens_per_second = m.step_seconds > 0 ? real / m.step_seconds : 0;
    m.padding_fraction = static_cast<double>(padding) / static_cast<double>(real + padding);
    if (c_.peak_flops > 0 && m.step_seconds > 0) {
      m.mfu = info.flops_per_token * real / m.step_seconds / c_.peak_flops;
    }
    events_->OnStep(m);

    const bool last = step_ == c_.max_steps;
    if (val_ && (step_ % c_.eval_interval_steps == 0 || last)) events_->OnEval(Evaluate());
    if (!c_.checkpoint_dir.empty() &&
        ((c_.checkpoint_interval_steps > 0 && step_ % c_.checkpoint_interval_steps == 0) ||
         last)) {
      if (absl::Status s = SaveCheckpoint(); !s.ok()) {
        return Fail("checkpoint: " + std::string(s.message()), true);
      }
    }
  }
  return {TrainResult::Outcome::kSucceeded,
          absl::StrCat("trained ", step_, " steps, ", tokens_, " tokens"), step_, false};
}

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

TrainResult Train(const TrainConfig& config, TrainEvents* events,
                  const std::atomic<bool>* stop) {
  TrainEvents none;
  std::atomic<bool> never{false};
  Run run(config, events ? events : &none, stop ? stop : &never);
  auto failed = [&](std::string reason) {
    return TrainResult{TrainResult::Outcome::kFailed,
                       absl::StrCat(reason, " (at step ", run.step(), ")"), run.step(), false};
  };
  try {
    return run.Go();
  } catch (const c10::OutOfMemoryError& e) {
    return failed("out of memory: " + FirstLine(e.what_without_backtrace()) +
                  "; lower training.micro_batch_rows or data.seq_len");
  } catch (const c10::Error& e) {
    return failed("LibTorch error: " + FirstLine(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return failed(std::string("error: ") + e.what());
  }
}

}  // namespace tally::train
