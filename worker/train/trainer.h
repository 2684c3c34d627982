// The trainer: a library that trains one model from a plain TrainConfig and
// reports through TrainEvents. It knows nothing of gRPC or protobuf; the
// worker's agent and tally-train adapt a JobSpec to it.
//
// Loop: AdamW (no decay on embeddings and norms), warmup + cosine learning
// rate, gradient accumulation over micro-batches to global_batch_tokens, the
// loss a mean over every real target token of the step, grad-norm clipping;
// FP32 on CPU (or BF16 autocast with `bf16`), BF16 autocast on CUDA, scoped
// to each step and each evaluation (precision/autocast.h) so that every step
// computes with the current weights. Evaluation on the held-out split at
// step 0, every eval_interval_steps and at the end. Checkpoints (model,
// AdamW state and step, token counts, data cursor) every
// checkpoint_interval_steps and at the end; resuming from one continues the
// same loss curve, bit for bit on the CPU. No random number is drawn after
// initialisation (no dropout; the data order is a pure function of the seed
// and the epoch), so the data cursor is all the RNG state a resume needs.
//
// Data parallel: every rank runs Train() with its own rank; each computes
// its share of the micro-batches, and the ranks sum gradients, losses, token
// counts, MoE loads and FP8 overflow counts, take the FP8 amax as the
// maximum over ranks, agree on stopping, and check every
// param_check_interval_steps that their parameters are identical. Rank 0
// alone reports steps, evaluations (computed by all ranks on shards of the
// validation split) and checkpoints, and writes the checkpoints, which carry
// nothing rank-specific: a run resumes with any world size that divides its
// micro-batches. A lost rank fails the others' next collective: they return
// a retryable failure.
//
// Stopping (stop.h): `stop` may be set from any thread. kNow is honoured
// between micro-batches (with several ranks: at the end of the step, which
// none applies). kKeepState lets the step under way finish, then, when
// checkpoint_dir is set, evaluates the state unless the latest evaluation is
// of this step, writes a checkpoint unless the latest one is of this step,
// reports both (OnEval before OnCheckpoint) and returns kStopped. With
// several ranks they vote at the end of every step and stop together, after
// the same step; a vote to keep the state outweighs one to stop at once, and
// the evaluation and checkpoint collectives run on every rank (rank 0
// writes). Reaching max_steps first ends the run as kSucceeded.
//
// kPreempt (a preemption) also lets the step under way finish, but never
// evaluates: it writes a checkpoint of that step unless the latest one is
// of it, reports it (OnCheckpoint) and returns kPreempted. With one rank the
// flag is read once the step is applied (and before the next one starts):
// a request seen then skips even the evaluation the schedule has at that
// step, and the step's scheduled checkpoint is the preemption's. With
// several ranks, preempt is one more vote in the end-of-step collective: a
// preempt vote from ANY rank makes every rank apply that step, skip its
// scheduled evaluation, checkpoint it together (rank 0 writes) and return
// kPreempted; a preempt vote outweighs both a vote to keep the state and
// one to stop at once. A resumed run whose checkpoint is of a step the
// evaluation schedule names, and which was not evaluated (a preemption
// skipped it), evaluates it before its first step, so the evaluation curve
// has no gap. Without a checkpoint_dir, or before any step was trained,
// there is nothing to keep: it stops, saying so, still kPreempted.
//
// Resuming validates the checkpoint against this config before loading
// anything (see Train()).
//
// Thread-safety: Train() runs on the calling thread.
#ifndef TALLY_WORKER_TRAIN_TRAINER_H_
#define TALLY_WORKER_TRAIN_TRAINER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/data/packer.h"
#include "worker/model/config.h"
#include "worker/precision/recipe.h"
#include "worker/train/stop.h"

namespace tally::train {

// The parts of a TrainConfig. The model's shape is model::ModelConfig and
// the FP8 recipe precision::RecipeConfig, the structs the model and the FP8
// converter take as they are, so a knob is copied once: JobSpec ->
// TrainConfig (worker/agent/train_spec.h, for tally-worker and tally-train).
struct DataConfig {
  std::string train_path;  // dataset prefix written by tally-prep
  std::string val_path;    // empty: the "val" split beside train_path
  data::PackingMode packing = data::PackingMode::kPacked;
  int32_t seq_len = 256;
  int32_t shuffle_window = 1024;
};

struct OptimizerConfig {
  double lr = 3e-4, min_lr = 0, weight_decay = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
  double grad_clip = 0;  // 0: no clipping
  int64_t warmup_steps = 0;
  // MoE load balancing: the Switch load-balancing loss and the router
  // z-loss (added to the loss with these weights), and auxiliary-loss-free
  // balancing (each expert's routing bias nudged toward balance at this
  // rate after every step).
  double moe_aux_loss_coef = 0;
  double moe_z_loss_coef = 0;
  bool moe_bias_balancing = false;
  double moe_bias_rate = 1e-3;
  // CUDA runs AdamW fused (one multi-tensor kernel, the gradient norm,
  // clipping and the skip of a non-finite step on the device: optimizer.h);
  // the CPU per parameter. Tests: the fused one on the CPU too.
  bool fused_on_cpu = false;
};

// Data parallel (worker/dist): world_size ranks each compute every
// world_size-th micro-batch of a step, gradients are summed over the ranks
// before the (identical) optimizer step, so a step is the same step a
// single process takes over the same global batch. One rank without a
// rendezvous: no process group.
struct ParallelConfig {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous;            // host:port of rank 0's c10d store
  std::string rendezvous_prefix;     // keys of this attempt in the store
  std::string rendezvous_local_host = "127.0.0.1";  // Gloo binds its connections here
  double collective_timeout_seconds = 120;
  int64_t param_check_interval_steps = 50;  // parameters compared across ranks
  int64_t bucket_bytes = 25 << 20;          // gradient all-reduce buckets
  // Expert parallelism: each rank computes only its block of experts, over
  // every rank's tokens for them (dist/expert_parallel.h); the model's
  // moe.num_experts must be a multiple of world_size.
  bool expert_parallel = false;
};

struct TrainConfig {
  // The model; vocab_size 0: the tokenizer's (258), moe.num_experts 0:
  // dense.
  model::ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  // Loop.
  int64_t max_steps = 100;
  int64_t global_batch_tokens = 0;  // 0: one micro-batch per step
  int32_t micro_batch_rows = 8;
  int64_t eval_interval_steps = 0;  // 0: no evaluation
  int64_t eval_tokens = 0;          // 0: the whole validation split
  int64_t checkpoint_interval_steps = 0;  // 0: only at the end
  uint64_t seed = 0;
  // Precision: FP32 on CPU and BF16 autocast on CUDA, or FP8 linears
  // (worker/precision; emulated on CPU) on top of that, under fp8_recipe.
  // bf16: BF16 autocast on the CPU too (the CUDA path's numerics, so that
  // CPU tests run it); CUDA always computes in BF16. Not with fp8.
  bool bf16 = false;
  bool fp8 = false;
  precision::RecipeConfig fp8_recipe;
  // training.qat: the chosen block linears compute with their weights
  // quantized as a GGUF export holds them (model/ggml_quant.h: straight-
  // through gradient, FP32 master weights, the optimizer unchanged). Not
  // with fp8. nullopt: off.
  std::optional<model::WeightQuantization> qat;
  // training.eval_quantized: every evaluation also scores the model with
  // these layers quantized (EvalMetrics::quantized_val_loss); with qat, the
  // same as qat. nullopt: not scored.
  std::optional<model::WeightQuantization> eval_quantized;
  ParallelConfig parallel;
  // Where and how.
  std::string device = "cpu";       // "cpu" or "cuda:N"
  std::string checkpoint_dir;       // empty: no checkpoints
  // model.init_from: the weights a fresh run starts from (fine-tuning), a
  // Hugging Face folder (config.json + model.safetensors) or a Tally
  // checkpoint; at most one. The model's shape is taken from there: a field
  // `model` states differently fails the run naming it (train/model_io.h).
  std::string init_from_hf;
  std::string init_from_checkpoint;
  // model.init_from.upcycle: the source is dense and `model.moe` makes it
  // Mixture-of-Experts, every expert a copy of its layer's feed-forward
  // (train/model_io.h UpcycleWeights).
  bool upcycle = false;
  double upcycle_noise_std = 0;
  // training.distill: a teacher model (a Hugging Face folder or a Tally
  // checkpoint, one of the two) whose softened predictions the loss also
  // follows: alpha * KL(teacher || student at temperature) * temperature^2
  // + (1 - alpha) * cross-entropy. Off when both paths are empty.
  struct Distill {
    std::string teacher_hf;
    std::string teacher_checkpoint;
    double temperature = 1;
    double alpha = 0.5;
    // The teacher's shape as the spec states it (training.distill.teacher.
    // model), checked against the file; nullopt: not stated.
    std::optional<model::ModelConfig> declared;
    bool on() const { return !teacher_hf.empty() || !teacher_checkpoint.empty(); }
  } distill;
  std::string resume_path;          // a checkpoint to continue from
  std::string resume_sha256;        // checked when not empty
  // tally-worker's --checkpoint_dir: when set, checkpoint_dir (a job's
  // folder) must be a real folder, not a symlink, directly inside this
  // root's resolved folder each time a checkpoint is written there, and the
  // path reported for a checkpoint is resolved (no symlink, no ".." or
  // "."), that of a regular file directly in it; otherwise the checkpoint
  // fails the run (retryable). Empty: the path is reported as written
  // (tally-train).
  std::string checkpoint_root;
  double peak_flops = 0;            // per device, for MFU; 0: not reported
  int max_nonfinite_steps = 3;      // consecutive NaN/Inf steps before failing
  // Tests only (tally-worker's --testonly_* flags), off by default. They
  // damage training on purpose, so that alerts can be seen to fire (with
  // fp8_recipe.test_overflow_fraction and model.moe.test_forced_expert):
  // - Preemptions (StopKind::kPreempt): seconds every rank sleeps before
  //   the preemption's checkpoint (only that one), so that a test can make
  //   it miss the worker's deadline. 0: off.
  // - FP8 MoE runs: grouped expert products are turned off from the start
  //   with this reason, as when CUDA refuses them (StepMetrics::
  //   fp8_grouped_off then carries it). Empty: off.
  // Dense or non-FP8 runs ignore the knob that does not apply to them.
  std::string test_fp8_grouped_off;
  double test_preempt_checkpoint_delay_seconds = 0;
  // Tests (CUDA): every step's forward and backward passes run with CUDA's
  // sync-debug mode set to error, so a call that waits for the device there
  // fails the run, naming it. The CPU ignores it.
  bool test_sync_check = false;

  // InvalidArgument naming the field, for anything Train() cannot run.
  absl::Status Validate() const;
};

struct RunInfo {
  int64_t num_parameters = 0;
  // Held by this rank: fewer than num_parameters when expert parallelism
  // shards the experts.
  int64_t num_resident_parameters = 0;
  int64_t num_embedding_parameters = 0;
  int64_t num_active_parameters = 0;  // per token (all but unrouted experts)
  // Training FLOPs per token; with a distillation teacher, its forward
  // pass's too (teacher_flops_per_token).
  double flops_per_token = 0;
  int64_t teacher_parameters = 0;       // 0: no teacher
  double teacher_flops_per_token = 0;   // forward only
  // The memory this rank's model state needs, activations aside: 16 bytes
  // a resident parameter (FP32 weight, gradient, AdamW m and v) and 4 a
  // teacher parameter (FP32 weight, no gradient, no optimizer state).
  int64_t state_bytes = 0;
  // On a GPU, estimated from the shapes (precision/activation_memory.h):
  // what one micro-batch's forward leaves for its backward (BF16 or FP8,
  // as each path saves it) and the step's weight casts (BF16 copies, or
  // FP8 bytes in both layouts). 0 on the CPU (not estimated). A step needs
  // about state_bytes + weight_cast_bytes + activation_bytes.
  int64_t activation_bytes = 0;
  int64_t weight_cast_bytes = 0;
  int64_t micro_batches_per_step = 0;
  int64_t start_step = 0;          // > 0 when resumed
  int64_t train_docs = 0, val_docs = 0;
  // What each evaluation scores, e.g. "40 of 171 documents, 31204 of 124678
  // tokens (25.0% of the split)"; empty without evaluations.
  std::string eval_coverage;
  double packing_efficiency = 0;   // real / slot tokens of the first epoch's plan
  std::string device;
  std::string attention;           // "block-diagonal mask" or "varlen flash"
  int world_size = 1;              // data-parallel ranks
  std::string backend;             // "gloo" or "nccl"; empty with one rank
  bool expert_parallel = false;    // experts' compute split over the ranks
};

struct StepMetrics {
  int64_t step = 0;
  int64_t tokens = 0;              // real (document) tokens trained on so far
  int64_t padding_tokens = 0;      // padding computed so far
  int64_t step_tokens = 0;         // real tokens this step
  int64_t step_padding_tokens = 0;
  double train_loss = 0;           // mean per target token, this step
  double lr = 0;
  double grad_norm = 0;            // before clipping
  double step_seconds = 0;
  double useful_tokens_per_second = 0;
  double padding_fraction = 0;     // this step
  // Model-FLOPs utilization (0 when no peak is configured), two ways: the
  // PaLM formula (every token attends to the whole seq_len), and what was
  // executed (causal attention within each document: L(L+1)/2 pairs).
  double mfu = 0;
  double mfu_executed = 0;
  bool skipped = false;            // non-finite loss or gradient: no update
  // MoE runs only, for this step: per MoE layer, the tokens each expert
  // took, and summaries over layers.
  struct MoeLayer {
    int64_t layer = 0;
    std::vector<int64_t> tokens_per_expert;
    double max_over_mean_load = 0;
    double router_entropy = 0;
    double dropped_fraction = 0;
  };
  std::vector<MoeLayer> moe;
  double moe_max_over_mean_load = 0;  // the worst layer
  double moe_aux_loss = 0;            // summed over layers, unweighted
  // Distillation: KL(teacher || student) at the temperature, a mean over
  // the step's target tokens (before alpha and T^2); 0 without a teacher.
  double distill_kl = 0;
  // FP8 runs only (zero otherwise), for this step.
  int64_t fp8_overflows = 0;       // values clamped to the format's range
  int64_t fp8_underflows = 0;      // nonzero values that became 0
  int64_t fp8_values = 0;          // values cast to FP8 (the two above among them)
  double fp8_product_fraction = 0; // matrix products computed in FP8
  std::vector<std::pair<std::string, double>> fp8_amax;  // per tensor group
  // FP8 runs: why grouped expert products were turned off for this run (the
  // experts then run one by one); empty while they are on.
  std::string fp8_grouped_off;
};

struct EvalMetrics {
  int64_t step = 0;
  int64_t tokens = 0;
  double val_loss = 0;             // mean per real target token (nats)
  // Each sampled document's mean loss per target token, averaged over the
  // documents: a handful of long documents cannot decide it alone.
  double doc_val_loss = 0;
  int64_t docs = 0;                // documents scored
  double bits_per_byte = 0;
  int64_t target_tokens = 0;
  // TrainConfig::eval_quantized's loss over the same tokens (mean per target
  // token, as val_loss): the model with those layers quantized as the GGUF
  // export will be; the high-precision weights give val_loss (QAT's too).
  std::optional<double> quantized_val_loss;
};

struct CheckpointInfo {
  int64_t step = 0;
  int64_t tokens = 0;
  std::string path;
  std::string sha256;
};

class TrainEvents {
 public:
  virtual ~TrainEvents() = default;
  virtual void OnStart(const RunInfo&) {}
  virtual void OnStep(const StepMetrics&) {}
  virtual void OnEval(const EvalMetrics&) {}
  virtual void OnCheckpoint(const CheckpointInfo&) {}
};

struct TrainResult {
  // kPreempted: stopped by StopKind::kPreempt, on every rank of the group
  // (the reason says whether a checkpoint of the step was kept).
  enum class Outcome { kSucceeded, kStopped, kFailed, kPreempted };
  Outcome outcome = Outcome::kFailed;
  std::string reason;
  int64_t step = 0;
  bool retryable = false;  // a failure another attempt may not repeat
  // kFailed because resume_path is damaged: missing, unreadable as a
  // checkpoint (cut short, a flipped byte), not the recorded SHA-256 (an
  // older file in its place, an edited and resealed metadata block) or with
  // contents inconsistent in themselves (metadata that is not valid, a
  // tensor missing or not finite). Then resume_path, as given; empty for
  // every other failure, including a checkpoint that is intact but does not
  // fit this config (another model, past max_steps, another dataset).
  std::string damaged_checkpoint;
};

// Process-wide: the CPU threads LibTorch uses for one operation (0 leaves
// LibTorch's default, the number of cores).
void SetCpuThreads(int num_threads);

// OK when `device` ("cpu", "cuda:N") can train in this process; otherwise
// FailedPrecondition saying why (no CUDA in this build, no such GPU).
absl::Status CheckDevice(const std::string& device);

// Never throws: LibTorch errors, out-of-memory and persistent non-finite
// losses come back as kFailed with the reason, and so does an evaluation
// whose loss is not finite (it is not reported; the reason names the
// parameter with the largest magnitude), so no run ends with a NaN
// val_loss; and so do model.init_from weights that are not finite or
// exceed kMaxInitialWeight in magnitude (naming the tensor), and a
// checkpoint that cannot resume this config (TrainResult::
// damaged_checkpoint says when the file itself is damaged): resume_path is
// read (DataLoss: corrupt, or not the SHA-256 tallyd recorded) and every
// field is checked before any is used, the failure naming the field and
// what was expected: the model config it was written for, step within [0, max_steps], optimizer step
// within [0, step], token and padding counts non-negative and within what
// `step` steps of this batch can hold, the data cursor within the training
// set's epochs and the epoch's rows, every model, AdamW and expert-bias
// tensor present with this model's name, shape and dtype and finite values,
// FP8 scaling state for this model's layers with finite amax and positive
// scales, and no tensor this model does not have. (No random number is drawn
// after initialisation, so a checkpoint holds no RNG state.)
TrainResult Train(const TrainConfig& config, TrainEvents* events, const StopFlag* stop);

// The largest |weight| model.init_from may hold. Trained models stay many
// orders of magnitude below it; weights far beyond it overflow float32 and
// bfloat16 products in the first forward pass.
inline constexpr double kMaxInitialWeight = 1e6;

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_TRAINER_H_
