// LeaseKeeper on a FakeMonotonicClock, with no PostgreSQL: its lease points
// at a port nobody listens on, so every renewal fails and only the clock (or
// must_restart) can cost the lease. Renewals that succeed need a database:
// leader_lease_test.cc.
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ha/leader_lease.h"

namespace tally::ha {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kTimeout = absl::Milliseconds(300);
constexpr absl::Duration kTick = absl::Nanoseconds(1);
constexpr char kUnreachable[] = "host=127.0.0.1 port=1 dbname=x connect_timeout=1";

// Counts the watcher's passes through must_restart, which it polls on every
// pass before it checks the deadline.
class WatchPasses {
 public:
  bool Poll() {
    absl::MutexLock lock(&mu_);
    ++num_passes_;
    return must_restart_;
  }
  void SetMustRestart() {
    absl::MutexLock lock(&mu_);
    must_restart_ = true;
  }
  // Returns once a deadline check has started and finished since the call:
  // the next pass's poll follows the check of the pass after `now`.
  bool AwaitOneFullPass() {
    absl::MutexLock lock(&mu_);
    const int target = num_passes_ + 2;
    auto reached = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return num_passes_ >= target; };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), absl::Seconds(10));
  }

 private:
  absl::Mutex mu_;
  int num_passes_ ABSL_GUARDED_BY(mu_) = 0;
  bool must_restart_ ABSL_GUARDED_BY(mu_) = false;
};

class LeaseKeeperTest : public ::testing::Test {
 protected:
  LeaseKeeper::Options Options() {
    LeaseKeeper::Options options;
    options.lease_timeout = kTimeout;
    options.clock = &clock_;
    options.must_restart = [this] { return passes_.Poll(); };
    options.on_lost = [this](const std::string& why) {
      {
        absl::MutexLock lock(&mu_);
        why_ = why;
        ++num_lost_;
      }
      lost_.Notify();
    };
    return options;
  }
  std::string why() {
    absl::MutexLock lock(&mu_);
    return why_;
  }
  int num_lost() {
    absl::MutexLock lock(&mu_);
    return num_lost_;
  }

  FakeMonotonicClock clock_;
  LeaderLease lease_{kUnreachable, "a:1", kTimeout};
  WatchPasses passes_;
  absl::Notification lost_;
  absl::Mutex mu_;
  std::string why_ ABSL_GUARDED_BY(mu_);
  int num_lost_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(LeaseKeeperTest, StepsDownExactlyAtTheDeadlineOnItsClock) {
  LeaseKeeper keeper(&lease_, 1, clock_.Elapsed(), Options());
  clock_.Advance(kTimeout - kTick);
  ASSERT_TRUE(passes_.AwaitOneFullPass());
  EXPECT_FALSE(keeper.lost());
  clock_.Advance(kTick);
  ASSERT_TRUE(lost_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  keeper.Stop();
  EXPECT_TRUE(keeper.lost());
  EXPECT_EQ(num_lost(), 1);
  EXPECT_THAT(why(), HasSubstr("(epoch 1) was not renewed for 300ms"));
}

TEST_F(LeaseKeeperTest, AMissedDeadlineIsALapseUntilMaxLapseWithALapseHandler) {
  LeaseKeeper::Options options = Options();
  absl::Notification lapsed;
  std::string lapse_why;
  options.on_lapsed = [&](const std::string& why) {
    lapse_why = why;
    lapsed.Notify();
  };
  options.on_restored = [] { ADD_FAILURE() << "no renewal can succeed here"; };
  options.max_lapse = absl::Seconds(5);
  LeaseKeeper keeper(&lease_, 1, clock_.Elapsed(), options);
  clock_.Advance(kTimeout);
  ASSERT_TRUE(lapsed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(lapse_why, HasSubstr("serves nothing until a renewal"));
  EXPECT_TRUE(keeper.lapsed());
  EXPECT_FALSE(keeper.lost());
  // Still renewing, still not lost, up to max_lapse after the lapse began.
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(passes_.AwaitOneFullPass());
  EXPECT_FALSE(keeper.lost());
  clock_.Advance(kTick);
  ASSERT_TRUE(lost_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(why(), HasSubstr("could not be renewed for 5s after it lapsed"));
  keeper.Stop();
  EXPECT_EQ(num_lost(), 1);
}

TEST_F(LeaseKeeperTest, CountsFromWhenTheAcquisitionWasSent) {
  const absl::Duration sent = clock_.Elapsed();
  clock_.Advance(absl::Milliseconds(100));  // the acquiring statement's round trip
  LeaseKeeper keeper(&lease_, 1, sent, Options());
  clock_.Advance(absl::Milliseconds(200) - kTick);
  ASSERT_TRUE(passes_.AwaitOneFullPass());
  EXPECT_FALSE(keeper.lost());
  clock_.Advance(kTick);
  ASSERT_TRUE(lost_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_THAT(why(), HasSubstr("was not renewed"));
}

TEST_F(LeaseKeeperTest, RealTimeAloneDoesNotCostTheLease) {
  // At least 14 watch passes, 50 ms of real time apart, with every renewal
  // failing: over twice the lease_timeout on a real clock. This one stands
  // still.
  LeaseKeeper keeper(&lease_, 1, clock_.Elapsed(), Options());
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(passes_.AwaitOneFullPass());
  EXPECT_FALSE(keeper.lost());
  keeper.Stop();
  EXPECT_EQ(num_lost(), 0);
}

TEST_F(LeaseKeeperTest, GivesUpWhenTheStoreMustRestart) {
  // The clock stands still: the deadline is far off.
  LeaseKeeper keeper(&lease_, 1, clock_.Elapsed(), Options());
  passes_.SetMustRestart();
  ASSERT_TRUE(lost_.WaitForNotificationWithTimeout(absl::Seconds(10)));
  keeper.Stop();
  EXPECT_EQ(num_lost(), 1);
  EXPECT_THAT(why(), HasSubstr("recovered from the database"));
}

}  // namespace
}  // namespace tally::ha
