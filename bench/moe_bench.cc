// MoE benchmark: a dense model and a Mixture-of-Experts model with the same
// active FLOPs per token (top-k routing to experts 1/k as wide as the dense
// feed-forward), trained side by side on the same corpus, tokens and seed.
// Reports the validation loss each reaches and how evenly the experts were
// loaded after warm-up; then one MoE layer's forward and backward with the
// grouped expert products against the loop over experts. Asserts nothing;
// the README records its tables.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/model/moe.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, train_path, "", "dataset prefix written by tally-prep");
ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");
ABSL_FLAG(int, steps, 400, "optimizer steps per model");
ABSL_FLAG(int, experts, 16, "experts of the MoE model");
ABSL_FLAG(int, top_k, 2, "experts per token; each is 1/top_k as wide as the dense block");
ABSL_FLAG(int, threads, 0, "CPU threads (0: LibTorch's default)");
ABSL_FLAG(double, aux_loss_coef, 0.01, "Switch load-balancing loss weight");
ABSL_FLAG(bool, bias_balancing, true, "auxiliary-loss-free balancing as well");
ABSL_FLAG(double, bias_rate, 1e-3, "step of the balancing bias per optimizer step");
ABSL_FLAG(bool, dense, true, "train the dense baseline too");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_train_path).empty()) {
    std::cerr << "moe_bench: --train_path is required (scripts/bench.sh prepares one)\n";
    return 2;
  }
  tally::train::SetCpuThreads(absl::GetFlag(FLAGS_threads));
  if (auto s = tally::train::CheckDevice(absl::GetFlag(FLAGS_device)); !s.ok()) {
    std::cerr << "moe_bench: --device: " << s.message() << "\n";
    return 2;
  }
  const int steps = absl::GetFlag(FLAGS_steps);
  std::cout << absl::StrFormat(
      "%d steps of 8 x 512 tokens, 2 layers, d_model 128, packed fortunes; load measured over "
      "the second half of the steps\n",
      steps);
  std::cout << "| model | parameters | active | FLOPs/token | val loss | tokens/s | max/mean load "
               "| router entropy |\n|---|---|---|---|---|---|---|---|\n";
  std::vector<int> models = {0, absl::GetFlag(FLAGS_experts)};
  if (!absl::GetFlag(FLAGS_dense)) models.erase(models.begin());
  for (int experts : models) {
    tally::train::TrainConfig c;
    c.data.train_path = absl::GetFlag(FLAGS_train_path);
    c.device = absl::GetFlag(FLAGS_device);
    c.model.num_layers = 2;
    c.model.d_model = 128;
    c.model.num_heads = 4;
    c.data.seq_len = 512;
    c.micro_batch_rows = 8;
    c.max_steps = steps;
    c.optimizer.lr = 3e-3;
    c.optimizer.min_lr = 3e-4;
    c.optimizer.warmup_steps = 10;
    c.optimizer.grad_clip = 1.0;
    c.eval_interval_steps = steps;
    c.eval_tokens = 65536;
    c.seed = 1;
    c.model.moe.num_experts = experts;
    c.model.moe.top_k = experts ? absl::GetFlag(FLAGS_top_k) : 1;
    c.model.d_ff = experts ? 352 / c.model.moe.top_k : 352;  // 352: SwiGLU's width at d_model 128
    c.optimizer.moe_aux_loss_coef = absl::GetFlag(FLAGS_aux_loss_coef);
    c.optimizer.moe_bias_balancing = absl::GetFlag(FLAGS_bias_balancing);
    c.optimizer.moe_bias_rate = absl::GetFlag(FLAGS_bias_rate);
    struct Tally : tally::train::TrainEvents {
      void OnStart(const tally::train::RunInfo& i) override { info = i; }
      void OnStep(const tally::train::StepMetrics& m) override {
        seconds += m.step_seconds;
        tokens += m.step_tokens;
        if (m.step > half && !m.moe.empty()) {
          load_sum += m.moe_max_over_mean_load;
          for (const auto& l : m.moe) entropy_sum += l.router_entropy / m.moe.size();
          ++n;
        }
      }
      void OnEval(const tally::train::EvalMetrics& e) override { val = e.val_loss; }
      tally::train::RunInfo info;
      int half = 0, n = 0;
      double seconds = 0, load_sum = 0, entropy_sum = 0, val = 0;
      int64_t tokens = 0;
    } t;
    t.half = steps / 2;
    auto r = tally::train::Train(c, &t, nullptr);
    if (r.outcome != tally::train::TrainResult::Outcome::kSucceeded) {
      std::cerr << "moe_bench: " << r.reason << "\n";
      return 1;
    }
    std::cout << absl::StrFormat(
        "| %s | %d | %d | %.3g | %.4f | %.0f | %s | %s |\n",
        experts ? absl::StrFormat("MoE %d experts of width %d, top-%d", experts, c.model.d_ff,
                                  c.model.moe.top_k)
                : absl::StrFormat("dense, width %d", c.model.d_ff),
        t.info.num_parameters, t.info.num_active_parameters, t.info.flops_per_token, t.val,
        t.tokens / t.seconds, t.n ? absl::StrFormat("%.3f", t.load_sum / t.n) : "-",
        t.n ? absl::StrFormat("%.3f", t.entropy_sum / t.n) : "-");
  }
  // One MoE layer, forward and backward: grouped products against the loop.
  {
    const int64_t E = absl::GetFlag(FLAGS_experts), K = absl::GetFlag(FLAGS_top_k);
    const int64_t N = 4096, D = 128, F = 352 / K;
    const at::Device dev(absl::GetFlag(FLAGS_device));
    at::manual_seed(1);
    const at::Tensor x = at::randn({N, D}), router = at::randn({E, D}) * 0.1,
                     w1 = at::randn({E, F, D}) * 0.05, w3 = at::randn({E, F, D}) * 0.05,
                     w2 = at::randn({E, D, F}) * 0.05;
    std::cout << absl::StrFormat(
        "\n| one MoE layer, %d tokens, %d experts %dx%d, top-%d | ms fwd+bwd |\n|---|---|\n",
        N, E, D, F, K);
    for (const bool grouped : {true, false}) {
      tally::model::MoeConfig c;
      c.num_experts = E;
      c.top_k = K;
      c.grouped_mm = grouped;
      auto once = [&] {
        std::vector<at::Tensor> p = {x.to(dev).set_requires_grad(true), router.to(dev),
                                     w1.to(dev).set_requires_grad(true),
                                     w3.to(dev).set_requires_grad(true),
                                     w2.to(dev).set_requires_grad(true)};
        auto o = tally::model::MoeForward(p[0], {}, p[1], {}, p[2], p[3], p[4], c, nullptr, "");
        o.y_ND.to(at::kFloat).square().sum().backward();
        return p[2].grad().sum().item<double>();  // waits for the device
      };
      once();
      const int reps = 5;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < reps; ++r) once();
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
              .count() / reps;
      std::cout << absl::StrFormat("| %s | %.1f |\n",
                                   grouped ? "grouped (at::_grouped_mm)" : "loop over experts",
                                   ms);
    }
  }
  return 0;
}
