// Step times of the two ways to change the model, side by side in one
// process at one shape: a dense model trained a few steps (its checkpoint is
// the source), the same model upcycled to --experts experts (top-2), a
// student of half the layers trained plainly and distilled from the dense
// model (alpha 0.5, temperature 2). Also checks that the upcycled model's
// step-0 validation loss is the dense model's last one. tests/gpu/run.sh runs
// it on the GPU; the rehearsal on the CPU at a toy shape.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, train_path, "", "dataset prefix written by tally-prep");
ABSL_FLAG(std::string, device, "cuda:0", "cpu or cuda:N");
ABSL_FLAG(int, layers, 8, "the dense model's blocks (the student has half)");
ABSL_FLAG(int, d_model, 1024, "model width (heads of 128, or one head below 128)");
ABSL_FLAG(int, seq_len, 1024, "row length");
ABSL_FLAG(int, rows, 8, "rows per micro-batch (one micro-batch per step)");
ABSL_FLAG(int, steps, 12, "optimizer steps per run");
ABSL_FLAG(int, warmup_steps, 3, "steps left out of the timings");
ABSL_FLAG(int, experts, 8, "experts of the upcycled model (top-2)");
ABSL_FLAG(int64_t, eval_tokens, 16384, "validation tokens per evaluation");

namespace {

using tally::train::TrainConfig;

struct Timer : tally::train::TrainEvents {
  explicit Timer(int skip) : skip(skip) {}
  void OnStart(const tally::train::RunInfo& i) override { info = i; }
  void OnStep(const tally::train::StepMetrics& m) override {
    kl = m.distill_kl;
    if (m.step <= skip) return;
    seconds += m.step_seconds;
    tokens += m.step_tokens;
    ++n;
  }
  void OnEval(const tally::train::EvalMetrics& e) override {
    if (first_val < 0) first_val = e.val_loss;
    last_val = e.val_loss;
  }
  void OnCheckpoint(const tally::train::CheckpointInfo& c) override { checkpoint = c.path; }
  int skip;
  tally::train::RunInfo info;
  double seconds = 0, kl = 0, first_val = -1, last_val = -1;
  int64_t tokens = 0;
  int n = 0;
  std::string checkpoint;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (absl::GetFlag(FLAGS_train_path).empty()) {
    std::cerr << "grow_bench: --train_path is required (a tally-prep dataset prefix)\n";
    return 2;
  }
  if (auto s = tally::train::CheckDevice(device); !s.ok()) {
    std::cerr << "grow_bench: --device: " << s.message() << "\n";
    return 2;
  }
  const int steps = absl::GetFlag(FLAGS_steps), skip = absl::GetFlag(FLAGS_warmup_steps);
  const int d_model = absl::GetFlag(FLAGS_d_model);
  if (steps <= skip || d_model < 64 || d_model % 64 != 0 || absl::GetFlag(FLAGS_experts) < 2) {
    std::cerr << "grow_bench: needs --steps > --warmup_steps, --d_model a multiple of 64 and "
                 "--experts >= 2\n";
    return 2;
  }
  char dir[] = "/tmp/tally_grow_bench_XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    std::cerr << "grow_bench: cannot create a folder under /tmp\n";
    return 1;
  }
  TrainConfig base;
  base.data.train_path = absl::GetFlag(FLAGS_train_path);
  base.device = device;
  base.model.num_layers = absl::GetFlag(FLAGS_layers);
  base.model.d_model = d_model;
  base.model.num_heads = d_model >= 128 ? d_model / 128 : 1;
  base.data.seq_len = absl::GetFlag(FLAGS_seq_len);
  base.micro_batch_rows = absl::GetFlag(FLAGS_rows);
  base.max_steps = steps;
  base.eval_interval_steps = steps;
  base.eval_tokens = absl::GetFlag(FLAGS_eval_tokens);
  base.optimizer.lr = 3e-4;
  base.optimizer.warmup_steps = 2;
  base.optimizer.grad_clip = 1.0;
  base.seed = 1;

  std::cout << absl::StrFormat(
      "%d x %d tokens per step on %s; steps %d-%d timed\n"
      "| run | parameters | ms/step | useful tokens/s | note |\n|---|---|---|---|---|\n",
      base.micro_batch_rows, base.data.seq_len, device, skip + 1, steps);
  auto run = [&](const char* name, const TrainConfig& c, Timer* t) {
    const tally::train::TrainResult r = tally::train::Train(c, t, nullptr);
    if (r.outcome != tally::train::TrainResult::Outcome::kSucceeded || t->n == 0) {
      std::cerr << "grow_bench: " << name << " failed: " << r.reason << "\n";
      std::exit(1);
    }
    return 1000 * t->seconds / t->n;
  };
  auto row = [](const char* name, const Timer& t, double ms, const std::string& note) {
    std::cout << absl::StrFormat("| %s | %.3gM | %.1f | %.0f | %s |\n", name,
                                 t.info.num_parameters / 1e6, ms, t.tokens / t.seconds, note)
              << std::flush;
  };

  TrainConfig dense = base;
  dense.checkpoint_dir = std::string(dir) + "/dense";
  Timer td(skip);
  const double dense_ms = run("dense", dense, &td);
  row("dense", td, dense_ms, absl::StrFormat("val_loss %.4f at step %d", td.last_val, steps));

  TrainConfig up = base;
  up.init_from_checkpoint = td.checkpoint;
  up.upcycle = true;
  up.model.moe.num_experts = absl::GetFlag(FLAGS_experts);
  up.model.moe.top_k = 2;
  up.optimizer.moe_bias_balancing = true;
  Timer tu(skip);
  const double up_ms = run("upcycled", up, &tu);
  const double diff = std::abs(tu.first_val - td.last_val);
  row("upcycled", tu, up_ms,
      absl::StrFormat("%d experts top-2; step-0 val_loss %.6f (dense %.6f, %s); %.2fx dense",
                      up.model.moe.num_experts, tu.first_val, td.last_val,
                      diff <= 2e-3 * td.last_val ? "equal" : "DIFFERS", up_ms / dense_ms));

  TrainConfig student = base;
  student.model.num_layers = std::max<int64_t>(1, base.model.num_layers / 2);
  Timer ts(skip);
  const double student_ms = run("student", student, &ts);
  row("student", ts, student_ms, absl::StrFormat("%d layers", student.model.num_layers));

  TrainConfig distilled = student;
  distilled.distill.teacher_checkpoint = td.checkpoint;
  distilled.distill.temperature = 2;
  distilled.distill.alpha = 0.5;
  Timer tx(skip);
  const double distilled_ms = run("distilled", distilled, &tx);
  row("distilled", tx, distilled_ms,
      absl::StrFormat("teacher forward %.3g GFLOP/token; kl %.4f; %.2fx the plain student",
                      tx.info.teacher_flops_per_token / 1e9, tx.kl, distilled_ms / student_ms));
  std::cout << absl::StrFormat("upcycled / dense step time: %.3f; distilled / plain: %.3f\n",
                               up_ms / dense_ms, distilled_ms / student_ms);
  return diff <= 2e-3 * td.last_val ? 0 : 1;
}
