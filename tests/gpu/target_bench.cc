// Dollars to a target validation loss, recipe by recipe, on one device: the
// question Tally exists to answer, measured where users spend their money.
//
//   naive            BF16, dense, one document per row (pad_to_seq_len), for
//                    --naive_steps: its final validation loss is the target
//   packed BF16      the same model and rows, packed
//   packed FP8       and FP8 linears (delayed scaling)
//   packed FP8 + MoE and every feed-forward an MoE of --experts experts,
//                    top-2, each half the dense width (the same active
//                    FLOPs per token)
//
// Each variant after naive stops at the first evaluation at or below the
// target (at most --naive_steps steps). Steps, tokens and seconds to the
// target are interpolated between the two evaluations that straddle it, as
// tallyd's experiments do; seconds are the device's wall time from the
// run's first step (evaluations included; process start and model
// initialisation not), priced at --usd_per_hour (tests/gpu/run.sh passes the
// h200 price of examples/tallyd.yaml). Every variant is warmed up first
// (a few steps, not timed: kernels' first calls, cuBLAS heuristics).
//
// This is the trainer itself (the library tally-train runs), driven from
// flags: the GPU machine has no protobuf or gRPC for tally-train's spec
// reader. Asserts nothing beyond every run finishing.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/model_flops.h"
#include "server/policy/target.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, train_path, "", "dataset prefix written by tally-prep");
ABSL_FLAG(std::string, device, "cuda:0", "cpu or cuda:N");
ABSL_FLAG(int, layers, 12, "transformer blocks");
ABSL_FLAG(int, d_model, 1024, "model width (heads of 64)");
ABSL_FLAG(int, seq_len, 1024, "row length");
ABSL_FLAG(int, rows, 16, "rows per step (one micro-batch)");
ABSL_FLAG(int, naive_steps, 400, "steps of the naive run (and the most any variant runs)");
ABSL_FLAG(int, eval_every, 10, "steps between evaluations");
ABSL_FLAG(int64_t, eval_tokens, 65536, "validation tokens per evaluation");
ABSL_FLAG(int, experts, 8, "experts of the MoE variant (top-2, half width)");
ABSL_FLAG(int, warmup_steps, 3, "untimed steps of every variant before its run");
ABSL_FLAG(double, usd_per_hour, 3.50, "the device's price, dollars per GPU-hour");
ABSL_FLAG(double, peak_tflops, 989, "dense BF16 peak, for MFU");

namespace {

using Clock = std::chrono::steady_clock;

struct Eval {
  int64_t step, tokens;
  double val_loss, seconds;
};

// Records evaluations with the wall time since the first step, and stops
// the run at the first one at or below the target.
class Recorder : public tally::train::TrainEvents {
 public:
  Recorder(std::optional<double> target, tally::train::StopFlag* stop)
      : target_(target), stop_(stop) {}
  void OnStart(const tally::train::RunInfo& i) override {
    info = i;
    t0_ = Clock::now();
  }
  void OnStep(const tally::train::StepMetrics& m) override {
    step_ms.push_back(1000 * m.step_seconds);
    mfu.push_back(m.mfu);
    mfu_executed.push_back(m.mfu_executed);
  }
  void OnEval(const tally::train::EvalMetrics& e) override {
    evals.push_back({e.step, e.tokens, e.val_loss,
                     std::chrono::duration<double>(Clock::now() - t0_).count()});
    if (target_ && e.val_loss <= *target_) stop_->Request(tally::train::StopKind::kNow);
  }
  tally::train::RunInfo info;
  std::vector<Eval> evals;
  std::vector<double> step_ms, mfu, mfu_executed;

 private:
  std::optional<double> target_;
  tally::train::StopFlag* stop_;
  Clock::time_point t0_;
};

struct ToTarget {
  bool reached = false;
  double steps = 0, tokens = 0, seconds = 0;
};

// Interpolated between the two evaluations that straddle the target, by the
// definition tallyd's experiments use (server/policy/target.h; the device's
// seconds stand in for GPU-seconds).
ToTarget Interpolate(const std::vector<Eval>& evals, double target) {
  std::vector<tally::policy::CurvePoint> curve;
  for (const Eval& e : evals) {
    tally::policy::CurvePoint p;
    p.step = e.step;
    p.tokens = e.tokens;
    p.gpu_seconds = e.seconds;
    p.val_loss = e.val_loss;
    curve.push_back(p);
  }
  const std::optional<tally::policy::TargetCrossing> x =
      tally::policy::FindTargetCrossing(curve, target);
  if (!x) return {};
  return {true, x->steps, x->tokens, x->gpu_seconds};
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// What is wrong with the flags, or "".
std::string CheckFlags() {
  if (absl::GetFlag(FLAGS_train_path).empty()) {
    return "--train_path is required (a tally-prep dataset prefix)";
  }
  if (auto s = tally::train::CheckDevice(absl::GetFlag(FLAGS_device)); !s.ok()) {
    return "--device: " + std::string(s.message());
  }
  const int d_model = absl::GetFlag(FLAGS_d_model);
  if (d_model < 64 || d_model % 64 != 0) {
    return absl::StrFormat("--d_model must be a positive multiple of 64, got %d", d_model);
  }
  const int naive_steps = absl::GetFlag(FLAGS_naive_steps),
            eval_every = absl::GetFlag(FLAGS_eval_every);
  if (naive_steps < 2 || eval_every < 1 || naive_steps % eval_every != 0) {
    return "--naive_steps must be a multiple of --eval_every (and >= 2)";
  }
  return "";
}

struct Variant {
  std::string name;
  bool packed, fp8, moe;
};

// The trainer's configuration of variant v, from the flags.
tally::train::TrainConfig ConfigFor(const Variant& v) {
  const int d_model = absl::GetFlag(FLAGS_d_model), naive_steps = absl::GetFlag(FLAGS_naive_steps);
  tally::train::TrainConfig c;
  c.data.train_path = absl::GetFlag(FLAGS_train_path);
  c.device = absl::GetFlag(FLAGS_device);
  c.model.num_layers = absl::GetFlag(FLAGS_layers);
  c.model.d_model = d_model;
  c.model.num_heads = d_model / 64;
  if (v.moe) {
    c.model.moe.num_experts = absl::GetFlag(FLAGS_experts);
    c.model.moe.top_k = 2;
    // Half the dense width: top-2 computes what the dense FFN does.
    c.model.d_ff = (tally::ResolveDff(d_model, 0) / 2 + 31) / 32 * 32;
    c.optimizer.moe_aux_loss_coef = 0.01;
  }
  c.data.seq_len = absl::GetFlag(FLAGS_seq_len);
  c.data.packing =
      v.packed ? tally::data::PackingMode::kPacked : tally::data::PackingMode::kPadToSeqLen;
  c.micro_batch_rows = absl::GetFlag(FLAGS_rows);
  c.max_steps = naive_steps;
  c.optimizer.lr = 1e-3;
  c.optimizer.min_lr = 1e-4;
  c.optimizer.warmup_steps = std::max(1, naive_steps / 20);
  c.optimizer.grad_clip = 1.0;
  c.optimizer.weight_decay = 0.1;
  c.eval_interval_steps = absl::GetFlag(FLAGS_eval_every);
  c.eval_tokens = absl::GetFlag(FLAGS_eval_tokens);
  c.seed = 1;
  c.fp8 = v.fp8;
  c.peak_flops = absl::GetFlag(FLAGS_peak_tflops) * 1e12;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (const std::string bad = CheckFlags(); !bad.empty()) {
    std::cerr << "target_bench: " << bad << "\n";
    return 2;
  }
  const int d_model = absl::GetFlag(FLAGS_d_model), naive_steps = absl::GetFlag(FLAGS_naive_steps);
  const double price = absl::GetFlag(FLAGS_usd_per_hour);

  const std::vector<Variant> variants = {{"naive (BF16, dense, padded)", false, false, false},
                                         {"packed BF16", true, false, false},
                                         {"packed FP8", true, true, false},
                                         {"packed FP8 + MoE", true, true, true}};

  std::optional<double> target;
  double naive_usd = 0, best_usd = 0, combined = 0;
  std::string best;
  bool header = false;
  for (const Variant& v : variants) {
    // Warm-up: kernels' first calls and heuristics, not timed.
    if (absl::GetFlag(FLAGS_warmup_steps) > 0) {
      tally::train::TrainConfig w = ConfigFor(v);
      w.max_steps = absl::GetFlag(FLAGS_warmup_steps);
      w.eval_interval_steps = 0;
      const tally::train::TrainResult r = tally::train::Train(w, nullptr, nullptr);
      if (r.outcome != tally::train::TrainResult::Outcome::kSucceeded) {
        std::cerr << "target_bench: " << v.name << " warm-up failed: " << r.reason << "\n";
        return 1;
      }
    }
    tally::train::StopFlag stop;
    Recorder rec(target, &stop);
    const tally::train::TrainResult r = tally::train::Train(ConfigFor(v), &rec, &stop);
    const bool stopped = r.outcome == tally::train::TrainResult::Outcome::kStopped;
    if (!(r.outcome == tally::train::TrainResult::Outcome::kSucceeded || (target && stopped)) ||
        rec.evals.empty()) {
      std::cerr << "target_bench: " << v.name << " failed: " << r.reason << "\n";
      return 1;
    }
    ToTarget t;
    if (!target) {
      // Naive sets the target and reaches it at its last step.
      target = rec.evals.back().val_loss;
      t = {true, static_cast<double>(rec.evals.back().step),
           static_cast<double>(rec.evals.back().tokens), rec.evals.back().seconds};
    } else {
      t = Interpolate(rec.evals, *target);
    }
    const double usd = t.seconds / 3600 * price;
    if (!header) {
      std::cout << absl::StrFormat(
          "%.0fM parameters (%d layers, d_model %d), %d x %d token slots per step, on %s; "
          "target: naive's validation loss after %d steps, %.4f; $%.2f per GPU-hour\n"
          "| variant | parameters (active) | steps to target | tokens to target | GPU-seconds "
          "to target | $ to target | vs naive | median ms/step | MFU (executed) |\n"
          "|---|---|---|---|---|---|---|---|---|\n",
          rec.info.num_parameters / 1e6, absl::GetFlag(FLAGS_layers), d_model,
          absl::GetFlag(FLAGS_rows), absl::GetFlag(FLAGS_seq_len), device, naive_steps,
          *target, price);
      header = true;
    }
    if (naive_usd == 0) naive_usd = usd;
    const double ratio = usd > 0 ? naive_usd / usd : 0;
    if (t.reached && (best.empty() || usd < best_usd)) best = v.name, best_usd = usd;
    if (t.reached && v.fp8 && v.moe) combined = ratio;
    std::cout << absl::StrFormat(
                     "| %s | %.0fM (%.0fM) | %s | %s | %s | %s | %s | %.1f | %.1f%% (%.1f%%) |\n",
                     v.name, rec.info.num_parameters / 1e6, rec.info.num_active_parameters / 1e6,
                     t.reached ? absl::StrFormat("%.1f", t.steps) : "not reached",
                     t.reached ? absl::StrFormat("%.0f", t.tokens) : "-",
                     t.reached ? absl::StrFormat("%.1f", t.seconds) : "-",
                     t.reached ? absl::StrFormat("%.5f", usd) : "-",
                     t.reached ? absl::StrFormat("%.2fx cheaper", ratio) : "-",
                     Median(rec.step_ms), 100 * Mean(rec.mfu), 100 * Mean(rec.mfu_executed))
              << std::flush;
  }
  std::cout << (combined > 0
                    ? absl::StrFormat("combined: packed FP8 + MoE reaches naive's loss %.2fx "
                                      "cheaper than naive\n",
                                      combined)
                    : std::string("combined: packed FP8 + MoE did not reach naive's loss\n"));
  if (!best.empty() && best_usd > 0) {
    std::cout << absl::StrFormat("cheapest: %s, %.2fx cheaper than naive ($%.5f vs $%.5f)\n",
                                 best, naive_usd / best_usd, best_usd, naive_usd);
  }
  return 0;
}
