// How many operations one FP8 linear's forward and backward launch, counted
// with a RecordFunction callback (what a GPU would launch as kernels, and
// what its profiler would list): the top-level ATen operators and the fused
// FP8 casts, leaving out those that only make a view or an empty tensor
// (they launch nothing). Held to a stated budget, so an unfused pass
// creeping back in fails here, on the CPU, before it costs a GPU.
#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/precision/converter.h"

namespace tally::precision {
namespace {

thread_local std::map<std::string, int>* counted = nullptr;
// Per open RecordFunction: how it was taken (see Start).
enum class Frame { kCounted, kTransparent, kSkipped };
thread_local std::vector<Frame> frames;

bool LaunchesNothing(const std::string& name) {
  static const std::set<std::string> kViews = {
      "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::t", "aten::transpose",
      "aten::narrow", "aten::slice", "aten::select", "aten::expand", "aten::unsqueeze",
      "aten::squeeze", "aten::as_strided", "aten::alias", "aten::detach", "aten::empty",
      "aten::empty_strided", "aten::contiguous", "aten::lift_fresh", "aten::permute",
      "aten::_unsafe_view", "aten::numpy_T", "aten::resize_", "aten::set_",
      "aten::result_type", "aten::is_nonzero"};
  return kViews.count(name) > 0;
}

// Top-level operators count once (what they call inside is theirs). The
// autograd engine's frame around a node is transparent (its operators are
// the node's); the frame of a gradient's accumulation into a parameter is
// the optimizer's business, not the linear's, and is skipped whole.
std::unique_ptr<at::ObserverContext> Start(const at::RecordFunction& fn) {
  if (counted == nullptr) return nullptr;
  const std::string name = fn.name();
  const bool inside = std::any_of(frames.begin(), frames.end(),
                                  [](Frame f) { return f != Frame::kTransparent; });
  if (name.rfind("autograd::engine::evaluate_function", 0) == 0) {
    frames.push_back(name.find("AccumulateGrad") != std::string::npos ? Frame::kSkipped
                                                                      : Frame::kTransparent);
    return nullptr;
  }
  frames.push_back(inside ? Frame::kSkipped : Frame::kCounted);
  if (!inside && !LaunchesNothing(name)) ++(*counted)[name];
  return nullptr;
}

void End(const at::RecordFunction&, at::ObserverContext*) {
  if (counted != nullptr && !frames.empty()) frames.pop_back();
}

// The operations of `f`, by name.
std::map<std::string, int> Count(const std::function<void()>& f) {
  std::map<std::string, int> ops;
  auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(Start, End)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
  counted = &ops;
  frames.clear();
  f();
  counted = nullptr;
  at::removeCallback(handle);
  return ops;
}

int Total(const std::map<std::string, int>& ops) {
  int n = 0;
  for (const auto& [name, k] : ops) n += k;
  return n;
}

std::string List(const std::map<std::string, int>& ops) {
  std::string s;
  for (const auto& [name, k] : ops) s += name + " x" + std::to_string(k) + ", ";
  return s;
}

// Forward and backward of one FP8 linear, delayed scaling with a history
// (a step has passed), the weight's cast already made by an earlier
// micro-batch of the step: the steady state of a training step.
TEST(Fp8OpBudget, OneLinearForwardAndBackward) {
  at::manual_seed(1);
  RecipeConfig c;  // delayed
  Fp8Linears fp8(c);
  const at::Tensor w = (at::randn({64, 32}) * 0.1).set_requires_grad(true);
  auto pass = [&] {
    const at::Tensor x = at::randn({16, 32}).set_requires_grad(true);
    const at::Tensor g = at::randn({16, 64});
    return std::make_pair(x, g);
  };
  // Step 1 (no history yet), then a step's first micro-batch.
  for (int i = 0; i < 2; ++i) {
    auto [x, g] = pass();
    fp8.Linear(x, w, "layers.0.wo").backward(g);
    fp8.TakeStats();
    fp8.OnOptimizerStep();
  }
  {
    auto [x, g] = pass();
    fp8.Linear(x, w, "layers.0.wo").backward(g);  // casts the weight for this step
  }
  auto [x, g] = pass();
  at::Tensor y;
  const auto forward = Count([&] { y = fp8.Linear(x, w, "layers.0.wo"); });
  const auto backward = Count([&] { y.backward(g); });
  std::cout << "forward: " << Total(forward) << " (" << List(forward) << ")\n"
            << "backward: " << Total(backward) << " (" << List(backward) << ")\n";
  // Forward: the input's fused cast, its dequantisation and the product
  // (on CUDA: the cast and _scaled_mm), and the autograd function's own
  // bookkeeping. Backward: the gradient's cast, its dequantisation, the two
  // products, the dtype casts of the results.
  EXPECT_EQ(forward.count("tally::fp8_cast"), 1u) << "the input, once; the weight is cached";
  EXPECT_EQ(backward.at("tally::fp8_cast"), 1) << "the gradient, once";
  EXPECT_LE(Total(forward), 8) << List(forward);
  EXPECT_LE(Total(backward), 12) << List(backward);
  for (const auto& ops : {forward, backward}) {
    for (const char* unfused : {"aten::abs", "aten::max", "aten::clamp", "aten::gt",
                                "aten::logical_and", "aten::item", "aten::_local_scalar_dense"}) {
      EXPECT_EQ(ops.count(unfused), 0u) << unfused << " is back: " << List(ops);
    }
  }
  // The optimizer step's scaling update: one operation for every tensor.
  fp8.TakeStats();
  const auto step = Count([&] { fp8.OnOptimizerStep(); });
  EXPECT_EQ(Total(step), 1) << List(step);
}

}  // namespace
}  // namespace tally::precision
