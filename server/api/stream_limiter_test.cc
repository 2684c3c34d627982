#include "server/api/stream_limiter.h"

#include <optional>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::api {
namespace {

using ::testing::HasSubstr;

TEST(PrincipalOfPeerTest, IsTheAddressWithoutThePort) {
  EXPECT_EQ(PrincipalOfPeer("ipv4:127.0.0.1:50123"), "127.0.0.1");
  EXPECT_EQ(PrincipalOfPeer("ipv6:[::1]:50123"), "::1");
  EXPECT_EQ(PrincipalOfPeer("ipv6:%5B::1%5D:50123"), "::1");
  EXPECT_EQ(PrincipalOfPeer("ipv6:%5B%3A%3A1%5D:50123"), "::1");
  EXPECT_EQ(PrincipalOfPeer("unix:/tmp/tally.sock"), "unix:/tmp/tally.sock");
  EXPECT_EQ(PrincipalOfPeer(""), "");
  EXPECT_EQ(PrincipalOfPeer("ipv4:"), "");
  EXPECT_EQ(PrincipalOfPeer("ipv6:[::1"), "[::1");
}

StreamLimiter::Options Limits(int64_t per_principal, int64_t total) {
  StreamLimiter::Options o;
  o.what = "WatchJob streams";
  o.max_per_principal = per_principal;
  o.per_principal_flag = "max_watch_streams_per_principal";
  o.max_total = total;
  o.total_flag = "max_watch_streams";
  return o;
}

TEST(StreamLimiterTest, PerPrincipalLimitNamesTheFlag) {
  StreamLimiter limiter(Limits(2, 10));
  auto a = limiter.Acquire("10.0.0.1");
  auto b = limiter.Acquire("10.0.0.1");
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = limiter.Acquire("10.0.0.1");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(), HasSubstr("--max_watch_streams_per_principal=2"));
  EXPECT_THAT(c.status().message(), HasSubstr("10.0.0.1"));
  EXPECT_TRUE(limiter.Acquire("10.0.0.2").ok()) << "another caller is not limited";
  a->Release();
  EXPECT_EQ(limiter.num_open("10.0.0.1"), 1);
  EXPECT_TRUE(limiter.Acquire("10.0.0.1").ok());
}

TEST(StreamLimiterTest, TotalLimitNamesTheFlag) {
  StreamLimiter limiter(Limits(0, 3));
  std::vector<StreamLimiter::Lease> held;
  for (int i = 0; i < 3; ++i) {
    auto l = limiter.Acquire("p" + std::to_string(i));
    ASSERT_TRUE(l.ok());
    held.push_back(std::move(*l));
  }
  auto over = limiter.Acquire("p9");
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("--max_watch_streams=3"));
  held.pop_back();  // a destroyed lease gives its place back
  EXPECT_EQ(limiter.num_open(), 2);
  EXPECT_TRUE(limiter.Acquire("p9").ok());
  EXPECT_EQ(limiter.num_open(), 2) << "the temporary lease was released";
}

TEST(StreamLimiterTest, MovedLeaseReleasesOnce) {
  StreamLimiter limiter(Limits(1, 0));
  std::optional<StreamLimiter::Lease> outer;
  {
    auto l = limiter.Acquire("x");
    ASSERT_TRUE(l.ok());
    StreamLimiter::Lease moved = std::move(*l);
    outer.emplace(std::move(moved));
  }
  EXPECT_EQ(limiter.num_open("x"), 1);
  outer.reset();
  EXPECT_EQ(limiter.num_open("x"), 0);
  EXPECT_EQ(limiter.num_open(), 0);
}

}  // namespace
}  // namespace tally::api
