// The CUDA path against the CPU reference, on the same packed batch: the
// variable-length flash-attention kernel under BF16 autocast must compute
// what the FP32 block-diagonal mask computes, up to BF16 rounding, keep
// documents apart, and train. Tolerances are stated per check.
#include <ATen/autocast_mode.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/batch.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"
#include "worker/model/moe.h"
#include "worker/precision/fp8.h"
#include "worker/model/transformer.h"
#include "worker/train/trainer.h"

namespace tally {
namespace {

model::ModelConfig Config() {
  model::ModelConfig c;
  c.num_layers = 2;
  c.d_model = 128;
  c.num_heads = 4;
  c.vocab_size = 258;
  return c;
}

// Two rows of 256: [100, 37, 119 | pad 0] and [250, 5 | pad 1].
model::ModelInput PackedInput(at::Device device, std::vector<std::vector<int64_t>>* docs) {
  std::mt19937 rng(7);
  *docs = {};
  for (int len : {100, 37, 119, 250, 5}) {
    std::vector<int64_t> d(len);
    for (auto& t : d) t = rng() % 256;
    docs->push_back(d);
  }
  const int T = 256;
  std::vector<int64_t> tok(2 * T, 0), pos(2 * T, 0), seg(2 * T, 0);
  std::vector<int32_t> cu = {0};
  int64_t s = 0;
  size_t at = 0;
  auto put = [&](const std::vector<int64_t>& d) {
    for (size_t i = 0; i < d.size(); ++i) tok[at + i] = d[i], pos[at + i] = i, seg[at + i] = s;
    ++s;
    at += d.size();
    cu.push_back(at);
  };
  put((*docs)[0]), put((*docs)[1]), put((*docs)[2]);  // row 0: exactly 256
  put((*docs)[3]), put((*docs)[4]);                    // row 1: 255, then padding
  for (size_t i = at; i < 2 * T; ++i) pos[i] = i - at, seg[i] = s;
  cu.push_back(2 * T);
  model::ModelInput in;
  in.tokens_BT = at::tensor(tok, at::kLong).view({2, T}).to(device);
  in.positions_BT = at::tensor(pos, at::kLong).view({2, T}).to(device);
  in.segments_BT = at::tensor(seg, at::kLong).view({2, T}).to(device);
  in.cu_seqlens_S = at::tensor(cu, at::kInt).to(device);
  in.max_seqlen = 250;
  return in;
}

TEST(CudaParity, VarlenFlashMatchesTheCpuMask) {
  ASSERT_TRUE(at::hasCUDA());
  std::vector<std::vector<int64_t>> docs;
  model::Transformer cpu(Config(), 11, at::kCPU);
  model::Transformer gpu(Config(), 11, at::Device("cuda:0"));
  at::Tensor ref = cpu.Forward(PackedInput(at::kCPU, &docs), model::AttentionKernel::kMaskedSdpa);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::Tensor out = gpu.Forward(PackedInput(at::Device("cuda:0"), &docs),
                               model::AttentionKernel::kVarlenFlash)
                       .to(at::kCPU, at::kFloat);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  // Real tokens only (row 1 ends in padding).
  at::Tensor mask = at::ones({2, 256}, at::kBool);
  mask[1].narrow(0, 255, 1).fill_(false);
  const double max_err = (out - ref).abs().amax(-1).masked_select(mask).max().item<double>();
  const double scale = ref.abs().max().item<double>();
  std::cout << "logits: max |cuda bf16 - cpu fp32| = " << max_err << " (logit scale " << scale
            << ")\n";
  EXPECT_LT(max_err, 0.05 * scale) << "BF16 tolerance: 5% of the largest logit";
}

TEST(CudaParity, DocumentsStayApartOnCuda) {
  std::vector<std::vector<int64_t>> docs;
  const at::Device cuda("cuda:0");
  model::Transformer gpu(Config(), 12, cuda);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::Tensor packed = gpu.Forward(PackedInput(cuda, &docs), model::AttentionKernel::kVarlenFlash);
  // Document 1 (37 tokens) alone in a row.
  model::ModelInput alone;
  alone.tokens_BT = at::tensor(docs[1], at::kLong).view({1, 37}).to(cuda);
  alone.positions_BT = at::arange(37, at::kLong).view({1, 37}).to(cuda);
  alone.segments_BT = at::zeros({1, 37}, at::kLong).to(cuda);
  alone.cu_seqlens_S = at::tensor(std::vector<int32_t>{0, 37}, at::kInt).to(cuda);
  alone.max_seqlen = 37;
  at::Tensor single = gpu.Forward(alone, model::AttentionKernel::kVarlenFlash);
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  // The same document through the same BF16 kernels, but its products run
  // with M = 512 rows packed and M = 37 alone, so cuBLAS may tile and split
  // them differently: FP32 sums in another order, then rounded to BF16 (8
  // significant bits, unit roundoff 2^-8). A BF16 value that rounds the
  // other way moves by an ulp, at most 2^-7 of its magnitude, and such flips
  // in the activations of two layers carry on to the logits. The bound is
  // 8 unit roundoffs, 2^-5 (3.1%), of the largest logit: on CPU under BF16
  // autocast the same comparison differs by 0.25-0.5% (one ulp near 0.8),
  // while letting the document attend to the one before it (one segment
  // for the row) moves its logits by 98-106% of the largest (and every
  // token's row by at least 32%), so a leak still fails by a wide margin.
  at::Tensor got = packed[0].narrow(0, 100, 37).to(at::kCPU, at::kFloat);
  at::Tensor want = single[0].to(at::kCPU, at::kFloat);
  const double err = (got - want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  std::cout << "document packed vs alone on CUDA: max diff " << err << " (logit scale " << scale
            << ", " << err / scale << " of it)\n";
  ASSERT_GT(scale, 0);
  EXPECT_LE(err, std::ldexp(1.0, -5) * scale)
      << "the same BF16 kernels on the same document: beyond BF16 rounding, documents leak";
}

// One MoE layer's inputs, small (checked against the CPU) or at transformer
// scale (timed): 8 experts, top-2, under BF16 autocast on CUDA.
struct MoeLayerCase {
  MoeLayerCase(bool big, uint64_t seed)
      : E(8), D(big ? 1024 : 64), F(big ? 1408 : 128), N(big ? 8192 : 300) {
    config.num_experts = E;
    config.top_k = 2;
    at::manual_seed(seed);
    x = at::randn({N, D});
    router = at::randn({E, D}) * 0.1;
    w1 = at::randn({E, F, D}) * 0.02;
    w3 = at::randn({E, F, D}) * 0.02;
    w2 = at::randn({E, D, F}) * 0.02;
  }
  // The layer's tensors on `dev`, copied once (timing leaves the copies out).
  struct OnDevice {
    at::Tensor x, router, w1, w3, w2;
  };
  OnDevice To(at::Device dev) const {
    auto copy = [&](const at::Tensor& t) { return t.to(dev, false, /*copy=*/true); };
    return {copy(x), copy(router), copy(w1), copy(w3), copy(w2)};
  }
  // Forward and backward on d's device: the output, dx and dw1 there. Fresh
  // leaves over d's storage each call (no copy), so gradients never add up.
  std::vector<at::Tensor> Step(const model::MoeConfig& c, const OnDevice& d,
                               model::LinearOverride* linear) const {
    auto leaf = [](const at::Tensor& t) {
      at::Tensor l = t.detach();
      l.set_requires_grad(true);
      return l;
    };
    at::Tensor x_ = leaf(d.x), w1_ = leaf(d.w1), w2_ = leaf(d.w2);
    model::MoeOutput o =
        model::MoeForward(x_, {}, d.router, {}, w1_, d.w3, w2_, c, linear, "layers.0.");
    o.y_ND.to(at::kFloat).square().sum().backward();
    return {o.y_ND, x_.grad(), w1_.grad()};
  }
  // Step on `dev`, the results on the host in FP32.
  std::vector<at::Tensor> Run(const model::MoeConfig& c, at::Device dev,
                              model::LinearOverride* linear) const {
    std::vector<at::Tensor> out = Step(c, To(dev), linear);
    for (at::Tensor& t : out) t = t.to(at::kCPU, at::kFloat);
    return out;
  }
  // Milliseconds per Step on the device, inputs already there.
  double TimeOn(at::Device dev, const model::MoeConfig& c,
                const std::function<model::LinearOverride*()>& linear) const;
  std::string Shape() const {
    return absl::StrCat(N, " tokens, ", E, " experts ", D, "x", F);
  }
  const int64_t E, D, F, N;
  model::MoeConfig config;
  at::Tensor x, router, w1, w3, w2;
};

// Each output's largest difference relative to the reference's largest value.
void ExpectClose(const std::vector<at::Tensor>& got, const std::vector<at::Tensor>& want,
                 double tolerance, const std::string& what) {
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = ((got[i] - want[i]).abs().max() / want[i].abs().max()).item<double>();
    std::cout << what << ", output " << i << ": max diff " << err << "\n";
    EXPECT_LT(err, tolerance) << what << ", output " << i;
  }
}

// Milliseconds per call of `f`, over 10 calls after a warm-up.
// (f must leave nothing queued on the device that it did not wait for.)
double MsPerCall(const std::function<void()>& f) {
  f();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 10; ++r) f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         10;
}

double MoeLayerCase::TimeOn(at::Device dev, const model::MoeConfig& c,
                            const std::function<model::LinearOverride*()>& linear) const {
  const OnDevice d = To(dev);
  return MsPerCall([&] {
    // A one-element read waits for everything queued before it.
    Step(c, d, linear())[2].sum().item<float>();
  });
}

// The grouped expert path (at::_grouped_mm, BF16) against the CPU FP32
// reference, then timed against the loop over experts at transformer scale.
TEST(CudaParity, GroupedExpertsMatchTheCpuAndBeatTheLoop) {
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const at::Device cuda("cuda:0");
  for (const bool big : {false, true}) {
    const MoeLayerCase m(big, 9);
    model::MoeConfig loop = m.config;
    loop.grouped_mm = false;
    if (!big) {
      ExpectClose(m.Run(m.config, cuda, nullptr), m.Run(loop, at::kCPU, nullptr), 3e-2,
                  "grouped experts on CUDA vs CPU");
      continue;
    }
    const double grouped = m.TimeOn(cuda, m.config, [] { return nullptr; });
    const double looped = m.TimeOn(cuda, loop, [] { return nullptr; });
    std::cout << "MoE layer fwd+bwd, " << m.Shape() << ": grouped " << grouped << " ms, loop "
              << looped << " ms\n";
  }
  at::autocast::set_autocast_enabled(at::kCUDA, false);
}

// FP8 linears on CUDA (at::_scaled_mm; after a step, delayed scaling casts
// the weight with the fused cast + amax kernel) against the CPU emulation:
// the same scales, the same clamped counts, outputs equal up to BF16.
TEST(CudaParity, Fp8LinearMatchesTheCpuEmulationWithTheFusedCast) {
  at::manual_seed(13);
  const at::Tensor x = at::randn({64, 128}), w = at::randn({256, 128}) * 0.05;
  std::vector<at::Tensor> outs[2];
  precision::Fp8Stats stats[2];
  double amax[2] = {0, 0};
  for (int dev = 0; dev < 2; ++dev) {
    const at::Device d = dev == 0 ? at::Device(at::kCPU) : at::Device("cuda:0");
    precision::RecipeConfig rc;
    rc.recipe = precision::Recipe::kDelayed;
    precision::Fp8Linears fp8(rc, d);
    outs[dev].push_back(fp8.Linear(x.to(d), w.to(d), "layers.0.wo").to(at::kCPU, at::kFloat));
    fp8.TakeStats();
    fp8.OnOptimizerStep();
    // The weight grew 4x since the history was taken: its cast clamps.
    outs[dev].push_back(
        fp8.Linear(x.to(d), (w * 4).to(d), "layers.0.wo").to(at::kCPU, at::kFloat));
    stats[dev] = fp8.TakeStats();
    amax[dev] = stats[dev].amax.at("attention.weight");  // this step's
  }
  for (size_t i = 0; i < outs[0].size(); ++i) {
    const double err =
        ((outs[1][i] - outs[0][i]).abs().max() / outs[0][i].abs().max()).item<double>();
    std::cout << "FP8 linear CUDA vs CPU emulation, call " << i << ": max diff " << err << "\n";
    EXPECT_LT(err, 2e-2);
  }
  EXPECT_GT(stats[0].overflows, 0);
  EXPECT_EQ(stats[1].overflows, stats[0].overflows);
  EXPECT_EQ(stats[1].underflows, stats[0].underflows);
  EXPECT_EQ(amax[1], amax[0]);
}

// FP8 experts on CUDA: each weight's forward product over all experts as
// one at::_scaled_grouped_mm, against the CPU emulation of the same grouped
// product, and timed against the per-expert _scaled_mm loop.
TEST(CudaParity, Fp8GroupedExpertsMatchTheCpuAndBeatTheLoop) {
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  const at::Device cuda("cuda:0");
  auto recipe = [](bool grouped) {
    precision::RecipeConfig rc;
    rc.recipe = precision::Recipe::kCurrent;
    rc.grouped_experts = grouped;
    rc.grouped_on_cpu = grouped;
    return rc;
  };
  for (const bool big : {false, true}) {
    const MoeLayerCase m(big, 21);
    if (!big) {
      // The CPU reference with CUDA's intermediate precision (BF16
      // activations into the casts, BF16 product outputs): against an FP32
      // one the gap is mostly the reference's own (worker/precision/
      // grouped_test.cc, Bf16IntermediatesExplainTheCudaGap: 3.9/4.8/5.5%).
      precision::RecipeConfig cpu_recipe = recipe(true);
      cpu_recipe.emulate_bf16_intermediates = true;
      precision::Fp8Linears on_cpu(cpu_recipe), on_cpu_fp32(recipe(true)),
          on_gpu(recipe(true), cuda);
      const auto cpu = m.Run(m.config, at::kCPU, &on_cpu);
      const auto cpu_fp32 = m.Run(m.config, at::kCPU, &on_cpu_fp32);
      const auto gpu = m.Run(m.config, cuda, &on_gpu);
      EXPECT_EQ(on_gpu.grouped_off(), "") << "the grouped product was turned off";
      EXPECT_GT(on_gpu.TakeStats().grouped_products, 0);
      ExpectClose(gpu, cpu_fp32, 1.0, "FP8 grouped experts on CUDA vs FP32 emulation (for the record)");
      // Goal: 1% for the output and dx, 2% for dw1; a finding above, a
      // failure at 3%.
      ExpectClose(gpu, cpu, 3e-2, "FP8 grouped experts on CUDA vs BF16-intermediate emulation");
      continue;
    }
    double ms[2];
    for (const bool grouped : {true, false}) {
      std::unique_ptr<precision::Fp8Linears> fp8;
      ms[grouped ? 0 : 1] = m.TimeOn(cuda, m.config, [&] {
        fp8 = std::make_unique<precision::Fp8Linears>(recipe(grouped), cuda);
        return fp8.get();
      });
    }
    std::cout << "FP8 MoE layer fwd+bwd, " << m.Shape() << ": grouped forward " << ms[0]
              << " ms, loop " << ms[1] << " ms\n";
  }
  at::autocast::set_autocast_enabled(at::kCUDA, false);
}

// A small synthetic corpus (no fortunes package needed on the GPU machine).
std::string WriteCorpus() {
  char dir[] = "/tmp/tally_gpu_XXXXXX";
  if (mkdtemp(dir) == nullptr) return "";
  std::mt19937 rng(3);
  for (const char* split : {"train", "val"}) {
    auto w = data::DatasetWriter::Create(std::string(dir) + "/" + split);
    if (!w.ok()) return "";
    for (int d = 0; d < 400; ++d) {
      std::string text;
      const int len = 20 + rng() % 400;
      for (int i = 0; i < len; ++i) text.push_back("abcdefgh ijklmnop\n"[(i * 7 + d) % 18]);
      std::vector<uint16_t> t;
      data::ByteTokenizer::Encode(text, &t);
      if (!(*w)->Add(t).ok()) return "";
    }
    if (!(*w)->Finish("").ok()) return "";
  }
  return std::string(dir) + "/train";
}

train::TrainConfig CudaConfig(const std::string& train_path) {
  train::TrainConfig c;
  c.data.train_path = train_path;
  c.device = "cuda:0";
  c.model.num_layers = 2;
  c.model.d_model = 128;
  c.model.num_heads = 4;
  c.data.seq_len = 512;
  c.micro_batch_rows = 8;
  c.max_steps = 30;
  c.optimizer.lr = 3e-3;
  c.optimizer.warmup_steps = 5;
  c.eval_interval_steps = 30;
  return c;
}

struct Losses : train::TrainEvents {
  void OnStart(const train::RunInfo& i) override { info = i; }
  void OnStep(const train::StepMetrics& m) override { train.push_back(m.train_loss); }
  void OnEval(const train::EvalMetrics& e) override { val.push_back(e.val_loss); }
  train::RunInfo info;
  std::vector<double> train, val;
};

TEST(CudaParity, TrainsOnCuda) {
  const std::string path = WriteCorpus();
  ASSERT_FALSE(path.empty());
  Losses losses;
  const train::TrainResult r = train::Train(CudaConfig(path), &losses, nullptr);
  ASSERT_EQ(r.outcome, train::TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(losses.val.size(), 2u);
  std::cout << "CUDA training: val loss " << losses.val[0] << " -> " << losses.val[1] << "\n";
  EXPECT_LT(losses.val[1], losses.val[0] - 1.0);
}

// After k steps a run's validation loss equals the one a fresh run started
// from that step's checkpoint reports at its step 0: every step computed with
// the weights the optimizer wrote (autocast's cast cache cleared at the end
// of each step's region; FP8 weights cast once per step and dropped at the
// optimizer step). With the cache never cleared (before) the two differed by
// far more than this bound. FP8 with the current recipe, whose scales come
// from the tensors themselves, so a fresh run computes the same ones.
TEST(CudaParity, StepsReadTheCurrentWeights) {
  const std::string path = WriteCorpus();
  ASSERT_FALSE(path.empty());
  for (const bool fp8 : {false, true}) {
    char dir[] = "/tmp/tally_gpu_ckpt_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    train::TrainConfig c = CudaConfig(path);
    c.fp8 = fp8;
    c.fp8_recipe.recipe = precision::Recipe::kCurrent;
    c.max_steps = 5;
    c.eval_interval_steps = 5;
    c.checkpoint_dir = dir;
    struct Last : Losses {
      void OnCheckpoint(const train::CheckpointInfo& i) override { checkpoint = i.path; }
      std::string checkpoint;
    } trained, reloaded;
    ASSERT_EQ(train::Train(c, &trained, nullptr).outcome, train::TrainResult::Outcome::kSucceeded);
    ASSERT_FALSE(trained.checkpoint.empty());
    train::TrainConfig r = c;
    r.checkpoint_dir.clear();
    r.init_from_checkpoint = trained.checkpoint;
    r.max_steps = 1;
    r.eval_interval_steps = 1;
    const train::TrainResult rr = train::Train(r, &reloaded, nullptr);
    ASSERT_EQ(rr.outcome, train::TrainResult::Outcome::kSucceeded) << rr.reason;
    const double a = trained.val.back(), b = reloaded.val.front();
    std::cout << (fp8 ? "FP8" : "BF16") << " val loss after 5 steps " << a
              << ", from its checkpoint " << b << " (rel diff " << std::abs(a - b) / a << ")\n";
    EXPECT_LT(std::abs(a - b) / a, 1e-4) << (fp8 ? "FP8" : "BF16");
  }
}

// Nothing in a step's forward or backward passes waits for the device: the
// passes run under CUDA's sync-debug mode set to error (a synchronising call
// throws and fails the run, naming itself). BF16, FP8 (delayed: the first
// step scales from the tensors on the device, the next from the history),
// and MoE with BF16 grouped experts. FP8 experts read their counts on the
// host (each expert's scales size its products): reported, not asserted.
TEST(CudaParity, NothingWaitsInForwardOrBackward) {
  const std::string path = WriteCorpus();
  ASSERT_FALSE(path.empty());
  struct Case {
    const char* name;
    bool fp8, moe, required;
  };
  for (const Case& k : {Case{"BF16", false, false, true}, Case{"FP8 delayed", true, false, true},
                        Case{"MoE BF16 grouped", false, true, true},
                        Case{"MoE FP8 grouped", true, true, false}}) {
    train::TrainConfig c = CudaConfig(path);
    c.max_steps = 4;
    c.eval_interval_steps = 0;
    c.global_batch_tokens = 2 * c.data.seq_len * c.micro_batch_rows;
    c.fp8 = k.fp8;
    if (k.moe) {
      c.model.moe.num_experts = 8;
      c.model.moe.top_k = 2;
    }
    c.test_sync_check = true;
    const train::TrainResult r = train::Train(c, nullptr, nullptr);
    const bool ok = r.outcome == train::TrainResult::Outcome::kSucceeded;
    std::cout << "sync check, " << k.name << ": "
              << (ok ? "no wait in 4 steps x 2 micro-batches" : r.reason) << "\n";
    if (k.required) EXPECT_TRUE(ok) << k.name << ": " << r.reason;
  }
}

// The NCCL path: a one-rank ProcessGroupNCCL (the only size one GPU allows)
// goes through the rendezvous, the overlapped bucket all-reduce, the
// statistics and the parameter check, and takes the steps a run without a
// group takes.
TEST(CudaParity, OneRankNcclGroupTrains) {
  const std::string path = WriteCorpus();
  ASSERT_FALSE(path.empty());
  train::TrainConfig c = CudaConfig(path);
  c.global_batch_tokens = 2 * c.data.seq_len * c.micro_batch_rows;
  c.parallel.param_check_interval_steps = 10;
  Losses plain, nccl;
  ASSERT_EQ(train::Train(c, &plain, nullptr).outcome, train::TrainResult::Outcome::kSucceeded);
  c.parallel.rendezvous = "127.0.0.1:29651";
  c.parallel.rendezvous_prefix = "gpu-test";
  const train::TrainResult r = train::Train(c, &nccl, nullptr);
  ASSERT_EQ(r.outcome, train::TrainResult::Outcome::kSucceeded) << r.reason;
  EXPECT_EQ(nccl.info.backend, "nccl");
  ASSERT_EQ(nccl.train.size(), plain.train.size());
  double worst = 0;
  for (size_t i = 0; i < plain.train.size(); ++i) {
    worst = std::max(worst, std::abs(nccl.train[i] - plain.train[i]) / plain.train[i]);
  }
  std::cout << "NCCL one-rank group vs no group, 30 steps: max rel loss diff " << worst << "\n";
  EXPECT_LT(worst, 1e-2);
}

}  // namespace
}  // namespace tally
