// Packing benchmark: the same model, corpus, seed and number of optimizer
// steps, trained once per packing mode in one process, side by side. Reports
// useful (document) tokens per second, padding, and the validation loss each
// mode reaches. Not a test: it asserts nothing; the README records its table.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, train_path, "", "dataset prefix written by tally-prep");
ABSL_FLAG(int, steps, 60, "optimizer steps per mode");
ABSL_FLAG(int, warmup_steps, 5, "steps left out of the throughput numbers");
ABSL_FLAG(int, seq_len, 512, "row length");
ABSL_FLAG(int, rows, 8, "rows per micro-batch");
ABSL_FLAG(int, d_model, 128, "model width");
ABSL_FLAG(int, layers, 2, "transformer blocks");
ABSL_FLAG(int, threads, 0, "CPU threads (0: LibTorch's default)");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");

namespace {

struct Tally : tally::train::TrainEvents {
  explicit Tally(int skip) : skip(skip) {}
  void OnStep(const tally::train::StepMetrics& m) override {
    last = m;
    if (m.step <= skip) return;
    seconds += m.step_seconds;
    useful += m.step_tokens;
    padding += m.step_padding_tokens;
  }
  void OnEval(const tally::train::EvalMetrics& e) override { val_loss = e.val_loss; }
  int skip;
  double seconds = 0;
  int64_t useful = 0, padding = 0;
  double val_loss = 0;
  tally::train::StepMetrics last;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_train_path).empty()) {
    std::cerr << "packing_bench: --train_path is required (scripts/bench.sh prepares one)\n";
    return 2;
  }
  tally::train::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  if (auto s = tally::train::CheckDevice(absl::GetFlag(FLAGS_device)); !s.ok()) {
    std::cerr << "packing_bench: --device: " << s.message() << "\n";
    return 2;
  }
  const std::vector<tally::data::PackingMode> modes = {
      tally::data::PackingMode::kPacked, tally::data::PackingMode::kPadToSeqLen,
      tally::data::PackingMode::kPadToLongest};
  std::cout << absl::StrFormat(
      "%d steps of %d x %d tokens, d_model %d, %d layers, on %s; throughput after step %d\n",
      absl::GetFlag(FLAGS_steps), absl::GetFlag(FLAGS_rows), absl::GetFlag(FLAGS_seq_len),
      absl::GetFlag(FLAGS_d_model), absl::GetFlag(FLAGS_layers), absl::GetFlag(FLAGS_device),
      absl::GetFlag(FLAGS_warmup_steps));
  std::cout << "| packing | useful tokens/s | padding | ms/step | useful tokens | val loss |\n"
               "|---|---|---|---|---|---|\n";
  double packed_rate = 0;
  for (auto mode : modes) {
    tally::train::TrainConfig c;
    c.data.train_path = absl::GetFlag(FLAGS_train_path);
    c.model.num_layers = absl::GetFlag(FLAGS_layers);
    c.model.d_model = absl::GetFlag(FLAGS_d_model);
    c.model.num_heads = c.model.d_model / 32;
    c.data.seq_len = absl::GetFlag(FLAGS_seq_len);
    c.micro_batch_rows = absl::GetFlag(FLAGS_rows);
    c.max_steps = absl::GetFlag(FLAGS_steps);
    c.data.packing = mode;
    c.optimizer.lr = 3e-3;
    c.optimizer.min_lr = 3e-4;
    c.optimizer.warmup_steps = 5;
    c.optimizer.grad_clip = 1.0;
    c.eval_interval_steps = c.max_steps;  // at step 0 and at the end
    c.eval_tokens = 32768;
    c.seed = 1;
    c.device = absl::GetFlag(FLAGS_device);
    Tally t(absl::GetFlag(FLAGS_warmup_steps));
    auto r = tally::train::Train(c, &t, nullptr);
    if (r.outcome != tally::train::TrainResult::Outcome::kSucceeded) {
      std::cerr << "packing_bench: " << tally::data::PackingModeName(mode) << ": " << r.reason
                << "\n";
      return 1;
    }
    const int timed = c.max_steps - t.skip;
    const double rate = t.useful / t.seconds;
    if (mode == tally::data::PackingMode::kPacked) packed_rate = rate;
    std::cout << absl::StrFormat(
        "| %s | %.0f%s | %.1f%% | %.1f | %d | %.4f |\n", tally::data::PackingModeName(mode),
        rate, mode == tally::data::PackingMode::kPacked
                  ? std::string("")
                  : absl::StrFormat(" (packed is %.2fx)", packed_rate / rate),
        100.0 * t.padding / (t.useful + t.padding), 1000 * t.seconds / timed, t.last.tokens,
        t.val_loss);
  }
  return 0;
}
