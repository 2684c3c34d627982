// FP8 benchmark, side by side in one run: each of a linear layer's three
// matrix products (output, input gradient, weight gradient) in FP32, BF16 and
// FP8, then whole training steps in FP32 and FP8. On a CPU, FP8 is emulated
// (quantize, dequantize, FP32 product): it measures the cost of the
// numerics, not a speed-up, which needs FP8 tensor cores. On CUDA the FP8
// column is the trainer's own path (quantize with overflow counts, then
// at::_scaled_mm) and a last column times the product alone on operands
// already in FP8, so the quantize's share shows. Asserts nothing.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "worker/precision/fp8.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, device, "cpu", "cpu or cuda:N");
ABSL_FLAG(int, tokens, 1024, "rows of the activation (tokens)");
ABSL_FLAG(int, d_in, 1024, "input features");
ABSL_FLAG(int, d_out, 1024, "output features");
ABSL_FLAG(int, reps, 5, "timed repetitions per product (median reported)");
ABSL_FLAG(std::string, train_path, "", "dataset prefix for the training-step rows (optional)");
ABSL_FLAG(int, steps, 12, "training steps per precision");

namespace {

using tally::precision::Fp8Format;

template <typename F>
double MedianMs(F&& f, int reps) {
  f();  // warm-up
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// Whole training steps in BF16 (FP32 on the CPU) and FP8, side by side, on
// the packed dataset at `train_path`; 1 when a run fails.
int TrainingSteps(const std::string& device, bool cuda, const std::string& train_path) {
  std::cout << "\nTraining steps (2 layers, d_model 256, 8 x 512 tokens, packed), on " << device
            << "\n| precision | ms/step | useful tokens/s | final train loss |\n|---|---|---|---|\n";
  for (bool fp8 : {false, true}) {
    tally::train::TrainConfig c;
    c.data.train_path = train_path;
    c.model.num_layers = 2;
    c.model.d_model = 256;
    c.model.num_heads = 8;
    c.data.seq_len = 512;
    c.micro_batch_rows = 8;
    c.max_steps = absl::GetFlag(FLAGS_steps);
    c.optimizer.lr = 3e-3;
    c.optimizer.warmup_steps = 2;
    c.seed = 1;
    c.device = device;
    c.fp8 = fp8;
    struct Timer : tally::train::TrainEvents {
      void OnStep(const tally::train::StepMetrics& m) override {
        if (m.step > 2) seconds += m.step_seconds, tokens += m.step_tokens, ++n;
        loss = m.train_loss;
      }
      double seconds = 0, loss = 0;
      int64_t tokens = 0;
      int n = 0;
    } t;
    auto r = tally::train::Train(c, &t, nullptr);
    if (r.outcome != tally::train::TrainResult::Outcome::kSucceeded) {
      std::cerr << "fp8_bench: " << r.reason << "\n";
      return 1;
    }
    std::cout << absl::StrFormat("| %s | %.1f | %.0f | %.4f |\n",
                                 fp8 ? (cuda ? "FP8" : "FP8 (emulated)") : (cuda ? "BF16" : "FP32"),
                                 1000 * t.seconds / t.n, t.tokens / t.seconds, t.loss);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string device = absl::GetFlag(FLAGS_device);
  if (auto s = tally::train::CheckDevice(device); !s.ok()) {
    std::cerr << "fp8_bench: --device: " << s.message() << "\n";
    return 2;
  }
  const at::Device dev(device);
  const bool cuda = dev.is_cuda();
  const int M = absl::GetFlag(FLAGS_tokens), K = absl::GetFlag(FLAGS_d_in),
            N = absl::GetFlag(FLAGS_d_out), reps = absl::GetFlag(FLAGS_reps);
  at::manual_seed(0);
  const auto opts = at::TensorOptions().device(dev);
  at::Tensor x = at::randn({M, K}, opts), w = at::randn({N, K}, opts) * 0.02,
             g = at::randn({M, N}, opts) * 1e-3;
  auto sync = [&] {
    if (cuda) at::empty({1}, opts).cpu();  // waits for the stream
  };
  auto scale = [](const at::Tensor& t, Fp8Format f) {
    return tally::precision::ScaleForAmax(t.abs().max().item<double>(), f, 0, 1.0);
  };
  struct Row {
    const char* product;
    double fp32, bf16, fp8, fp8_product_only;
  };
  std::vector<Row> rows;
  auto time = [&](auto&& f) {
    return MedianMs([&] { f(); sync(); }, reps);
  };
  at::Tensor xb = x.to(at::kBFloat16), wb = w.to(at::kBFloat16), gb = g.to(at::kBFloat16);
  // Scales taken once, outside the timing, as delayed scaling does (no host
  // read per product).
  const double s_x = scale(x, Fp8Format::kE4M3), s_w = scale(w, Fp8Format::kE4M3),
               s_g = scale(g, Fp8Format::kE5M2);
  // a [M, K] x b [N, K]^T. CUDA: the trainer's path (quantize to FP8 with the
  // overflow/underflow counts, then one at::_scaled_mm, BF16 out); CPU: the
  // emulation (quantize, dequantize, FP32 product).
  auto fp8 = [&](const at::Tensor& a, double sa, Fp8Format fa, const at::Tensor& b, double sb,
                 Fp8Format fb) {
    if (!cuda) {
      return at::matmul(tally::precision::QuantizeDequantize(a, sa, fa, nullptr),
                        tally::precision::QuantizeDequantize(b, sb, fb, nullptr).t());
    }
    tally::precision::QuantStats qa, qb;
    at::Tensor a8 = tally::precision::internal::QuantizeScaledLater(a, sa, fa, &qa)
                        .to(tally::precision::Fp8Dtype(fa));
    at::Tensor b8 = tally::precision::internal::QuantizeScaledLater(b, sb, fb, &qb)
                        .to(tally::precision::Fp8Dtype(fb));
    const at::Tensor ia = at::tensor(1.0 / sa, opts.dtype(at::kFloat)),
                     ib = at::tensor(1.0 / sb, opts.dtype(at::kFloat));
    return at::_scaled_mm(a8, b8.t(), ia, ib, {}, {}, at::kBFloat16);
  };
  // The product alone, on operands already in FP8 (CUDA only).
  auto product_only = [&](const at::Tensor& a, double sa, Fp8Format fa, const at::Tensor& b,
                          double sb, Fp8Format fb) {
    if (!cuda) return 0.0;
    const double ma = tally::precision::Fp8Max(fa), mb = tally::precision::Fp8Max(fb);
    at::Tensor a8 = (a * sa).clamp(-ma, ma).to(tally::precision::Fp8Dtype(fa));
    at::Tensor b8 = (b * sb).clamp(-mb, mb).to(tally::precision::Fp8Dtype(fb));
    const at::Tensor one = at::ones({}, opts.dtype(at::kFloat));
    return time([&] { at::_scaled_mm(a8, b8.t(), one, one, {}, {}, at::kBFloat16); });
  };
  constexpr Fp8Format kE4M3 = Fp8Format::kE4M3, kE5M2 = Fp8Format::kE5M2;
  // The backward products with the operand layouts the trainer gives them
  // (linear.cc's TensorwiseBackward): dX = dY (W^T)^T, dW = dY^T (X^T)^T.
  const at::Tensor wt = w.t().contiguous(), gt = g.t().contiguous(), xt = x.t().contiguous();
  rows.push_back({"output  Y = X W^T", time([&] { at::matmul(x, w.t()); }),
                  time([&] { at::matmul(xb, wb.t()); }),
                  time([&] { fp8(x, s_x, kE4M3, w, s_w, kE4M3); }),
                  product_only(x, s_x, kE4M3, w, s_w, kE4M3)});
  rows.push_back({"input grad  dX = dY W", time([&] { at::matmul(g, w); }),
                  time([&] { at::matmul(gb, wb); }),
                  time([&] { fp8(g, s_g, kE5M2, w.t().contiguous(), s_w, kE4M3); }),
                  product_only(g, s_g, kE5M2, wt, s_w, kE4M3)});
  rows.push_back({"weight grad  dW = dY^T X", time([&] { at::matmul(g.t(), x); }),
                  time([&] { at::matmul(gb.t(), xb); }),
                  time([&] {
                    fp8(g.t().contiguous(), s_g, kE5M2, x.t().contiguous(), s_x, kE4M3);
                  }),
                  product_only(gt, s_g, kE5M2, xt, s_x, kE4M3)});
  std::cout << absl::StrFormat(
      "Matrix products, %d x %d activations, %d x %d weights, on %s (median of %d; FP8 %s)\n", M,
      K, N, K, device, reps,
      cuda ? "= the trainer's quantize (with its overflow counts) + at::_scaled_mm; FP8 product "
             "= the product alone on FP8 operands"
           : "emulated: quantize, dequantize, FP32 product");
  std::cout << "| product | FP32 ms | BF16 ms | FP8 ms | FP8 / BF16 | FP8 product ms |\n"
               "|---|---|---|---|---|---|\n";
  for (const Row& r : rows) {
    std::cout << absl::StrFormat("| %s | %.2f | %.2f | %.2f | %.2fx | %s |\n", r.product, r.fp32,
                                 r.bf16, r.fp8, r.fp8 / r.bf16,
                                 cuda ? absl::StrFormat("%.3f", r.fp8_product_only) : "-");
  }

  const std::string train_path = absl::GetFlag(FLAGS_train_path);
  if (train_path.empty()) return 0;
  return TrainingSteps(device, cuda, train_path);
}
