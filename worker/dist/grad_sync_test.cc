#include "worker/dist/grad_sync.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "worker/dist/on_ranks.h"

namespace tally::dist {
namespace {

// Three parameters in a chain, 4 KiB each, one bucket each. Rank r's loss
// is (r + 1) x sum(c * (b * a)) over two micro-batches; rank 1 leaves `b`
// out of its first micro-batch and rank 0 never uses `c`.
TEST(GradientSyncTest, SumsOverlapTheBackwardAndKeepOrder) {
  std::vector<at::Tensor> results[2];
  int early[2] = {0, 0}, buckets[2] = {0, 0};
  OnRanks(2, [&](Group& group) {
    const int rank = group.rank();
    std::vector<at::Tensor> params = {at::full({1024}, 1.0), at::full({1024}, 2.0),
                                      at::full({1024}, 3.0)};
    for (auto& p : params) p.set_requires_grad(true);
    GradientSync sync(&group, params, 4096);
    buckets[rank] = sync.num_buckets();
    for (int micro = 0; micro < 2; ++micro) {
      if (micro == 1) sync.Arm();
      at::Tensor h = params[0] * (rank == 1 && micro == 0 ? at::ones({1024}) : params[1]);
      if (rank == 1) h = h * params[2];
      ((rank + 1.0) * h.sum()).backward();
    }
    sync.Finish();
    early[rank] = sync.launched_during_backward();
    for (auto& p : params) results[rank].push_back(p.grad().clone());
  });
  EXPECT_EQ(buckets[0], 3);
  // Rank 0: da = 2 b, db = 2 a (both micro-batches), dc = 0.
  // Rank 1: da = 2 (c + b c), db = 2 a c (second only), dc = 2 (a + a b).
  const at::Tensor want_a = at::full({1024}, 2 * 2.0 + 2 * (3.0 + 2.0 * 3.0));
  const at::Tensor want_b = at::full({1024}, 2 * 1.0 + 2 * 1.0 * 3.0);
  const at::Tensor want_c = at::full({1024}, 2 * (1.0 + 1.0 * 2.0));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(at::allclose(results[r][0], want_a)) << r;
    EXPECT_TRUE(at::allclose(results[r][1], want_b)) << r;
    EXPECT_TRUE(at::allclose(results[r][2], want_c)) << r;
  }
  // Rank 1 reaches every parameter, so its buckets go out during the
  // backward; rank 0 never reaches c, whose bucket is first in order (the
  // last parameter), so nothing can go before Finish.
  EXPECT_EQ(early[1], 3);
  EXPECT_EQ(early[0], 0);
}

}  // namespace
}  // namespace tally::dist
