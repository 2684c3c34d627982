#include "worker/precision/grouped.h"

#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <algorithm>
#include <functional>
#include <iostream>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/model/moe.h"
#include "worker/precision/converter.h"

namespace tally::precision {
namespace {

TEST(Fp8LinearsTest, GroupedExpertsMatchTheLoopOnTheSameFp8Operands) {
  // CPU emulates the grouped product from the FP8 operands and the scales
  // spread over rows and channels that CUDA hands at::_scaled_grouped_mm.
  const int64_t E = 6, D = 32, F = 48, N = 29;
  model::MoeConfig moe;
  moe.num_experts = E;
  moe.top_k = 2;
  moe.capacity_factor = 1.0;  // drops, and short groups
  for (Recipe recipe : {Recipe::kCurrent, Recipe::kDelayed}) {
    for (int64_t align : {1, 4}) {
      moe.group_align = align;
      RecipeConfig grouped_config;
      grouped_config.recipe = recipe;
      grouped_config.grouped_on_cpu = true;
      RecipeConfig loop_config = grouped_config;
      loop_config.grouped_experts = false;
      Fp8Linears grouped(grouped_config), loop(loop_config);
      ASSERT_TRUE(grouped.Groups(at::zeros({1}), F, D));
      ASSERT_FALSE(loop.Groups(at::zeros({1}), F, D));
      at::manual_seed(5);
      at::Tensor router = at::randn({E, D});
      at::Tensor bias = at::zeros({E});
      bias[E - 1] = -1e4;  // an expert no token reaches
      std::vector<at::Tensor> ws = {at::randn({E, F, D}) * 0.2, at::randn({E, F, D}) * 0.2,
                                    at::randn({E, D, F}) * 0.2};
      at::Tensor x = at::randn({N, D});
      at::Tensor g = at::randn({N, D});
      struct Run {
        at::Tensor y, gx;
        std::vector<at::Tensor> gw;
        Fp8Stats stats;
      };
      auto run = [&](Fp8Linears* fp8) {
        std::vector<at::Tensor> w;
        for (const at::Tensor& t : ws) w.push_back(t.clone().set_requires_grad(true));
        at::Tensor xi = x.clone().set_requires_grad(true);
        model::MoeOutput out =
            model::MoeForward(xi, {}, router, bias, w[0], w[1], w[2], moe, fp8, "layers.0.");
        out.y_ND.backward(g);
        return Run{out.y_ND.detach(), xi.grad(), {w[0].grad(), w[1].grad(), w[2].grad()},
                   fp8->TakeStats()};
      };
      const Run a = run(&grouped), b = run(&loop);
      const std::string what = absl::StrCat(recipe == Recipe::kCurrent ? "current" : "delayed",
                                            ", align ", align);
      EXPECT_TRUE(at::allclose(a.y, b.y, 1e-5, 1e-6)) << what << (a.y - b.y).abs().max();
      EXPECT_TRUE(at::allclose(a.gx, b.gx, 1e-5, 1e-6)) << what;
      for (int i = 0; i < 3; ++i) {
        EXPECT_TRUE(at::allclose(a.gw[i], b.gw[i], 1e-5, 1e-6)) << what << " w" << i;
        EXPECT_EQ(a.gw[i][E - 1].abs().sum().item<double>(), 0.0) << "the idle expert";
      }
      EXPECT_EQ(a.stats.overflows, b.stats.overflows) << what;
      EXPECT_EQ(a.stats.underflows, b.stats.underflows) << what;
      EXPECT_EQ(a.stats.elements, b.stats.elements) << what;
      EXPECT_EQ(a.stats.fp8_products, b.stats.fp8_products) << what;
      EXPECT_EQ(a.stats.total_products, b.stats.total_products) << what;
      // Three weights' forward products for each of the five busy experts.
      EXPECT_EQ(a.stats.grouped_products, 3 * (E - 1)) << what;
      EXPECT_EQ(b.stats.grouped_products, 0);
      EXPECT_EQ(a.stats.total_products, 9 * (E - 1)) << "forward and two backward each";
      EXPECT_TRUE(grouped.grouped_off().empty());
    }
  }
  // A batch of padding only: no expert runs, nothing is turned off.
  RecipeConfig rc;
  rc.grouped_on_cpu = true;
  Fp8Linears fp8(rc);
  at::Tensor x = at::randn({N, D}).set_requires_grad(true);
  at::Tensor w = (at::randn({E, F, D}) * 0.2).set_requires_grad(true);
  model::MoeOutput out = model::MoeForward(x, at::zeros({N}, at::kBool), at::randn({E, D}), {},
                                           w, w, at::randn({E, D, F}), moe, &fp8, "layers.0.");
  EXPECT_EQ(out.y_ND.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(fp8.TakeStats().total_products, 0);
  EXPECT_TRUE(fp8.grouped_off().empty());
}

// Why CUDA's FP8 experts missed a 3% bound against the CPU emulation: the
// emulation computed its intermediates in FP32 where CUDA's are BF16
// (autocast activations, BF16 product outputs). The same layer emulated
// both ways, on the CUDA parity test's small case (8 experts top-2,
// 64 x 128, 300 tokens, current scaling): the two references differ by
// about as much as CUDA differed from the FP32 one, so the reference, not
// CUDA, made most of that gap. CUDA is now checked against the BF16 one.
TEST(Fp8LinearsTest, Bf16IntermediatesExplainTheCudaGap) {
  const int64_t E = 8, D = 64, F = 128, N = 300;
  model::MoeConfig moe;
  moe.num_experts = E;
  moe.top_k = 2;
  at::manual_seed(21);
  const at::Tensor x = at::randn({N, D}), router = at::randn({E, D}) * 0.1;
  const at::Tensor w1 = at::randn({E, F, D}) * 0.02, w3 = at::randn({E, F, D}) * 0.02,
                   w2 = at::randn({E, D, F}) * 0.02;
  auto run = [&](bool bf16) {
    RecipeConfig rc;
    rc.recipe = Recipe::kCurrent;
    rc.grouped_on_cpu = true;
    rc.emulate_bf16_intermediates = bf16;
    Fp8Linears fp8(rc);
    const at::Tensor xi = x.clone().set_requires_grad(true);
    const at::Tensor w1i = w1.clone().set_requires_grad(true);
    model::MoeOutput o = model::MoeForward(xi, {}, router, {}, w1i, w3, w2, moe, &fp8, "layers.0.");
    o.y_ND.to(at::kFloat).square().sum().backward();
    return std::vector<at::Tensor>{o.y_ND.detach(), xi.grad(), w1i.grad()};
  };
  const auto fp32 = run(false), bf16 = run(true);
  for (int i = 0; i < 3; ++i) {
    const double gap =
        ((bf16[i] - fp32[i]).abs().max() / fp32[i].abs().max()).item<double>();
    std::cout << "FP8 experts, BF16 vs FP32 intermediates, " << (i == 0 ? "output" : i == 1 ? "dx" : "dw1")
              << ": " << gap << "\n";
    // CUDA measured 3.8%, 4.7% and 5.7% against the FP32 reference.
    EXPECT_GT(gap, 0.02);
    EXPECT_LT(gap, 0.08);
  }
}

// The operations of `f` (nested ones too) that read a tensor's values back
// to the host (on a GPU each waits for the device), by name. Reads inside
// at::one_hot are left out: it checks the class values on the CPU only (on
// CUDA it relies on the scatter's device asserts, and reads nothing). Every
// operation seen is counted under "(every operation)", so a pass that is
// not observed at all shows.
thread_local std::map<std::string, int>* host_reads_seen = nullptr;
thread_local std::vector<std::string> host_reads_stack;

std::map<std::string, int> HostReadOps(const std::function<void()>& f) {
  std::map<std::string, int> ops;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(
          [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
            static const std::set<std::string> kReads = {
                "aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::equal",
                "aten::is_nonzero", "aten::allclose", "aten::tolist"};
            if (host_reads_seen == nullptr) return nullptr;
            const bool in_one_hot =
                std::find(host_reads_stack.begin(), host_reads_stack.end(), "aten::one_hot") !=
                host_reads_stack.end();
            if (kReads.count(fn.name()) && !in_one_hot) ++(*host_reads_seen)[fn.name()];
            ++(*host_reads_seen)["(every operation)"];
            host_reads_stack.push_back(fn.name());
            return nullptr;
          },
          [](const at::RecordFunction&, at::ObserverContext*) {
            if (host_reads_seen != nullptr && !host_reads_stack.empty()) {
              host_reads_stack.pop_back();
            }
          })
          .scopes({at::RecordScope::FUNCTION}));
  host_reads_stack.clear();
  host_reads_seen = &ops;
  f();
  host_reads_seen = nullptr;
  at::removeCallback(handle);
  return ops;
}

// An FP8 MoE layer waits for the host once per forward (its counts, which
// size the experts' casts and products, moe.cc's table), never in the
// backward, and no operation inside reads a value back on its own: with
// the grouped products and the loop, with padding groups, with drops.
TEST(Fp8LinearsTest, AnFp8MoeLayerReadsTheHostOncePerForward) {
  const int64_t E = 4, D = 32, F = 48, N = 40;
  model::MoeConfig moe;
  moe.num_experts = E;
  moe.top_k = 2;
  moe.capacity_factor = 1.0;
  for (const bool grouped : {true, false}) {
    for (const int64_t align : {1, 16}) {
      SCOPED_TRACE(absl::StrCat(grouped ? "grouped" : "loop", ", align ", align));
      moe.group_align = align;
      RecipeConfig rc;
      rc.grouped_on_cpu = grouped;
      Fp8Linears fp8(rc);
      at::manual_seed(3);
      const at::Tensor router = at::randn({E, D});
      std::vector<at::Tensor> w = {(at::randn({E, F, D}) * 0.2).set_requires_grad(true),
                                   (at::randn({E, F, D}) * 0.2).set_requires_grad(true),
                                   (at::randn({E, D, F}) * 0.2).set_requires_grad(true)};
      for (int step = 0; step < 2; ++step) {
        const at::Tensor x = at::randn({N, D}).set_requires_grad(true);
        const int64_t moe_reads = model::MoeHostReads(), fp8_reads = Fp8HostReads();
        model::MoeOutput out;
        const auto forward_ops = HostReadOps([&] {
          out = model::MoeForward(x, {}, router, at::zeros({E}), w[0], w[1], w[2], moe, &fp8,
                                  "layers.0.");
        });
        EXPECT_EQ(model::MoeHostReads() - moe_reads, 1) << "the counts, once";
        const auto backward_ops = HostReadOps([&] { out.y_ND.square().sum().backward(); });
        EXPECT_EQ(model::MoeHostReads() - moe_reads, 1) << "nothing more in the backward";
        EXPECT_EQ(Fp8HostReads() - fp8_reads, 0);
        for (const auto* ops : {&forward_ops, &backward_ops}) {
          EXPECT_GT(ops->count("(every operation)"), 0u) << "observed";
          EXPECT_EQ(ops->size(), 1u) << ops->rbegin()->first;
        }
        const Fp8Stats stats = fp8.TakeStats();
        EXPECT_EQ(stats.fp8_products, stats.total_products);
        EXPECT_GT(stats.fp8_products, 0);
        fp8.OnOptimizerStep();
      }
    }
  }
}

}  // namespace
}  // namespace tally::precision
