// Whole training steps in BF16 (autocast) and FP8 (at::_scaled_mm linears)
// at one model shape, side by side in one process: ms/step, useful tokens/s
// and MFU two ways (the PaLM formula, and executed FLOPs: each document's
// causal pairs) against the card's dense BF16 peak (--peak_tflops); the FP8
// run's MFU also against the dense FP8 peak (--peak_fp8_tflops).
// tests/gpu/run.sh runs it at ~1B and ~3B parameters, with the card's peaks
// and the micro-batching its memory allows. The last lines ("summary ...")
// are for the script. Asserts nothing beyond both runs finishing.
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, train_path, "", "dataset prefix written by tally-prep");
ABSL_FLAG(std::string, device, "cuda:0", "cpu or cuda:N");
ABSL_FLAG(int, layers, 20, "transformer blocks");
ABSL_FLAG(int, d_model, 2048, "model width (heads of 128)");
ABSL_FLAG(int, seq_len, 2048, "row length");
ABSL_FLAG(int, rows, 8, "rows per micro-batch");
ABSL_FLAG(int, micro_batches, 1, "micro-batches per step (gradient accumulation)");
ABSL_FLAG(int, steps, 12, "optimizer steps per precision");
ABSL_FLAG(int, warmup_steps, 3, "steps left out of the timings");
ABSL_FLAG(double, peak_tflops, 989, "dense BF16 peak of one device, for MFU (H100/H200 SXM: 989)");
ABSL_FLAG(double, peak_fp8_tflops, 1979, "dense FP8 peak of one device (H100/H200 SXM: 1979)");

namespace {

struct Timer : tally::train::TrainEvents {
  explicit Timer(int skip) : skip(skip) {}
  void OnStart(const tally::train::RunInfo& i) override { info = i; }
  void OnStep(const tally::train::StepMetrics& m) override {
    loss = m.train_loss;
    if (m.step <= skip) return;
    seconds += m.step_seconds;
    tokens += m.step_tokens;
    mfu += m.mfu;
    mfu_executed += m.mfu_executed;
    ++n;
  }
  int skip;
  tally::train::RunInfo info;
  double seconds = 0, mfu = 0, mfu_executed = 0, loss = 0;
  int64_t tokens = 0;
  int n = 0;
};

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (absl::GetFlag(FLAGS_train_path).empty()) {
    std::cerr << "step_bench: --train_path is required (a tally-prep dataset prefix)\n";
    return 2;
  }
  if (auto s = tally::train::CheckDevice(device); !s.ok()) {
    std::cerr << "step_bench: --device: " << s.message() << "\n";
    return 2;
  }
  const int d_model = absl::GetFlag(FLAGS_d_model);
  if (d_model < 64 || d_model % 64 != 0) {
    std::cerr << "step_bench: --d_model must be a positive multiple of 64, got " << d_model
              << "\n";
    return 2;
  }
  const int steps = absl::GetFlag(FLAGS_steps), skip = absl::GetFlag(FLAGS_warmup_steps);
  if (steps <= skip) {
    std::cerr << "step_bench: --steps (" << steps << ") must exceed --warmup_steps (" << skip
              << ")\n";
    return 2;
  }
  const int micro_batches = absl::GetFlag(FLAGS_micro_batches);
  if (micro_batches < 1) {
    std::cerr << "step_bench: --micro_batches must be at least 1, got " << micro_batches << "\n";
    return 2;
  }
  const double peak = absl::GetFlag(FLAGS_peak_tflops),
               peak_fp8 = absl::GetFlag(FLAGS_peak_fp8_tflops);
  bool header = false;
  double bf16_ms = 0;
  std::string summary;
  for (const bool fp8 : {false, true}) {
    tally::train::TrainConfig c;
    c.data.train_path = absl::GetFlag(FLAGS_train_path);
    c.device = device;
    c.model.num_layers = absl::GetFlag(FLAGS_layers);
    c.model.d_model = d_model;
    c.model.num_heads = d_model >= 128 ? d_model / 128 : 1;
    c.data.seq_len = absl::GetFlag(FLAGS_seq_len);
    c.micro_batch_rows = absl::GetFlag(FLAGS_rows);
    if (micro_batches > 1) {
      c.global_batch_tokens =
          static_cast<int64_t>(micro_batches) * c.micro_batch_rows * c.data.seq_len;
    }
    c.max_steps = steps;
    c.optimizer.lr = 3e-4;
    c.optimizer.warmup_steps = 2;
    c.optimizer.grad_clip = 1.0;
    c.seed = 1;
    c.fp8 = fp8;
    c.peak_flops = peak * 1e12;
    Timer t(skip);
    const tally::train::TrainResult r = tally::train::Train(c, &t, nullptr);
    if (r.outcome != tally::train::TrainResult::Outcome::kSucceeded || t.n == 0) {
      std::cerr << "step_bench: " << (fp8 ? "FP8" : "BF16") << " run failed: " << r.reason << "\n";
      return 1;
    }
    if (!header) {
      std::cout << absl::StrFormat(
          "%.2fB parameters (%d layers, d_model %d), %d x %d x %d tokens per step "
          "(micro-batches x rows x seq_len), on %s; steps %d-%d timed; MFU against %.0f TFLOP/s "
          "(BF16 dense peak), %.2f GFLOP per token\n"
          "| precision | ms/step | useful tokens/s | MFU | MFU, executed FLOPs | final train loss "
          "|\n"
          "|---|---|---|---|---|---|\n",
          t.info.num_parameters / 1e9, c.model.num_layers, d_model, micro_batches,
          c.micro_batch_rows, c.data.seq_len, device, skip + 1, steps, peak,
          t.info.flops_per_token / 1e9);
      header = true;
    }
    std::cout << absl::StrFormat("| %s | %.1f | %.0f | %.1f%% | %.1f%% | %.4f |\n",
                                 fp8 ? "FP8" : "BF16", 1000 * t.seconds / t.n,
                                 t.tokens / t.seconds, 100 * t.mfu / t.n,
                                 100 * t.mfu_executed / t.n, t.loss)
              << std::flush;
    const double ms = 1000 * t.seconds / t.n;
    const double mfu = t.mfu / t.n, mfu_executed = t.mfu_executed / t.n;
    absl::StrAppendFormat(&summary, "summary %s ms=%.1f mfu=%.4f mfu_executed=%.4f",
                          fp8 ? "FP8" : "BF16", ms, mfu, mfu_executed);
    if (fp8 && peak_fp8 > 0) {
      // The same FLOPs against the FP8 peak.
      const double to_fp8 = peak / peak_fp8;
      std::cout << absl::StrFormat("FP8 MFU against the FP8 dense peak (%.0f TFLOP/s): %.1f%%, "
                                   "executed %.1f%%\n",
                                   peak_fp8, 100 * mfu * to_fp8, 100 * mfu_executed * to_fp8);
      absl::StrAppendFormat(&summary, " mfu_fp8peak=%.4f mfu_executed_fp8peak=%.4f",
                            mfu * to_fp8, mfu_executed * to_fp8);
    }
    summary += "\n";
    if (!fp8) bf16_ms = ms;
    if (fp8 && bf16_ms > 0) {
      std::cout << absl::StrFormat("FP8 / BF16 step time: %.3f\n", ms / bf16_ms);
      absl::StrAppendFormat(&summary, "summary ratio fp8_over_bf16=%.3f\n", ms / bf16_ms);
    }
  }
  std::cout << summary;
  return 0;
}
