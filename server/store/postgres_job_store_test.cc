// PostgreSQL-only behaviour of PostgresJobStore: schema versions, fencing,
// connection loss, and group commit. What every store shares is in
// job_store_test.cc.
#include "server/store/postgres_job_store.h"

#include <libpq-fe.h>

#include <atomic>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/store/postgres_server.h"
#include "tests/support/store/postgres_test_environment.h"
#include "tests/support/store/records.h"

namespace tally::store {
namespace {

using ::tally::store::testing::NewJob;
using ::tally::store::testing::Submitted;

using ::testing::HasSubstr;
using testing::PostgresServer;
using testing::PostgresTestEnvironment;

const bool kPostgresEnvironment = testing::RegisterPostgresTestEnvironment();



// A second, plain libpq connection: the other tallyd, or an operator.
class Sql {
 public:
  explicit Sql(const std::string& dsn) : c_(PQconnectdb(dsn.c_str())) {}
  ~Sql() { PQfinish(c_); }
  bool ok() const { return PQstatus(c_) == CONNECTION_OK; }
  std::string error() const { return PQerrorMessage(c_); }
  // Runs `sql` (our own constants only); the first cell of the last result,
  // or "" if none. Fails the test on an error.
  std::string Run(const std::string& sql) {
    PGresult* r = PQexec(c_, sql.c_str());
    const ExecStatusType st = PQresultStatus(r);
    EXPECT_TRUE(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
        << sql << ": " << PQerrorMessage(c_);
    std::string out =
        (st == PGRES_TUPLES_OK && PQntuples(r) > 0 && PQnfields(r) > 0) ? PQgetvalue(r, 0, 0) : "";
    PQclear(r);
    return out;
  }

 private:
  PGconn* c_;
};

class PostgresJobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dsn = PostgresTestEnvironment::NewDatabase();
    ASSERT_TRUE(dsn.ok()) << dsn.status();
    dsn_ = *dsn;
    auto store = PostgresJobStore::Open(dsn_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  std::string dsn_;
  std::unique_ptr<PostgresJobStore> store_;
};

TEST_F(PostgresJobStoreTest, RefusesANewerSchemaNamingBothVersions) {
  EXPECT_EQ(*store_->SchemaVersion(), PostgresJobStore::kSchemaVersion);
  store_.reset();
  Sql sql(dsn_);
  ASSERT_TRUE(sql.ok()) << sql.error();
  sql.Run("UPDATE tally_schema SET version = 99");
  auto store = PostgresJobStore::Open(dsn_);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition) << store.status();
  const std::string msg(store.status().message());
  EXPECT_THAT(msg, HasSubstr("version 99"));
  EXPECT_THAT(msg, HasSubstr(absl::StrCat("(", PostgresJobStore::kSchemaVersion, ")")));
  EXPECT_THAT(msg, HasSubstr("run a newer tallyd"));
}

TEST_F(PostgresJobStoreTest, ReopenKeepsDataAndLeaseRow) {
  auto a = store_->CreateJob(NewJob("r"), Submitted());
  ASSERT_TRUE(a.ok()) << a.status();
  store_.reset();
  auto store = PostgresJobStore::Open(dsn_);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->GetJob(a->job.id())->job().request_id(), "r");
  Sql sql(dsn_);
  EXPECT_EQ(sql.Run("SELECT count(*) FROM tally_lease"), "1");
  EXPECT_EQ(sql.Run("SELECT holder || ':' || epoch FROM tally_lease WHERE id = 1"), ":0");
}

TEST(PostgresJobStoreOpenTest, TallydsStartingTogetherMigrateOnce) {
  auto dsn = PostgresTestEnvironment::NewDatabase();
  ASSERT_TRUE(dsn.ok()) << dsn.status();
  constexpr int kNumStores = 4;
  std::vector<absl::Status> results(kNumStores);
  std::vector<std::thread> threads;
  for (int i = 0; i < kNumStores; ++i) {
    threads.emplace_back([&, i] { results[i] = PostgresJobStore::Open(*dsn).status(); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(s.ok()) << s;
  Sql sql(*dsn);
  EXPECT_EQ(sql.Run("SELECT version FROM tally_schema"),
            std::to_string(PostgresJobStore::kSchemaVersion));
  EXPECT_EQ(sql.Run("SELECT count(*) FROM tally_lease"), "1");
}

TEST_F(PostgresJobStoreTest, WritesAreFencedByTheLeaseEpoch) {
  Sql other(dsn_);
  other.Run("UPDATE tally_lease SET holder = 'a:1', epoch = 1 WHERE id = 1");
  store_->SetFencingEpoch(1);
  auto first = store_->CreateJob(NewJob("first"), Submitted());
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(store_->MustRestart());

  // Another tallyd takes the lease.
  other.Run("UPDATE tally_lease SET holder = 'b:1', epoch = 2 WHERE id = 1");
  auto second = store_->CreateJob(NewJob("second"), Submitted());
  ASSERT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("no longer the leader (lease epoch 1, now 2)"));
  EXPECT_TRUE(store_->MustRestart());
  EXPECT_EQ(other.Run("SELECT count(*) FROM jobs"), "1");
  EXPECT_EQ(other.Run("SELECT count(*) FROM events"), "1");

  // Nothing more is written, whatever the write.
  Mutation m;
  m.job = first->job;
  m.job->mutable_job()->set_state(tally::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(store_->Commit(m).code(), absl::StatusCode::kUnavailable);
  WorkerRecord w;
  w.set_worker_id("w1");
  EXPECT_EQ(store_->PutWorker(w).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(other.Run("SELECT count(*) FROM workers"), "0");
  EXPECT_EQ(store_->GetJob(first->job.id())->job().state(), tally::v1::JOB_STATE_QUEUED);
}

TEST_F(PostgresJobStoreTest, UnfencedStoreIgnoresTheLease) {
  Sql other(dsn_);
  other.Run("UPDATE tally_lease SET epoch = 7 WHERE id = 1");
  EXPECT_TRUE(store_->CreateJob(NewJob(), Submitted()).ok());
  EXPECT_FALSE(store_->MustRestart());
}

TEST(PostgresJobStoreConnectionTest, ServerLossIsUnavailableAndTheStoreReconnects) {
  // Its own server: this test stops it.
  auto server = PostgresServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  auto dsn = (*server)->CreateDatabase();
  ASSERT_TRUE(dsn.ok()) << dsn.status();
  auto opened = PostgresJobStore::Open(*dsn);
  ASSERT_TRUE(opened.ok()) << opened.status();
  PostgresJobStore& store = **opened;
  auto a = store.CreateJob(NewJob(), Submitted());
  ASSERT_TRUE(a.ok()) << a.status();

  ASSERT_TRUE((*server)->Stop().ok());
  for (int i = 0; i < 3; ++i) {
    const absl::Time start = absl::Now();
    auto b = store.CreateJob(NewJob(), Submitted());
    EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
    EXPECT_THAT(std::string(b.status().message()),
                HasSubstr(absl::StrCat("127.0.0.1:", (*server)->port())));
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("retries"));
    auto got = store.GetJob(a->job.id());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable) << got.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(3)) << "a call blocked on the lost server";
  }
  // Nothing was in flight at a COMMIT: no restart needed.
  EXPECT_FALSE(store.MustRestart());

  ASSERT_TRUE((*server)->Start_().ok());
  // The backoff (at most 5 s) may hold the first attempts back.
  absl::StatusOr<JobRecord> got = absl::UnavailableError("not tried");
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (!got.ok() && absl::Now() < deadline) {
    got = store.GetJob(a->job.id());
    if (!got.ok()) absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(got.ok()) << got.status();
  auto c = store.CreateJob(NewJob(), Submitted());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_GT(c->job.id(), a->job.id());
  EXPECT_EQ(store.ListJobs({})->size(), 2u);
}

TEST_F(PostgresJobStoreTest, CommitWhoseOutcomeIsUnknownForcesARestart) {
  Sql other(dsn_);
  // A deferred trigger runs inside COMMIT: it announces itself, then waits,
  // so the backend can be killed while the store waits for COMMIT's answer.
  other.Run(
      "CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
      "PERFORM pg_sleep(30); RETURN NULL; END $$;"
      "CREATE CONSTRAINT TRIGGER slow AFTER INSERT ON workers DEFERRABLE INITIALLY DEFERRED "
      "FOR EACH ROW EXECUTE FUNCTION slow_commit();");
  WorkerRecord w;
  w.set_worker_id("w1");
  absl::Status put;
  std::thread writer([&] { put = store_->PutWorker(w); });
  // Wait for the COMMIT to be in its trigger, then kill that backend.
  std::string killed = "";
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (killed != "t" && absl::Now() < deadline) {
    killed = other.Run(
        "SELECT COALESCE(bool_or(pg_terminate_backend(pid)), false) FROM pg_stat_activity "
        "WHERE query LIKE 'COMMIT%' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()");
    if (killed != "t") absl::SleepFor(absl::Milliseconds(20));
  }
  writer.join();
  ASSERT_EQ(killed, "t") << "the COMMIT never reached its trigger";
  EXPECT_EQ(put.code(), absl::StatusCode::kUnavailable) << put;
  EXPECT_THAT(std::string(put.message()), HasSubstr("outcome is unknown"));
  EXPECT_TRUE(store_->MustRestart());
  other.Run("DROP TRIGGER slow ON workers");
  EXPECT_EQ(store_->CreateJob(NewJob(), Submitted()).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(PostgresJobStoreTest, ConcurrentCreatesAllCommitWithDistinctIds) {
  constexpr int kNumThreads = 32;
  constexpr int kJobsPerThread = 8;
  constexpr int kNumShared = 4;  // request ids every thread submits
  absl::Mutex mu;
  std::vector<absl::Status> errors;
  std::set<int64_t> unique_ids;
  std::map<std::string, std::set<int64_t>> shared_ids;
  std::map<std::string, int> shared_created;
  std::vector<std::thread> threads;
  for (int t = 0; t < kNumThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kJobsPerThread + kNumShared; ++i) {
        const bool shared = i >= kJobsPerThread;
        const std::string rid =
            shared ? absl::StrCat("shared-", i - kJobsPerThread) : absl::StrCat("t", t, "-", i);
        auto r = store_->CreateJob(NewJob(rid), Submitted());
        absl::MutexLock lock(&mu);
        if (!r.ok()) {
          errors.push_back(r.status());
        } else if (shared) {
          shared_ids[rid].insert(r->job.id());
          shared_created[rid] += r->created;
        } else {
          EXPECT_TRUE(r->created);
          unique_ids.insert(r->job.id());
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : errors) ADD_FAILURE() << s;
  EXPECT_EQ(unique_ids.size(), static_cast<size_t>(kNumThreads * kJobsPerThread));
  ASSERT_EQ(shared_ids.size(), static_cast<size_t>(kNumShared));
  for (const auto& [rid, ids] : shared_ids) {
    EXPECT_EQ(ids.size(), 1u) << rid << " made more than one job";
    EXPECT_EQ(shared_created[rid], 1) << rid;
    EXPECT_EQ(unique_ids.count(*ids.begin()), 0u);
  }
  // All of it committed: a fresh connection sees every job and first event.
  Sql sql(dsn_);
  const std::string total = std::to_string(kNumThreads * kJobsPerThread + kNumShared);
  EXPECT_EQ(sql.Run("SELECT count(*) FROM jobs"), total);
  EXPECT_EQ(sql.Run("SELECT count(*) FROM events WHERE seq = 1"), total);
  const PostgresJobStore::WriteStats stats = store_->GetWriteStats();
  EXPECT_EQ(stats.num_writes, kNumThreads * (kJobsPerThread + kNumShared));
  EXPECT_EQ(stats.num_queued, 0);
}

// Blocks the store's next write inside the database (a lock on `jobs`) until
// Release(), so the writes that arrive meanwhile queue up into one batch.
class JobsTableLock {
 public:
  explicit JobsTableLock(const std::string& dsn) : sql_(dsn) {
    sql_.Run("BEGIN; LOCK TABLE jobs IN EXCLUSIVE MODE;");
  }
  void Release() { sql_.Run("COMMIT"); }

 private:
  Sql sql_;
};

TEST_F(PostgresJobStoreTest, OneFailingWriteInABatchCommitsTheOthers) {
  auto original = store_->CreateJob(NewJob("taken", 2), Submitted());
  ASSERT_TRUE(original.ok()) << original.status();
  const PostgresJobStore::WriteStats before = store_->GetWriteStats();

  JobsTableLock lock(dsn_);
  // The first writer takes the connection and waits on the table lock.
  absl::StatusOr<CreateResult> blocked;
  std::thread first([&] { blocked = store_->CreateJob(NewJob("blocked"), Submitted()); });
  Sql watcher(dsn_);
  for (int i = 0; i < 400 && watcher.Run("SELECT count(*) FROM pg_stat_activity WHERE "
                                         "application_name = 'tallyd' AND "
                                         "wait_event_type = 'Lock'") != "1";
       ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  // Meanwhile: three new jobs, two callers with one new request id, and a
  // reused request id with a different spec.
  struct Call {
    std::string request_id;
    int layers;
    absl::StatusOr<CreateResult> result = absl::UnknownError("not run");
  };
  std::vector<Call> calls = {{"a", 2}, {"b", 2}, {"c", 2}, {"twin", 2}, {"twin", 2}, {"taken", 9}};
  std::vector<std::thread> threads;
  for (Call& c : calls) {
    threads.emplace_back(
        [&] { c.result = store_->CreateJob(NewJob(c.request_id, c.layers), Submitted()); });
  }
  // And a commit that fails inside the database (event 1 exists already).
  Mutation duplicate_event;
  duplicate_event.events.push_back(Submitted());
  duplicate_event.events.back().set_job(original->job.job().name());
  duplicate_event.events.back().set_sequence(1);
  absl::Status commit;
  threads.emplace_back([&] { commit = store_->Commit(duplicate_event); });
  const int64_t num_waiting = static_cast<int64_t>(threads.size());
  for (int i = 0; i < 400 && store_->GetWriteStats().num_queued < num_waiting; ++i) {
    absl::SleepFor(absl::Milliseconds(25));
  }
  ASSERT_EQ(store_->GetWriteStats().num_queued, num_waiting);
  lock.Release();
  first.join();
  for (auto& t : threads) t.join();
  EXPECT_FALSE(commit.ok());

  ASSERT_TRUE(blocked.ok()) << blocked.status();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(calls[i].result.ok()) << calls[i].result.status();
  EXPECT_EQ(calls[5].result.status().code(), absl::StatusCode::kAlreadyExists)
      << calls[5].result.status();
  EXPECT_THAT(std::string(calls[5].result.status().message()),
              HasSubstr(original->job.job().name()));
  EXPECT_EQ(calls[3].result->job.id(), calls[4].result->job.id());
  EXPECT_NE(calls[3].result->created, calls[4].result->created);
  // The blocked write's transaction, then one for the whole batch.
  const PostgresJobStore::WriteStats after = store_->GetWriteStats();
  EXPECT_EQ(after.num_transactions - before.num_transactions, 2);
  EXPECT_EQ(after.num_writes - before.num_writes, 8);
  Sql sql(dsn_);
  EXPECT_EQ(sql.Run("SELECT count(*) FROM jobs"), "6");  // taken, blocked, a, b, c, twin
  EXPECT_EQ(sql.Run("SELECT count(*) FROM events"), "6");
}

TEST_F(PostgresJobStoreTest, WithoutGroupCommitEachWriteIsItsOwnTransaction) {
  store_->SetGroupCommit(false);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] { EXPECT_TRUE(store_->CreateJob(NewJob(), Submitted()).ok()); });
  }
  for (auto& t : threads) t.join();
  const PostgresJobStore::WriteStats stats = store_->GetWriteStats();
  EXPECT_EQ(stats.num_transactions, 8);
  EXPECT_EQ(stats.num_writes, 8);
}

TEST_F(PostgresJobStoreTest, HostileStringsAreDataNotSql) {
  JobRecord job = NewJob("'); DROP TABLE jobs; --");
  job.mutable_job()->set_tenant("t' OR '1'='1");
  auto a = store_->CreateJob(job, Submitted());
  ASSERT_TRUE(a.ok()) << a.status();
  JobQuery q;
  q.tenant = "t' OR '1'='1";
  EXPECT_EQ(store_->ListJobs(q)->size(), 1u);
  q.tenant = "x' OR '1'='1";
  EXPECT_TRUE(store_->ListJobs(q)->empty());
  // PostgreSQL text holds no NUL byte: a clear error, not a crash.
  JobRecord nul = NewJob(std::string("a\0b", 3));
  auto b = store_->CreateJob(nul, Submitted());
  EXPECT_FALSE(b.ok());
  EXPECT_TRUE(store_->CreateJob(NewJob(), Submitted()).ok()) << "the store still works";
}

}  // namespace
}  // namespace tally::store
