#include "worker/precision/converter.h"

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/model/transformer.h"

namespace tally::precision {
namespace {

// Delayed scaling keeps every scale and amax on the device: nothing in the
// products reads a value back (on a GPU each read stalls the stream), not
// even in the first step, which scales each tensor from itself on the
// device. The step's statistics are one read; the histories then advance
// without another.
TEST(Fp8LinearsTest, DelayedScalingReadsTheDeviceOnceAStep) {
  at::manual_seed(8);
  RecipeConfig c;  // delayed
  Fp8Linears fp8(c);
  const at::Tensor w = (at::randn({48, 32}) * 0.1).set_requires_grad(true);
  for (int step = 0; step < 3; ++step) {
    const int64_t before = Fp8HostReads();
    for (int micro = 0; micro < 2; ++micro) {
      for (const char* site : {"layers.0.wqkv", "layers.0.w1"}) {
        at::Tensor x = at::randn({2, 5, 32}) * (step == 2 ? 100 : 1);  // step 2 overflows
        fp8.Linear(x, w, site).backward(at::randn({2, 5, 48}));
      }
    }
    const int64_t during = Fp8HostReads() - before;
    const Fp8Stats stats = fp8.TakeStats();
    fp8.OnOptimizerStep();
    const int64_t after = Fp8HostReads() - before - during;
    EXPECT_EQ(during, 0) << "step " << step;
    EXPECT_EQ(after, 1) << "step " << step;
    EXPECT_EQ(stats.fp8_products, 12);
    // Each input and gradient is cast per micro-batch, each weight once a
    // step.
    EXPECT_EQ(stats.elements, 4 * (10 * 32 + 10 * 48) + 2 * 48 * 32);
    ASSERT_EQ(stats.amax.count("attention.grad"), 1u);
    EXPECT_GT(stats.amax.at("ffn.input"), step == 2 ? 100 : 1);
    if (step == 2) EXPECT_GT(stats.overflows, 0) << "inputs 100x the history's amax";
  }
}

// w1 and w3 read the same h: it is cast once, and both layers' products use
// that one image (their checkpoint entries for it are one state).
TEST(Fp8LinearsTest, AnInputTwoLayersShareIsCastOnce) {
  at::manual_seed(9);
  RecipeConfig c;
  c.recipe = Recipe::kCurrent;
  Fp8Linears shared(c), apart(c);
  const at::Tensor w1 = at::randn({48, 32}).set_requires_grad(true);
  const at::Tensor w3 = at::randn({48, 32}).set_requires_grad(true);
  const at::Tensor h = at::randn({10, 32}).set_requires_grad(true);
  const at::Tensor y = shared.Linear(h, w1, "layers.0.w1") * shared.Linear(h, w3, "layers.0.w3");
  // The same products through two unrelated sites, which cast h twice.
  const at::Tensor h2 = h.detach().clone().set_requires_grad(true);
  const at::Tensor y2 = apart.Linear(h2, w1, "layers.0.a") * apart.Linear(h2, w3, "layers.0.b");
  EXPECT_TRUE(at::equal(y, y2)) << "the same numerics";
  y.sum().backward();
  y2.sum().backward();
  EXPECT_TRUE(at::equal(h.grad(), h2.grad()));
  const Fp8Stats s = shared.TakeStats(), t = apart.TakeStats();
  EXPECT_EQ(t.elements - s.elements, 10 * 32) << "h cast once, not twice";
  const auto state = shared.State();
  ASSERT_EQ(state.size(), 6u);
  EXPECT_TRUE(at::equal(state[1].second, state[4].second)) << state[1].first << " and "
                                                           << state[4].first;
}

// Weights move only at optimizer steps: cast once per step, and cast again
// after one (or after any change to them).
TEST(Fp8LinearsTest, AWeightIsCastOncePerOptimizerStep) {
  RecipeConfig c;
  c.recipe = Recipe::kCurrent;
  Fp8Linears fp8(c);
  at::Tensor w = at::full({16, 16}, 1.0f).set_requires_grad(true);
  const at::Tensor x = at::full({16, 16}, 1.0f);
  EXPECT_EQ(fp8.Linear(x, w, "layers.0.wo")[0][0].item<float>(), 16.0f);
  EXPECT_EQ(fp8.Linear(x, w, "layers.0.wo")[0][0].item<float>(), 16.0f);
  // (The input is cast again: only a cast w1 and w3 share is kept, and only
  // until the second of them takes it.)
  EXPECT_EQ(fp8.TakeStats().elements, 256 + 2 * 256);
  {
    at::NoGradGuard no_grad;
    w.mul_(2);  // as the optimizer would, in place
  }
  fp8.OnOptimizerStep();
  EXPECT_EQ(fp8.Linear(x, w, "layers.0.wo")[0][0].item<float>(), 32.0f);
  {
    at::NoGradGuard no_grad;
    w.mul_(2);  // a change with no step between: seen too (the version moved)
  }
  EXPECT_EQ(fp8.Linear(x, w, "layers.0.wo")[0][0].item<float>(), 64.0f);
}

// Every autograd node reachable from `t`, by name, counted.
std::map<std::string, int> GraphNodes(const at::Tensor& t) {
  std::map<std::string, int> names;
  std::set<torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> todo = {t.grad_fn().get()};
  while (!todo.empty()) {
    torch::autograd::Node* n = todo.back();
    todo.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    ++names[n->name()];
    for (const auto& edge : n->next_edges()) todo.push_back(edge.function.get());
  }
  return names;
}

int CountContaining(const std::map<std::string, int>& names, const std::string& part) {
  int n = 0;
  for (const auto& [name, k] : names) {
    if (name.find(part) != std::string::npos) n += k;
  }
  return n;
}

// In the model's fused mode (CUDA's), FP8 keeps the fused feed-forward: w1
// and w3 are one FP8 product (one cast of h) and SwiGLU the fused op; the
// numbers are the separate products' (each weight keeps its own scale).
TEST(Fp8LinearsTest, TheFusedModelKeepsTheJointGateUpProductInFp8) {
  model::ModelConfig mc;
  mc.num_layers = 2;
  mc.d_model = 32;
  mc.num_heads = 2;
  mc.vocab_size = 64;
  model::ModelInput in;
  in.tokens_BT = at::arange(32, at::kLong).remainder(64).view({2, 16});
  in.positions_BT = at::arange(16, at::kLong).repeat({2, 1});
  in.segments_BT = at::zeros({2, 16}, at::kLong);
  RecipeConfig c;
  c.recipe = Recipe::kCurrent;
  std::vector<at::Tensor> logits;
  std::vector<Fp8Stats> stats;
  for (const bool fused : {false, true}) {
    model::Transformer m(mc, 3, at::kCPU);
    m.SetFusedOps(fused);
    Fp8Linears fp8(c);
    fp8.Declare(m.LinearSites());
    m.SetLinearOverride(&fp8);
    const at::Tensor y = m.Forward(in, model::AttentionKernel::kMaskedSdpa);
    const auto nodes = GraphNodes(y);
    EXPECT_EQ(CountContaining(nodes, "Fp8GateUpFunction"), fused ? 2 : 0);
    EXPECT_EQ(CountContaining(nodes, "Fp8LinearFunction"), fused ? 2 * 3 : 2 * 5);
    EXPECT_EQ(CountContaining(nodes, "SwiGluFunction"), fused ? 2 : 0);
    EXPECT_EQ(CountContaining(nodes, "SiluBackward"), fused ? 0 : 2);
    y.square().mean().backward();
    logits.push_back(y.detach());
    stats.push_back(fp8.TakeStats());
  }
  EXPECT_LT((logits[0] - logits[1]).abs().max().item<double>(),
            1e-3 * logits[0].abs().max().item<double>());
  EXPECT_EQ(stats[0].elements, stats[1].elements) << "h cast once either way";
  EXPECT_EQ(stats[0].fp8_products, stats[1].fp8_products);
  EXPECT_EQ(stats[1].fp8_products, stats[1].total_products);
}

}  // namespace
}  // namespace tally::precision
