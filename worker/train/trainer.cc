#include "worker/train/trainer.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

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

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

class Run {
 public:
  Run(const TrainConfig& c, TrainEvents* events, const StopFlag* stop)
      : c_(c), events_(events), stop_(stop), device_(c.device) {}

  TrainResult Go();
  int64_t step() const { return state_.step; }

 private:
  // Set-up, in Go's order. The training and validation data, and the data
  // cursor.
  std::optional<TrainResult> OpenData();
  // The model (this rank's experts under expert parallelism), its optimizer
  // and FP8 linears.
  void BuildModel();
  // With several ranks (or a rendezvous): the process group, gradient
  // buckets and expert exchange; checks that the ranks start alike.
  std::optional<TrainResult> JoinGroup();
  RunInfo Info() const;
  bool expert_parallel() const {
    return c_.parallel.expert_parallel && c_.model.moe.num_experts > 0 &&
           c_.parallel.world_size > 1;
  }

  // One step: its batch, forward and backward, the sum over ranks, the
  // update, the report, then what follows it. A result ends the run.
  std::optional<TrainResult> TrainStep(TrainEvents* report, NonFiniteGuard* guard,
                                       NonFiniteGuard* fp8_guard);
  // Data parallel: the step's totals summed over the ranks in one
  // collective (dist/step_reduce.h), with their stop votes; gradients
  // every rank agrees exist; the FP8 amax the largest any rank saw. How the
  // group ends the step; on kStopNow nothing else is summed.
  absl::StatusOr<dist::StepEnd> ReduceStep(StepTotals* t);
  // The gradient norm, the non-finite and FP8 guards, clipping, the
  // optimizer step and the MoE bias nudge, into `m`; a result when a guard
  // fails the run.
  std::optional<TrainResult> ApplyStep(const StepTotals& t, NonFiniteGuard* guard,
                                       NonFiniteGuard* fp8_guard, StepMetrics* m);
  // Once the step is applied and reported: its scheduled evaluation and
  // checkpoint (or parameter check), then a preemption or a stop keeping
  // the state.
  std::optional<TrainResult> AfterStep(dist::StepEnd end, TrainEvents* report);

  TrainResult Fail(std::string reason, bool retryable) {
    return {TrainResult::Outcome::kFailed, std::move(reason), state_.step, retryable};
  }
  TrainResult Stopped(const std::string& detail = "") const {
    return {TrainResult::Outcome::kStopped, absl::StrCat("stopped at step ", state_.step, detail),
            state_.step, false};
  }
  // A stop that keeps the state (stop.h): every rank calls it at the same
  // step boundary.
  TrainResult StopKeepingState(TrainEvents* report);
  // A preemption (stop.h): every rank calls it at the same step boundary.
  TrainResult StopPreempting();
  TrainResult Preempted(const std::string& detail) const {
    // Retryable: another attempt resumes it (tallyd requeues a preemption
    // without counting it against max_attempts).
    return {TrainResult::Outcome::kPreempted,
            absl::StrCat("preempted at step ", state_.step, detail), state_.step, true};
  }
  // Checks that the ranks' parameters agree, gathers sharded experts and
  // writes a checkpoint of this step on rank 0. Every rank calls it; a
  // failure to report otherwise.
  std::optional<TrainResult> CheckpointOnAllRanks();
  EvalMetrics Evaluate();
  // Evaluate() and report it. A loss that is not finite at this run's first
  // evaluation (the weights it started from overflow: init_from, a resumed
  // checkpoint) is a failure instead, never reported; after a finite one it
  // is reported like any other, and the controller's divergence rule stops
  // the job keeping its best checkpoint. Every rank sees the same summed
  // loss, so all decide alike.
  std::optional<TrainResult> EvaluateAndReport(TrainEvents* report);
  bool evaluated_finite_ = false;  // this run has reported a finite evaluation
  // "PARAM (largest |weight| X)": the parameter with the largest magnitude,
  // for a failure the weights may explain.
  std::string LargestWeight();
  bool lead() const { return c_.parallel.rank == 0; }
  // Sums `v` over the ranks (a no-op with one rank).
  void SumOverRanks(std::vector<double>* v);
  // FailedPrecondition naming the first parameter whose value differs
  // between ranks.
  absl::Status CheckParametersAgree();
  // Expert parallelism: each sharded parameter whole again, with its AdamW
  // moments (value, m, v), by parameter index, on rank 0 (in host memory);
  // empty elsewhere and without sharding. Every rank takes part.
  std::map<size_t, std::array<at::Tensor, 3>> GatherShards();
  absl::Status SaveCheckpoint(const std::map<size_t, std::array<at::Tensor, 3>>& whole);
  absl::Status LoadCheckpoint();
  // Copies model.init_from's weights into the model (a fresh run).
  absl::Status LoadInitialWeights(const InitialWeights& w);
  // training.distill: reads the teacher, checks it against the spec's
  // declared shape, the data's tokenizer and the student's vocabulary, and
  // builds it for forward passes only.
  absl::Status LoadTeacher();
  // The training data's tokenizer as checkpoints record it, and a check
  // that `theirs` (a checkpoint's record) is the same.
  nlohmann::json TokenizerJson() const;
  absl::Status CheckTokenizer(const nlohmann::json& theirs, const std::string& source) const;
  // Everything in a checkpoint's metadata and tensors that LoadCheckpoint
  // uses, checked against this run before anything is loaded. Moves the data
  // cursor to the checkpoint's epoch (to count its rows).
  absl::Status CheckCheckpoint(const nlohmann::json& meta,
                               const std::map<std::string, at::Tensor>& tensors);
  // FailedPrecondition naming the first model field in which the
  // checkpoint's fingerprint differs from this run's.
  absl::Status CheckFingerprint(const std::string& theirs) const;
  std::string Fingerprint() const;

  TrainConfig c_;  // a copy: model.init_from completes its model
  nlohmann::json init_from_json_;  // InitialWeights::provenance, kept in checkpoints
  TrainEvents* events_;
  const StopFlag* stop_;
  at::Device device_;
  // BF16 autocast in steps and evaluations: always on CUDA, with `bf16` on
  // the CPU.
  bool autocast_ = device_.is_cuda() || c_.bf16;
  model::AttentionKernel kernel_ = model::AttentionKernel::kMaskedSdpa;
  std::unique_ptr<data::Dataset> train_, val_;
  std::unique_ptr<data::RowStream> rows_;
  std::unique_ptr<model::Transformer> model_;
  std::unique_ptr<model::Transformer> teacher_;  // training.distill; forward only
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<precision::Fp8Linears> fp8_;
  std::vector<data::Row> eval_rows_;
  std::unique_ptr<dist::Group> group_;  // null with one rank
  std::unique_ptr<dist::GradientSync> sync_;  // with group_
  std::unique_ptr<dist::Group> expert_group_;    // expert parallelism
  std::unique_ptr<dist::ExpertExchange> exchange_;
  std::unique_ptr<dist::ExpertParallel> experts_;
  TrainState state_;
  int64_t micro_per_step_ = 1;
  double flops_per_token_ = 0;
};

std::string Run::Fingerprint() const {
  return absl::StrCat(
      "layers=", c_.model.num_layers, " d_model=", c_.model.d_model, " heads=", c_.model.num_heads,
      " d_ff=", model_->config().d_ff, " vocab=", model_->config().vocab_size,
      " seq_len=", c_.data.seq_len, " packing=", data::PackingModeName(c_.data.packing),
      " seed=", c_.seed,
      c_.model.moe.num_experts > 0
          ? absl::StrCat(" moe=", c_.model.moe.num_experts, "x", c_.model.moe.top_k, "/every",
                         c_.model.moe.every_n_layers, c_.model.moe.shared_expert ? "/shared" : "",
                         c_.model.moe.sigmoid_router ? "/sigmoid" : "/softmax", "/cap",
                         c_.model.moe.capacity_factor)
          : "",
      c_.fp8 ? absl::StrCat(" fp8=", precision::RecipeName(c_.fp8_recipe.recipe), "/",
                            c_.fp8_recipe.history_len, "/", c_.fp8_recipe.margin)
             : "");
}

EvalMetrics Run::Evaluate() {
  at::NoGradGuard no_grad;
  // Evaluation computes like training but never moves the FP8 scales; its
  // autocast region reads the weights as they are now.
  precision::AutocastRegion autocast(device_.type(), autocast_);
  if (fp8_) fp8_->SetTraining(false);
  double loss_sum = 0;
  int64_t targets = 0, text_targets = 0;
  // Chunks of micro_batch_rows rows, dealt round-robin to the ranks. With
  // expert parallelism every rank runs as many forward passes as the
  // busiest (they exchange tokens in each), discarding the extra ones.
  const size_t rows = static_cast<size_t>(c_.micro_batch_rows);
  const size_t chunks = (eval_rows_.size() + rows - 1) / rows;
  const size_t W = static_cast<size_t>(c_.parallel.world_size);
  const size_t passes = exchange_ ? (chunks + W - 1) / W : chunks;
  for (size_t t = 0; t < passes; ++t) {
    const size_t chunk = exchange_ ? t * W + c_.parallel.rank : t;
    // Another rank's chunk.
    if (!exchange_ && chunk % W != static_cast<size_t>(c_.parallel.rank)) continue;
    const bool extra = chunk >= chunks;
    const size_t i = (extra ? 0 : chunk) * rows;
    const size_t n = std::min(rows, eval_rows_.size() - i);
    const data::MicroBatch mb = data::BuildMicroBatch(
        *val_, absl::MakeConstSpan(eval_rows_).subspan(i, n), c_.data.seq_len,
        data::PackingMode::kPacked);
    const double loss = LossSum(*model_, ToDevice(mb, device_), kernel_).ce_sum.item<double>();
    if (extra) continue;
    loss_sum += loss;
    targets += mb.num_targets;
    text_targets += mb.text_targets;
  }
  std::vector<double> sums = {loss_sum, static_cast<double>(targets),
                              static_cast<double>(text_targets)};
  SumOverRanks(&sums);
  loss_sum = sums[0];
  targets = static_cast<int64_t>(sums[1]);
  text_targets = static_cast<int64_t>(sums[2]);
  EvalMetrics e;
  e.step = state_.step;
  e.tokens = state_.tokens;
  e.target_tokens = targets;
  e.val_loss = targets ? loss_sum / targets : 0;
  // Bits per byte of text whatever the tokenizer: the text targets stand
  // for the bytes of text they were prepared from (tally-prep records the
  // ratio; 1 for the byte tokenizer, unknown for pre-tokenized input).
  const double target_bytes = static_cast<double>(text_targets) * val_->bytes_per_text_token();
  e.bits_per_byte = target_bytes > 0 ? loss_sum / std::log(2.0) / target_bytes : 0;
  state_.last_eval_step = state_.step;
  if (fp8_) fp8_->SetTraining(true);
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

absl::Status Run::CheckParametersAgree() {
  if (!group_) return absl::OkStatus();
  at::NoGradGuard no_grad;
  auto& params = model_->parameters();
  // Each parameter's sum and sum of squares, in FP64 on the host; the
  // maximum over ranks of (x, -x) is (x, -x) again only when all agree.
  // Sharded experts differ by design.
  std::vector<size_t> checked;
  std::vector<at::Tensor> parts;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].sharded) continue;
    checked.push_back(i);
    at::Tensor v = params[i].value.detach().to(at::kDouble);
    parts.push_back(v.sum().reshape({1}));
    parts.push_back(v.square().sum().reshape({1}));
  }
  at::Tensor x = at::cat(parts).cpu();
  at::Tensor both = at::cat({x, -x});
  group_->AllReduceMax(both);
  const int64_t n = x.numel();
  const at::Tensor hi = both.narrow(0, 0, n), lo = -both.narrow(0, n, n);
  const at::Tensor differ = hi.ne(lo).nonzero();
  if (differ.numel() == 0) return absl::OkStatus();
  const int64_t i = differ[0][0].item<int64_t>();
  return absl::FailedPreconditionError(absl::StrCat(
      "parameter ", params[checked[i / 2]].name, " differs between ranks at step ", state_.step,
      " (", i % 2 ? "sum of squares" : "sum", " from ", lo[i].item<double>(), " to ",
      hi[i].item<double>(), ")"));
}

std::map<size_t, std::array<at::Tensor, 3>> Run::GatherShards() {
  std::map<size_t, std::array<at::Tensor, 3>> whole;
  auto& params = model_->parameters();
  std::vector<size_t> sharded;
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].sharded) sharded.push_back(i);
  }
  if (sharded.empty() || !group_) return whole;
  at::NoGradGuard no_grad;
  const int W = c_.parallel.world_size;
  auto local = [&](size_t i, int k) -> at::Tensor {  // value, m, v
    return k == 0 ? params[i].value.detach() : k == 1 ? opt_->m()[i] : opt_->v()[i];
  };
  // Only rank 0, which writes the checkpoint, assembles the whole tensors,
  // in host memory; the others hold one extra block at a time.
  if (lead()) {
    for (size_t i : sharded) {
      for (int k = 0; k < 3; ++k) {
        const at::Tensor t = local(i, k);
        std::vector<int64_t> shape = t.sizes().vec();
        shape[0] *= W;
        whole[i][k] = at::empty(shape, t.options().device(at::kCPU));
      }
    }
  }
  // Each rank's blocks in turn, from that rank to all.
  for (int j = 0; j < W; ++j) {
    for (size_t i : sharded) {
      for (int k = 0; k < 3; ++k) {
        const at::Tensor t = local(i, k);
        at::Tensor block = j == c_.parallel.rank ? t : at::empty_like(t);  // the root only sends
        group_->Broadcast({block}, j);
        if (lead()) whole[i][k].narrow(0, j * t.size(0), t.size(0)).copy_(block);
      }
    }
  }
  return whole;
}

absl::Status Run::SaveCheckpoint(const std::map<size_t, std::array<at::Tensor, 3>>& whole) {
  std::error_code ec;
  std::filesystem::create_directories(c_.checkpoint_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot create ", c_.checkpoint_dir, ": ", ec.message()));
  }
  // tally-worker: never into a job folder that is a symlink (it could lead
  // into another job's folder, or anywhere).
  const bool confined = !c_.checkpoint_root.empty();
  if (confined) RETURN_IF_ERROR(CheckCheckpointFolder(c_.checkpoint_dir, c_.checkpoint_root));
  const std::string name = absl::StrFormat("step-%08d.ckpt", state_.step);
  const std::string path = absl::StrCat(c_.checkpoint_dir, "/", name);
  CheckpointData data;
  nlohmann::json meta = CheckpointMetadata(state_, opt_->step(), rows_->cursor(), Fingerprint());
  meta["model"] = ModelConfigJson(model_->config());
  meta["seq_len"] = c_.data.seq_len;
  meta["tokenizer"] = TokenizerJson();
  if (init_from_json_.is_object()) meta["init_from"] = init_from_json_;
  data.metadata_json = meta.dump();
  auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    // Checkpoints hold the whole model: any world size resumes from them.
    auto it = whole.find(i);
    const bool w = it != whole.end();
    data.tensors.emplace_back("model." + params[i].name, w ? it->second[0] : params[i].value);
    data.tensors.emplace_back("adamw.m." + params[i].name, w ? it->second[1] : opt_->m()[i]);
    data.tensors.emplace_back("adamw.v." + params[i].name, w ? it->second[2] : opt_->v()[i]);
  }
  if (fp8_) {
    for (auto& t : fp8_->State()) data.tensors.push_back(std::move(t));
  }
  for (const auto& [layer, bias] : model_->expert_biases()) {
    data.tensors.emplace_back(absl::StrCat("moe.layers.", layer, ".bias"), bias);
  }
  auto sha = WriteCheckpoint(path, data);
  if (!sha.ok()) return sha.status();
  // After the checkpoint is in place: a sidecar never vouches for a file
  // that is not there yet.
  RETURN_IF_ERROR(WriteChecksumFile(path, *sha));
  std::string reported = path;
  if (confined) {
    ASSIGN_OR_RETURN(reported,
                     ResolvedCheckpointPath(c_.checkpoint_dir, name, c_.checkpoint_root));
  }
  events_->OnCheckpoint({state_.step, state_.tokens, reported, *sha});  // rank 0 only
  return absl::OkStatus();
}

// "k1=v1 k2=v2 ..." (Fingerprint()) as ordered pairs.
std::vector<std::pair<std::string, std::string>> FingerprintFields(const std::string& f) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view part : absl::StrSplit(f, ' ', absl::SkipEmpty())) {
    const size_t eq = part.find('=');
    out.emplace_back(std::string(part.substr(0, eq)),
                     eq == absl::string_view::npos ? "" : std::string(part.substr(eq + 1)));
  }
  return out;
}

bool AllFinite(const at::Tensor& t) { return at::isfinite(t).all().item<bool>(); }

// A resume failure that says the checkpoint file itself is bad (missing,
// cut, a flipped byte, not the recorded SHA-256, contents inconsistent in
// themselves: ReadCheckpoint's NotFound and DataLoss, CheckCheckpoint's
// InvalidArgument), as opposed to an intact one that does not fit this run
// (FailedPrecondition) or this process's trouble reading it.
bool IsCheckpointDamage(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound || s.code() == absl::StatusCode::kDataLoss ||
         s.code() == absl::StatusCode::kInvalidArgument;
}

absl::Status Run::CheckFingerprint(const std::string& theirs) const {
  const std::string ours = Fingerprint();
  if (theirs == ours) return absl::OkStatus();
  const auto a = FingerprintFields(theirs), b = FingerprintFields(ours);
  std::map<std::string, std::string> in_theirs(a.begin(), a.end());
  std::map<std::string, std::string> in_ours(b.begin(), b.end());
  std::string what;
  for (const auto& [key, value] : b) {
    auto it = in_theirs.find(key);
    if (it == in_theirs.end() || it->second != value) {
      what = absl::StrCat(key, " is ", it == in_theirs.end() ? "unset" : it->second,
                          " there and ", value, " in this job's spec");
      break;
    }
  }
  if (what.empty()) {
    for (const auto& [key, value] : a) {
      if (!in_ours.count(key)) {
        what = absl::StrCat(key, " is ", value, " there and unset in this job's spec");
        break;
      }
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "was written for a different job", what.empty() ? "" : ": ", what, " (checkpoint: ", theirs,
      "; this job: ", ours, ")"));
}

absl::Status Run::CheckCheckpoint(const nlohmann::json& meta,
                                  const std::map<std::string, at::Tensor>& tensors) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  auto mismatch = [](auto&&... parts) {
    return absl::FailedPreconditionError(absl::StrCat(parts...));
  };
  if (!meta.is_object()) return invalid("metadata is not a JSON object");
  const auto fp = meta.find("fingerprint");
  if (fp == meta.end() || !fp->is_string()) {
    return invalid("metadata field fingerprint is missing or not a string");
  }
  RETURN_IF_ERROR(CheckFingerprint(fp->get<std::string>()));
  if (auto tok = meta.find("tokenizer"); tok != meta.end()) {
    if (!tok->is_object()) return invalid("metadata field tokenizer is not an object");
    RETURN_IF_ERROR(CheckTokenizer(*tok, "the checkpoint"));
  }

  ASSIGN_OR_RETURN(const int64_t step, MetadataInt(meta, "step"));
  ASSIGN_OR_RETURN(const int64_t tokens, MetadataInt(meta, "tokens"));
  ASSIGN_OR_RETURN(const int64_t padding, MetadataInt(meta, "padding_tokens"));
  ASSIGN_OR_RETURN(const int64_t opt_step, MetadataInt(meta, "optimizer_step"));
  ASSIGN_OR_RETURN(const int64_t epoch, MetadataInt(meta, "cursor_epoch"));
  ASSIGN_OR_RETURN(const int64_t row, MetadataInt(meta, "cursor_row"));
  if (step < 0) return invalid("step is ", step, " (expected >= 0)");
  if (step > c_.max_steps) {
    return mismatch("step is ", step, ", past this job's training.max_steps (", c_.max_steps,
                    ")");
  }
  if (opt_step < 0 || opt_step > step) {
    return invalid("optimizer_step is ", opt_step, " (expected between 0 and step, ", step, ")");
  }
  if (tokens < 0) return invalid("tokens is ", tokens, " (expected >= 0)");
  if (padding < 0) return invalid("padding_tokens is ", padding, " (expected >= 0)");
  // Every step trains at least one real token (a row holds a document), and
  // no step computes more slots than this job's batch has.
  if (tokens < step) {
    return invalid("tokens is ", tokens, " after ", step, " steps (expected at least one a step)");
  }
  const int64_t micro_tokens = int64_t{c_.data.seq_len} * c_.micro_batch_rows;
  const int64_t slots_per_step =
      c_.global_batch_tokens > 0 ? c_.global_batch_tokens : micro_tokens;
  if (tokens > step * slots_per_step || padding > step * slots_per_step - tokens) {
    return invalid("tokens (", tokens, ") and padding_tokens (", padding,
                   ") are more than ", step, " steps of this job's batch (", slots_per_step,
                   " token slots a step) hold");
  }
  // Every finished epoch trained every token of the training set once.
  const int64_t train_tokens = std::max<int64_t>(1, train_->num_tokens());
  if (epoch < 0 || epoch > tokens / train_tokens) {
    return mismatch("cursor_epoch is ", epoch, " (expected between 0 and ",
                    tokens / train_tokens, ": ", tokens, " tokens trained over a training set of ",
                    train_tokens, " tokens in ", train_->prefix(), ")");
  }
  rows_->Seek({epoch, 0});
  const int64_t epoch_rows = rows_->epoch_stats().rows;
  if (row < 0 || row > epoch_rows) {
    return mismatch("cursor_row is ", row, " (expected between 0 and ", epoch_rows,
                    ", the rows of epoch ", epoch, " of ", train_->prefix(), ")");
  }
  if (const auto ev = meta.find("evaluated"); ev != meta.end() && !ev->is_boolean()) {
    return invalid("metadata field evaluated is ", ev->dump().substr(0, 40),
                   " (expected true or false)");
  }

  // Tensors: what this model holds, whole (sharded experts included).
  struct Want {
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    bool non_negative;  // AdamW's second moment
  };
  std::map<std::string, Want> want;
  const auto& params = model_->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    std::vector<int64_t> shape = params[i].value.sizes().vec();
    if (params[i].sharded && !shape.empty()) shape[0] *= c_.parallel.world_size;
    const at::ScalarType dtype = params[i].value.scalar_type();
    want["model." + params[i].name] = {shape, dtype, false};
    want["adamw.m." + params[i].name] = {shape, opt_->m()[i].scalar_type(), false};
    want["adamw.v." + params[i].name] = {shape, opt_->v()[i].scalar_type(), true};
  }
  for (const auto& [layer, bias] : model_->expert_biases()) {
    want[absl::StrCat("moe.layers.", layer, ".bias")] = {bias.sizes().vec(), bias.scalar_type(),
                                                          false};
  }
  auto shape_str = [](absl::Span<const int64_t> s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); };
  for (const auto& [name, w] : want) {
    const auto it = tensors.find(name);
    if (it == tensors.end()) return invalid("tensor ", name, " is missing");
    const at::Tensor& t = it->second;
    if (t.scalar_type() != w.dtype) {
      return invalid("tensor ", name, " is ", c10::toString(t.scalar_type()), " (expected ",
                     c10::toString(w.dtype), ")");
    }
    if (!t.sizes().equals(w.shape)) {
      return invalid("tensor ", name, " has shape ", shape_str(t.sizes()), " (expected ",
                     shape_str(w.shape), ", this model's)");
    }
    if (!AllFinite(t)) return invalid("tensor ", name, " holds NaN or Inf");
    if (w.non_negative && t.numel() > 0 && t.min().item<double>() < 0) {
      return invalid("tensor ", name, " holds negative values (a second moment is >= 0)");
    }
  }
  // Anything else is FP8 scaling state (precision/converter.h), checked by
  // the converter against this model's layers and recipe.
  std::map<std::string, at::Tensor> fp8_state;
  for (const auto& [name, t] : tensors) {
    if (want.count(name)) continue;
    if (!fp8_ || name.rfind("fp8.", 0) != 0) {
      return invalid("tensor ", name, " is not part of this model");
    }
    fp8_state.emplace(name, t);
  }
  if (fp8_) RETURN_IF_ERROR(fp8_->CheckState(fp8_state, model_->LinearSites(), step));
  return absl::OkStatus();
}

absl::Status Run::LoadCheckpoint() {
  auto data = ReadCheckpoint(c_.resume_path, c_.resume_sha256);
  if (!data.ok()) return data.status();
  auto in_file = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat("checkpoint ", c_.resume_path, ": ", s.message()));
  };
  // Ours are a few hundred bytes; this bounds what a hostile one can make
  // the parser allocate.
  constexpr size_t kMaxMetadataBytes = 1 << 16;
  if (data->metadata_json.size() > kMaxMetadataBytes) {
    return in_file(absl::InvalidArgumentError(absl::StrCat(
        "metadata is ", data->metadata_json.size(), " bytes (at most ", kMaxMetadataBytes,
        " expected)")));
  }
  const nlohmann::json meta = nlohmann::json::parse(data->metadata_json, nullptr, false);
  if (meta.is_discarded()) {
    return in_file(absl::InvalidArgumentError("metadata is not valid JSON"));
  }
  std::map<std::string, at::Tensor> by_name(data->tensors.begin(), data->tensors.end());
  if (absl::Status s = CheckCheckpoint(meta, by_name); !s.ok()) return in_file(s);
  // Where the run's weights first came from stays recorded.
  if (auto it = meta.find("init_from"); it != meta.end() && it->is_object()) {
    init_from_json_ = *it;
  }

  auto& params = model_->parameters();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    for (auto [prefix, dst] : {std::pair{"model.", params[i].value},
                               std::pair{"adamw.m.", opt_->m()[i]},
                               std::pair{"adamw.v.", opt_->v()[i]}}) {
      at::Tensor src = by_name.at(prefix + params[i].name);
      if (params[i].sharded) {
        src = src.narrow(0, c_.parallel.rank * dst.size(0), dst.size(0));  // this rank's experts
      }
      dst.copy_(src);
    }
  }
  for (auto& [layer, bias] : model_->expert_biases()) {
    bias.copy_(by_name.at(absl::StrCat("moe.layers.", layer, ".bias")));
  }
  if (fp8_) {
    std::string bad;
    if (!fp8_->LoadState(by_name, &bad)) {
      return in_file(absl::InvalidArgumentError("FP8 scaling state " + bad + " is unreadable"));
    }
  }
  state_ = ResumedState(meta);
  opt_->set_step(meta["optimizer_step"].get<int64_t>());
  rows_->Seek(ResumedCursor(meta));
  return absl::OkStatus();
}

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
    data::PackOptions eval_opts;
    eval_opts.seq_len = c_.data.seq_len;
    eval_opts.shuffle = false;
    int64_t taken = 0;
    for (data::Row& r : data::PlanEpoch(val_->DocLengths(), eval_opts, 0)) {
      if (c_.eval_tokens > 0 && taken >= c_.eval_tokens) break;
      taken += r.num_tokens;
      eval_rows_.push_back(std::move(r));
    }
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
  info.micro_batches_per_step = micro_per_step_;
  info.start_step = state_.step;
  info.train_docs = train_->num_docs();
  info.val_docs = val_ ? val_->num_docs() : 0;
  info.packing_efficiency = rows_->epoch_stats().efficiency();
  info.device = c_.device;
  info.attention = kernel_ == model::AttentionKernel::kVarlenFlash ? "varlen flash"
                                                                    : "block-diagonal mask";
  info.world_size = c_.parallel.world_size;
  info.backend = group_ ? group_->backend() : "";
  info.expert_parallel = exchange_ != nullptr;
  return info;
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
  Run run(config, events ? events : &none, stop ? stop : &never);
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
