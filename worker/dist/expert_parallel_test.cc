// Expert parallelism against the single-process MoE block: two ranks (threads
// joined by a real Gloo group) each route their own tokens, compute only
// their own experts, and get the same outputs and gradients.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "worker/dist/expert_parallel.h"
#include "worker/dist/on_ranks.h"
#include "worker/model/transformer.h"

namespace tally::dist {
namespace {

// Plain products that remember which sites ran.
class Recording final : public model::LinearOverride {
 public:
  at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const std::string& site) override {
    std::lock_guard<std::mutex> lock(mu_);
    sites_.insert(site);
    return at::linear(x, w);
  }
  std::set<std::string> sites() const { return sites_; }

 private:
  std::mutex mu_;
  std::set<std::string> sites_;
};

struct Result {
  at::Tensor y, dx, dw1, drouter;
  std::set<std::string> sites;
  int64_t host_reads = 0;  // the MoE layer's, forward and backward
};

// run(rank, exchange) on two ranks.
void OnTwoRanks(const std::function<Result(int, ExpertExchange*)>& run, Result* split) {
  OnRanks(2, [&](Group& g) {
    GroupExchange ex(&g);
    split[g.rank()] = run(g.rank(), &ex);
  });
}

class ExpertParallelTest : public ::testing::Test {
 protected:
  static constexpr int64_t E = 4, D = 8, F = 16, N = 37;
  ExpertParallelTest() {
    c_.num_experts = E;
    c_.top_k = 2;
    at::manual_seed(5);
    router_ = at::randn({E, D});
    w_ = {at::randn({E, F, D}) * 0.3, at::randn({E, F, D}) * 0.3, at::randn({E, D, F}) * 0.3};
    tokens_[0] = at::randn({N, D});
    tokens_[1] = at::randn({N + 9, D});
  }
  // One rank's MoE block: with `linear` (the loop over experts) or without
  // (grouped products); with `shard`, the rank holds only its own experts.
  Result Run(int rank, ExpertExchange* ex, model::LinearOverride* linear, bool shard) {
    std::vector<at::Tensor> p = {router_.clone()};
    for (const at::Tensor& w : w_) p.push_back(shard ? w.narrow(0, 2 * rank, 2).clone() : w.clone());
    for (auto& t : p) t.set_requires_grad(true);
    at::Tensor x = tokens_[rank].clone().set_requires_grad(true);
    std::optional<ExpertParallel> hook;
    if (ex != nullptr) hook.emplace(ex);
    const int64_t reads = model::MoeHostReads();
    model::MoeOutput out = model::MoeForward(x, {}, p[0], {}, p[1], p[2], p[3], c_, linear, "l.",
                                             hook ? &*hook : nullptr);
    (out.y_ND * at::arange(D, at::kFloat)).sum().backward();
    Result r{out.y_ND.detach(), x.grad(), p[1].grad(), p[0].grad(), {},
             model::MoeHostReads() - reads};
    if (!r.dw1.defined()) r.dw1 = at::zeros_like(p[1]);
    return r;
  }
  model::MoeConfig c_;
  at::Tensor router_, tokens_[2];
  std::vector<at::Tensor> w_;
};

TEST_F(ExpertParallelTest, MatchesOneProcessAndSplitsTheExperts) {
  auto run = [&](int rank, ExpertExchange* ex) {
    Recording rec;
    Result r = Run(rank, ex, &rec, /*shard=*/false);
    r.sites = rec.sites();
    return r;
  };
  Result alone[2] = {run(0, nullptr), run(1, nullptr)};
  Result split[2];
  OnTwoRanks(run, split);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(at::allclose(split[rank].y, alone[rank].y, 1e-5, 1e-6)) << rank;
    EXPECT_TRUE(at::allclose(split[rank].dx, alone[rank].dx, 1e-5, 1e-6)) << rank;
    EXPECT_TRUE(at::allclose(split[rank].drouter, alone[rank].drouter, 1e-5, 1e-6)) << rank;
    // Rank r computed experts 2r and 2r + 1 only, for both ranks' tokens.
    for (const auto& site : split[rank].sites) {
      const int e = site[std::string("l.experts.").size()] - '0';
      EXPECT_EQ(e / 2, rank) << site;
    }
  }
  // Each rank waits for the host once: its own counts and the ones the
  // other rank sends, in one read (the loop over experts alone reads its
  // counts too).
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(split[rank].host_reads, 1) << rank;
    EXPECT_EQ(alone[rank].host_reads, 1) << rank;
  }
  // Expert weight gradients live on the owner: summed over ranks they are
  // what the two single-process runs give together.
  EXPECT_TRUE(at::allclose(split[0].dw1 + split[1].dw1, alone[0].dw1 + alone[1].dw1, 1e-4,
                           1e-5));
  EXPECT_TRUE(at::equal(split[0].dw1.narrow(0, 2, 2), at::zeros({2, F, D})));
}

TEST_F(ExpertParallelTest, ShardedWeightsWithGroupedProducts) {
  // Each rank holds only its two experts and runs them as grouped products
  // over both ranks' rows for them.
  Result alone[2] = {Run(0, nullptr, nullptr, false), Run(1, nullptr, nullptr, false)};
  Result split[2];
  OnTwoRanks([&](int rank, ExpertExchange* ex) { return Run(rank, ex, nullptr, true); },
             split);
  const at::Tensor dw1 = alone[0].dw1 + alone[1].dw1;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_TRUE(at::allclose(split[rank].y, alone[rank].y, 1e-5, 1e-6)) << rank;
    EXPECT_TRUE(at::allclose(split[rank].dx, alone[rank].dx, 1e-5, 1e-6)) << rank;
    EXPECT_TRUE(at::allclose(split[rank].drouter, alone[rank].drouter, 1e-5, 1e-6)) << rank;
    ASSERT_EQ(split[rank].dw1.size(0), 2);
    // The owner's gradient is already every rank's: nothing left to sum.
    EXPECT_TRUE(at::allclose(split[rank].dw1, dw1.narrow(0, 2 * rank, 2), 1e-4, 1e-5)) << rank;
    // One read per rank (the counts); grouped products on one process read
    // none.
    EXPECT_EQ(split[rank].host_reads, 1) << rank;
    EXPECT_EQ(alone[rank].host_reads, 0) << rank;
  }
}

// One rank that gets back exactly the rows it sends, and remembers what each
// exchange was handed.
class LoopbackExchange final : public ExpertExchange {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  at::Tensor AllToAll(const at::Tensor& x, const std::vector<int64_t>& send,
                      const std::vector<int64_t>& recv) override {
    handed.push_back(x.detach().clone());
    return x.clone();
  }
  std::vector<at::Tensor> handed;
};

// Passes its input on and gives it no gradient (an undefined one).
struct NoGradientBack : public torch::autograd::Function<NoGradientBack> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    return {at::Tensor()};
  }
};

// A rank whose exchanged rows get no gradient still joins the backward
// exchange, with zeros on the input's device and in its dtype (FP32 zeros
// from a BF16 or a CUDA input would make the ranks disagree, and autograd
// refuses a CPU gradient for a CUDA input).
TEST(AllToAllWithGradTest, UndefinedGradientSendsZerosLikeTheInput) {
  for (const at::ScalarType dtype : {at::kBFloat16, at::kDouble, at::kFloat}) {
    SCOPED_TRACE(c10::toString(dtype));
    LoopbackExchange ex;
    at::Tensor x = at::randn({5, 3}).to(dtype).set_requires_grad(true);
    at::Tensor y = AllToAllWithGrad(x, &ex, {5}, {5});
    NoGradientBack::apply(y).to(at::kFloat).sum().backward();
    ASSERT_EQ(ex.handed.size(), 2u);  // forward, then backward
    const at::Tensor& back = ex.handed[1];
    EXPECT_EQ(back.scalar_type(), dtype);
    EXPECT_EQ(back.device(), x.device());
    EXPECT_EQ(back.sizes(), x.sizes());
    EXPECT_TRUE(at::equal(back, at::zeros_like(x)));
    ASSERT_TRUE(x.grad().defined());
    EXPECT_EQ(x.grad().scalar_type(), dtype);
    EXPECT_TRUE(at::equal(x.grad(), at::zeros_like(x)));
  }
}

TEST(AllToAllWithGradTest, GradientGoesBackAlongTheSameRoutes) {
  LoopbackExchange ex;
  at::Tensor x = at::randn({4, 2}, at::kDouble).set_requires_grad(true);
  at::Tensor w = at::randn({4, 2}, at::kDouble);
  (AllToAllWithGrad(x, &ex, {4}, {4}) * w).sum().backward();
  ASSERT_EQ(ex.handed.size(), 2u);
  EXPECT_TRUE(at::equal(ex.handed[1], w));
  EXPECT_TRUE(at::equal(x.grad(), w));
}

}  // namespace
}  // namespace tally::dist
