#include "worker/dist/free_port.h"
#include "worker/dist/group.h"
#include "worker/dist/on_ranks.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"

namespace tally::dist {
namespace {

GroupOptions Options(int rank, int world, int port, double timeout = 30) {
  GroupOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store_address = absl::StrCat("127.0.0.1:", port);
  o.prefix = "test";
  o.timeout_seconds = timeout;
  return o;
}

TEST(GroupTest, AllReduceSumAcrossBucketsAndDtypes) {
  OnRanks(3, [](Group& g) {
    EXPECT_EQ(g.backend(), "gloo");
    EXPECT_EQ(g.size(), 3);
    const double r = g.rank();
    // 1000 floats is 4000 bytes: a 4096-byte cap puts these in three
    // float buckets, plus one double bucket.
    std::vector<at::Tensor> ts = {at::full({10, 100}, r + 1, at::kFloat),
                                  at::arange(7, at::kFloat) * (r + 1),
                                  at::full({3}, r, at::kDouble), at::Tensor(),
                                  at::full({2, 500}, -r, at::kFloat)};
    g.AllReduceSum(ts, 4096);
    EXPECT_TRUE(at::allclose(ts[0], at::full({10, 100}, 6.0)));
    EXPECT_TRUE(at::allclose(ts[1], at::arange(7, at::kFloat) * 6));
    EXPECT_TRUE(at::equal(ts[2], at::full({3}, 3.0, at::kDouble)));
    EXPECT_FALSE(ts[3].defined());
    EXPECT_TRUE(at::allclose(ts[4], at::full({2, 500}, -3.0)));
  });
}

TEST(GroupTest, MaxAndBroadcast) {
  OnRanks(2, [](Group& g) {
    at::Tensor m = at::tensor({g.rank() == 0 ? 5.0 : 1.0, g.rank() == 0 ? -1.0 : 2.0});
    g.AllReduceMax(m);
    EXPECT_TRUE(at::equal(m, at::tensor({5.0, 2.0})));
    at::Tensor b = at::full({4}, static_cast<float>(g.rank() + 10));
    g.Broadcast({b}, 1);
    EXPECT_TRUE(at::equal(b, at::full({4}, 11.0f)));
    g.Barrier();
  });
}

TEST(GroupTest, AllToAllWithUnevenAndEmptySplits) {
  OnRanks(3, [](Group& g) {
    const int r = g.rank();
    // Rank r sends j + r rows to rank j, each row [r, j]; rank 0 sends
    // nothing to itself.
    std::vector<int64_t> send(3), recv(3);
    std::vector<float> rows;
    for (int j = 0; j < 3; ++j) {
      send[j] = j + r;
      recv[j] = r + j;
      for (int i = 0; i < j + r; ++i) rows.insert(rows.end(), {float(r), float(j)});
    }
    at::Tensor x = at::tensor(rows, at::kFloat).reshape({-1, 2});
    at::Tensor y = g.AllToAll(x, send, recv);
    ASSERT_EQ(y.size(0), 3 * r + 3);
    int64_t at_row = 0;
    for (int j = 0; j < 3; ++j) {
      for (int i = 0; i < r + j; ++i, ++at_row) {
        EXPECT_EQ(y[at_row][0].item<float>(), j);  // from rank j
        EXPECT_EQ(y[at_row][1].item<float>(), r);  // meant for me
      }
    }
    // A second group of the same ranks works beside the first.
    auto other = g.NewGroup("other");
    ASSERT_TRUE(other.ok()) << other.status();
    at::Tensor t = at::full({2}, float(r));
    (*other)->AllReduceSum({t});
    EXPECT_TRUE(at::equal(t, at::full({2}, 3.0f)));
  });
}

TEST(GroupTest, MissingPeerTimesOutWithTheAddress) {
  const int port = FreeLoopbackPort();
  const auto start = std::chrono::steady_clock::now();
  auto g = Group::Create(Options(0, 2, port, /*timeout=*/1.5));
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()),
              ::testing::HasSubstr(absl::StrCat("127.0.0.1:", port)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST(GroupTest, BadAddressNamesTheFix) {
  GroupOptions o = Options(0, 2, 1);
  o.store_address = "nohostport";
  auto g = Group::Create(o);
  ASSERT_FALSE(g.ok());
  EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr("host:port"));
  o.rank = 2;
  EXPECT_FALSE(Group::Create(o).ok());
}

TEST(GroupTest, PeerThatLeavesFailsTheCollective) {
  const int port = FreeLoopbackPort();
  std::thread leaver([&] {
    auto g = Group::Create(Options(1, 2, port));
    ASSERT_TRUE(g.ok()) << g.status();
    // Leaves (destroys its group) without joining the next collective.
  });
  auto g = Group::Create(Options(0, 2, port, /*timeout=*/20));
  ASSERT_TRUE(g.ok()) << g.status();
  leaver.join();
  const auto start = std::chrono::steady_clock::now();
  at::Tensor t = at::ones({8});
  EXPECT_THROW((*g)->AllReduceSum({t}), CollectiveError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(25));
}

}  // namespace
}  // namespace tally::dist
