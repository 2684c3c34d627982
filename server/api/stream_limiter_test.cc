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

namespace tally::api {
namespace {

// Eight principals at their own limit must not lock out a ninth: the last
// `reserved` places go only to principals that hold none.
TEST(StreamLimiterTest, ReservedPlacesGoToPrincipalsHoldingNone) {
  StreamLimiter::Options o = Limits(64, 512);
  o.reserved = 64;
  o.reserved_flag = "watch_streams_reserved";
  StreamLimiter limiter(o);
  std::vector<StreamLimiter::Lease> held;
  int64_t refused = 0;
  for (int p = 0; p < 8; ++p) {
    for (int i = 0; i < 64; ++i) {
      auto l = limiter.Acquire("tenant" + std::to_string(p));
      if (l.ok()) {
        held.push_back(std::move(*l));
      } else {
        ++refused;
        EXPECT_EQ(l.status().code(), absl::StatusCode::kResourceExhausted);
      }
    }
  }
  // Seven fill max_total - reserved; the eighth, holding none, gets one
  // reserved place.
  EXPECT_EQ(limiter.num_open(), 449);
  EXPECT_EQ(limiter.num_open("tenant7"), 1);
  EXPECT_EQ(refused, 63);
  auto late = limiter.Acquire("tenant7");
  ASSERT_FALSE(late.ok());
  EXPECT_THAT(late.status().message(), HasSubstr("--watch_streams_reserved"));
  EXPECT_THAT(late.status().message(), HasSubstr("tenant7 holds 1"));
  // Newcomers each get one of the reserved places, until they run out.
  for (int p = 0; p < 63; ++p) {
    auto l = limiter.Acquire("newcomer" + std::to_string(p));
    ASSERT_TRUE(l.ok()) << p << ": " << l.status();
    held.push_back(std::move(*l));
  }
  EXPECT_EQ(limiter.num_open(), 512);
  auto full = limiter.Acquire("one more");
  ASSERT_FALSE(full.ok());
  EXPECT_THAT(full.status().message(), HasSubstr("--max_watch_streams=512"));
  EXPECT_FALSE(limiter.Acquire("newcomer0").ok()) << "a newcomer gets one reserved place";
}

TEST(StreamLimiterTest, TableOfReservedDecisions) {
  // max_total 10, reserved 3: principals holding streams stop at 7 in all.
  const struct {
    int64_t open_by_a;      // streams "a" holds before
    int64_t open_by_others; // streams held by principals "o0".. (one each)
    const char* who;
    bool admitted;
  } cases[] = {
      {6, 0, "a", true},   // 6 -> 7: still below max_total - reserved
      {7, 0, "a", false},  // 7 open: only the reserve is left
      {7, 0, "b", true},   // b holds none
      {5, 2, "a", false},  // 7 open in all
      {5, 1, "a", true},
      {7, 2, "o0", false}, // o0 holds one already
      {7, 2, "c", true},
      {7, 3, "c", false},  // 10 open: the server is full
  };
  for (const auto& c : cases) {
    StreamLimiter::Options o = Limits(0, 10);
    o.reserved = 3;
    o.reserved_flag = "watch_streams_reserved";
    StreamLimiter limiter(o);
    std::vector<StreamLimiter::Lease> held;
    for (int64_t i = 0; i < c.open_by_a; ++i) held.push_back(*limiter.Acquire("a"));
    for (int64_t i = 0; i < c.open_by_others; ++i) {
      auto l = limiter.Acquire("o" + std::to_string(i));
      ASSERT_TRUE(l.ok()) << l.status();
      held.push_back(std::move(*l));
    }
    EXPECT_EQ(limiter.Acquire(c.who).ok(), c.admitted)
        << c.who << " with a=" << c.open_by_a << " others=" << c.open_by_others;
  }
}

}  // namespace
}  // namespace tally::api
