#include "server/api/rate_limiter.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::api {
namespace {

using ::testing::HasSubstr;

RateLimiter::Options Submits(double per_second, int64_t burst) {
  return {per_second, burst, "submits", "limits.submits_per_second", "limits.submit_burst"};
}

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// Each step: time since the start, who calls, and whether it is admitted.
struct Step {
  double at_seconds;
  std::string principal;
  bool admitted;
};

TEST(RateLimiterTest, TokenBucketPerPrincipal) {
  const struct {
    const char* name;
    double per_second;
    int64_t burst;
    std::vector<Step> steps;
  } cases[] = {
      {"burst then refused",
       2,
       3,
       {{0, "a", true}, {0, "a", true}, {0, "a", true}, {0, "a", false}, {0.49, "a", false},
        {0.5, "a", true}, {0.5, "a", false}, {1.5, "a", true}, {1.5, "a", true},
        {1.5, "a", false}}},
      {"principals are independent",
       1,
       1,
       {{0, "a", true}, {0, "a", false}, {0, "b", true}, {0, "b", false}, {1, "a", true},
        {1, "b", true}}},
      {"refill stops at the burst",
       10,
       2,
       {{0, "a", true}, {0, "a", true}, {100, "a", true}, {100, "a", true}, {100, "a", false}}},
      {"a slow rate",
       0.1,
       1,
       {{0, "a", true}, {9.9, "a", false}, {10, "a", true}}},
      {"no limit",
       0,
       1,
       {{0, "a", true}, {0, "a", true}, {0, "a", true}, {0, "a", true}}},
      {"a clock that steps back refills nothing",
       1,
       1,
       {{10, "a", true}, {5, "a", false}, {10.5, "a", false}, {11, "a", true}}},
  };
  for (const auto& c : cases) {
    RateLimiter limiter(Submits(c.per_second, c.burst));
    int i = 0;
    for (const Step& s : c.steps) {
      const absl::Status got =
          limiter.Take(s.principal, kT0 + absl::Seconds(s.at_seconds));
      EXPECT_EQ(got.ok(), s.admitted) << c.name << ", step " << i << ": " << got;
      if (!got.ok()) EXPECT_EQ(got.code(), absl::StatusCode::kResourceExhausted);
      ++i;
    }
  }
}

TEST(RateLimiterTest, RefusalNamesTheLimitAndWhenToRetry) {
  RateLimiter limiter(Submits(4, 1));
  ASSERT_TRUE(limiter.Take("user:alice", kT0).ok());
  const absl::Status s = limiter.Take("user:alice", kT0 + absl::Milliseconds(100));
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("user:alice is over its limit of 4 submits"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.submits_per_second"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.submit_burst"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("retry in 150ms"));
  EXPECT_EQ(limiter.WaitFor("user:alice", kT0 + absl::Milliseconds(100)),
            absl::Milliseconds(150));
  EXPECT_EQ(limiter.WaitFor("user:alice", kT0 + absl::Milliseconds(250)), absl::ZeroDuration());
  EXPECT_EQ(limiter.WaitFor("someone else", kT0), absl::ZeroDuration());
}

TEST(RateLimiterTest, SetLimitsTakesEffectAtOnce) {
  RateLimiter limiter(Submits(1, 5));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(limiter.Take("a", kT0).ok());
  EXPECT_FALSE(limiter.Take("a", kT0).ok());
  limiter.SetLimits(0, 1);  // no limit
  EXPECT_TRUE(limiter.Take("a", kT0).ok());
  limiter.SetLimits(1, 1);
  EXPECT_TRUE(limiter.Take("b", kT0).ok());
  EXPECT_FALSE(limiter.Take("b", kT0).ok());
}

TEST(RateLimiterTest, ForgetsRefilledBucketsToStayBounded) {
  RateLimiter limiter(Submits(1, 1));
  for (size_t i = 0; i < RateLimiter::kMaxTracked; ++i) {
    ASSERT_TRUE(limiter.Take("p" + std::to_string(i), kT0).ok());
  }
  EXPECT_EQ(limiter.num_tracked(), RateLimiter::kMaxTracked);
  // Two seconds on every bucket is full again: a new principal sweeps them.
  ASSERT_TRUE(limiter.Take("new", kT0 + absl::Seconds(2)).ok());
  EXPECT_EQ(limiter.num_tracked(), 1u);
  // Empty buckets are kept: forgetting them would hand out a fresh burst.
  EXPECT_FALSE(limiter.Take("new", kT0 + absl::Seconds(2)).ok());
}

}  // namespace
}  // namespace tally::api
