// LeaderLease against a real PostgreSQL (initdb'd per test binary); the lease
// table comes from the store's migration, as in tallyd.
#include "server/ha/leader_lease.h"

#include <libpq-fe.h>

#include <atomic>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/ha/await_lease.h"
#include "server/store/postgres_job_store.h"
#include "tests/support/store/postgres_server.h"
#include "tests/support/store/records.h"

namespace tally::ha {
namespace {

using ::tally::store::testing::NewJob;
using ::tally::store::testing::Submitted;

using ::testing::HasSubstr;

class LeaderLeaseTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto server = store::testing::PostgresServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    auto dsn = server_->CreateDatabase();
    ASSERT_TRUE(dsn.ok()) << dsn.status();
    dsn_ = *dsn;
    // The store's migration creates tally_lease and its row.
    auto store = store::PostgresJobStore::Open(dsn_);
    ASSERT_TRUE(store.ok()) << store.status();
  }

  // Runs one statement on its own connection.
  void Sql(const std::string& sql) {
    PGconn* c = PQconnectdb(dsn_.c_str());
    ASSERT_EQ(PQstatus(c), CONNECTION_OK) << PQerrorMessage(c);
    PGresult* r = PQexec(c, sql.c_str());
    EXPECT_EQ(PQresultStatus(r), PGRES_COMMAND_OK) << PQresultErrorMessage(r);
    PQclear(r);
    PQfinish(c);
  }

  static store::testing::PostgresServer* server_;
  std::string dsn_;
};

store::testing::PostgresServer* LeaderLeaseTest::server_ = nullptr;

TEST_F(LeaderLeaseTest, FirstHolderAcquiresEpochOne) {
  LeaderLease a(dsn_, "a:1", absl::Seconds(30));
  auto epoch = a.TryAcquire();
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  ASSERT_TRUE(epoch->has_value());
  EXPECT_EQ(**epoch, 1);
  auto state = a.Read();
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->holder, "a:1");
  EXPECT_EQ(state->epoch, 1);
  EXPECT_TRUE(state->valid);
  EXPECT_EQ(state->Describe(), "a:1 (epoch 1)");
}

TEST_F(LeaderLeaseTest, SecondHolderRefusedWhileValid) {
  LeaderLease a(dsn_, "a:1", absl::Seconds(30));
  LeaderLease b(dsn_, "b:2", absl::Seconds(30));
  ASSERT_TRUE(a.TryAcquire().ok());
  auto epoch = b.TryAcquire();
  ASSERT_TRUE(epoch.ok()) << epoch.status();
  EXPECT_FALSE(epoch->has_value());
  // The holder keeps renewing.
  EXPECT_TRUE(a.Renew(1).ok());
  EXPECT_FALSE(b.TryAcquire()->has_value());
  EXPECT_EQ(b.Read()->holder, "a:1");
}

TEST_F(LeaderLeaseTest, TakeoverAfterExpiryBumpsEpochAndOldRenewFails) {
  LeaderLease a(dsn_, "a:1", absl::Milliseconds(300));
  LeaderLease b(dsn_, "b:2", absl::Milliseconds(300));
  auto first = a.TryAcquire();
  ASSERT_TRUE(first.ok() && first->has_value());
  absl::SleepFor(absl::Milliseconds(400));
  EXPECT_FALSE(b.Read()->valid);
  auto second = b.TryAcquire();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(second->has_value());
  EXPECT_EQ(**second, **first + 1);
  absl::Status renew = a.Renew(**first);
  EXPECT_TRUE(absl::IsFailedPrecondition(renew)) << renew;
  EXPECT_THAT(renew.message(), HasSubstr("another tallyd took over"));
  // Releasing a lost epoch does not touch the new holder's lease.
  EXPECT_TRUE(a.Release(**first).ok());
  EXPECT_TRUE(a.Read()->valid);
  EXPECT_EQ(a.Read()->holder, "b:2");
}

TEST_F(LeaderLeaseTest, ReleaseLetsAStandbyTakeOverAtOnce) {
  LeaderLease a(dsn_, "a:1", absl::Seconds(60));
  LeaderLease b(dsn_, "b:2", absl::Seconds(60));
  auto first = a.TryAcquire();
  ASSERT_TRUE(first.ok() && first->has_value());
  ASSERT_TRUE(a.Release(**first).ok());
  auto second = b.TryAcquire();
  ASSERT_TRUE(second.ok() && second->has_value());
  EXPECT_EQ(**second, 2);
}

TEST_F(LeaderLeaseTest, FencedStoreRefusesWritesAfterTakeover) {
  LeaderLease a(dsn_, "a:1", absl::Milliseconds(300));
  LeaderLease b(dsn_, "b:2", absl::Seconds(60));
  auto first = a.TryAcquire();
  ASSERT_TRUE(first.ok() && first->has_value());
  auto old_leader = store::PostgresJobStore::Open(dsn_);
  ASSERT_TRUE(old_leader.ok());
  (*old_leader)->SetFencingEpoch(**first);
  ASSERT_TRUE((*old_leader)->CreateJob(NewJob(), Submitted()).ok());
  absl::SleepFor(absl::Milliseconds(400));
  ASSERT_TRUE(b.TryAcquire()->has_value());
  auto refused = (*old_leader)->CreateJob(NewJob(), Submitted());
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_TRUE((*old_leader)->MustRestart());
  auto reader = store::PostgresJobStore::Open(dsn_);
  ASSERT_TRUE(reader.ok());
  auto jobs = (*reader)->ListJobs({});
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->size(), 1u);
}

TEST_F(LeaderLeaseTest, KeeperRenewsAndReportsLossOnce) {
  LeaderLease a(dsn_, "a:1", absl::Milliseconds(1500));
  // The keeper's default clock, the real one: renewals run on real time here.
  const absl::Duration sent = RealMonotonicClock::Get()->Elapsed();
  auto epoch = a.TryAcquire();
  ASSERT_TRUE(epoch.ok() && epoch->has_value());
  std::atomic<int> lost{0};
  std::string why;
  absl::Notification done;
  LeaseKeeper::Options options;
  options.lease_timeout = absl::Milliseconds(1500);
  options.on_lost = [&](const std::string& w) {
    why = w;
    lost.fetch_add(1);
    done.Notify();
  };
  LeaseKeeper keeper(&a, **epoch, sent, options);
  // Renewed for two lease lengths (renewals every 500 ms, with room for a
  // slow one on a loaded machine): nobody else can take it.
  LeaderLease b(dsn_, "b:2", absl::Seconds(60));
  for (int i = 0; i < 6; ++i) {
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_FALSE(b.TryAcquire()->has_value());
  }
  EXPECT_EQ(lost.load(), 0);
  // Another holder bumps the epoch behind its back (an operator, or a
  // takeover after a partition): the next renewal finds the lease lost.
  // One statement, as a takeover is: a renewal cannot slip in between.
  Sql("UPDATE tally_lease SET holder = 'b:2', epoch = epoch + 1, "
      "expires_at = now() + interval '60 seconds' WHERE id = 1");
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  keeper.Stop();
  EXPECT_EQ(lost.load(), 1);
  EXPECT_THAT(why, HasSubstr("another tallyd took over"));
}

// A PostgreSQL restart drops the holder's connection; the next renewal
// still succeeds (on a fresh connection), so a restart alone costs no
// renewal and no lease.
TEST_F(LeaderLeaseTest, ARenewalSurvivesADatabaseRestart) {
  LeaderLease a(dsn_, "a:1", absl::Seconds(60));
  auto epoch = a.TryAcquire();
  ASSERT_TRUE(epoch.ok() && epoch->has_value()) << epoch.status();
  ASSERT_TRUE(a.Renew(**epoch).ok());  // its connection is open
  ASSERT_TRUE(server_->Restart().ok());
  absl::Status renewed = a.Renew(**epoch);
  EXPECT_TRUE(renewed.ok()) << renewed;
}

TEST_F(LeaderLeaseTest, AwaitLeaseNamesTheLeaderThenTakesOver) {
  LeaderLease a(dsn_, "a:1", absl::Seconds(60));
  auto first = a.TryAcquire();
  ASSERT_TRUE(first.ok() && first->has_value());
  LeaderLease b(dsn_, "b:2", absl::Seconds(60));
  FakeMonotonicClock clock;
  const absl::Duration start = clock.Elapsed();
  std::vector<std::string> leaders;
  int waits = 0;
  AwaitOptions options;
  options.poll_interval = absl::Milliseconds(10);
  options.clock = &clock;
  options.on_leader = [&](const std::string& l) { leaders.push_back(l); };
  options.wait = [&](absl::Duration d) {
    clock.Advance(d);
    if (++waits == 3) EXPECT_TRUE(a.Release(**first).ok());
    return waits < 10;
  };
  auto acquired = AwaitLease(&b, options);
  ASSERT_TRUE(acquired.ok()) << acquired.status();
  ASSERT_TRUE(acquired->has_value());
  EXPECT_EQ((*acquired)->epoch, 2);
  EXPECT_EQ(waits, 3);
  // Stamped on the given clock when the successful attempt was sent.
  EXPECT_EQ((*acquired)->sent, start + 3 * absl::Milliseconds(10));
  ASSERT_FALSE(leaders.empty());
  EXPECT_EQ(leaders.front(), "a:1 (epoch 1)");
}

TEST_F(LeaderLeaseTest, AwaitLeaseStopsWhenTold) {
  LeaderLease a(dsn_, "a:1", absl::Seconds(60));
  ASSERT_TRUE(a.TryAcquire()->has_value());
  LeaderLease b(dsn_, "b:2", absl::Seconds(60));
  AwaitOptions options;
  options.wait = [](absl::Duration) { return false; };
  auto acquired = AwaitLease(&b, options);
  ASSERT_TRUE(acquired.ok());
  EXPECT_FALSE(acquired->has_value());
}

TEST_F(LeaderLeaseTest, MissingTableIsFailedPrecondition) {
  // A database the store has not migrated yet.
  auto dsn = server_->CreateDatabase();
  ASSERT_TRUE(dsn.ok());
  LeaderLease a(*dsn, "a:1", absl::Seconds(60));
  auto epoch = a.TryAcquire();
  EXPECT_TRUE(absl::IsFailedPrecondition(epoch.status())) << epoch.status();
  EXPECT_THAT(epoch.status().message(), HasSubstr("tally_lease"));
}

}  // namespace
}  // namespace tally::ha
