#include "worker/dist/free_port.h"
#include "worker/dist/group.h"

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

// Runs body(group) on `world` ranks, one thread each, in this process.
void OnRanks(int world, const std::function<void(Group&)>& body) {
  const int port = FreeLoopbackPort();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      auto g = Group::Create(Options(r, world, port));
      ASSERT_TRUE(g.ok()) << g.status();
      body(**g);
    });
  }
  for (auto& t : threads) t.join();
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
