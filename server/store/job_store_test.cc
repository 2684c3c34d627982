#include <sqlite3.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/store/memory_job_store.h"
#include "server/store/postgres_job_store.h"
#include "server/store/sqlite_job_store.h"
#include "tests/support/store/postgres_test_environment.h"
#include "tests/support/store/records.h"

namespace tally::store {
namespace {

using ::tally::store::testing::NewJob;
using ::tally::store::testing::Submitted;

using tally::v1::JobState;

const bool kPostgresEnvironment = testing::RegisterPostgresTestEnvironment();

// A fresh directory per process (mkdtemp): a directory named by the pid alone
// could hold databases left by an earlier process with the same pid.
std::string TempDbPath() {
  static int n = 0;
  static const std::string dir = [] {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "tally_store_test_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) std::abort();
    return pattern;
  }();
  return (std::filesystem::path(dir) / ("db" + std::to_string(n++) + ".sqlite")).string();
}



class JobStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "memory") {
      store_ = std::make_unique<InMemoryJobStore>();
    } else if (GetParam() == "postgres") {
      // No silent skip: a machine without PostgreSQL fails here, saying to
      // run scripts/setup.sh.
      auto dsn = testing::PostgresTestEnvironment::NewDatabase();
      ASSERT_TRUE(dsn.ok()) << dsn.status();
      auto s = PostgresJobStore::Open(*dsn);
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = std::move(*s);
    } else {
      path_ = TempDbPath();
      auto s = SqliteJobStore::Open(path_);
      ASSERT_TRUE(s.ok()) << s.status();
      store_ = std::move(*s);
    }
  }
  std::string path_;
  std::unique_ptr<JobStore> store_;
};

TEST_P(JobStoreTest, CreateAssignsIdsAndFirstEvent) {
  auto a = store_->CreateJob(NewJob(), Submitted());
  auto b = store_->CreateJob(NewJob(), Submitted());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->created);
  EXPECT_NE(a->job.id(), b->job.id());
  EXPECT_EQ(a->job.job().name(), "jobs/" + std::to_string(a->job.id()));
  auto got = store_->GetJob(a->job.id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->job().last_event_sequence(), 1);
  auto events = store_->ListEvents(a->job.id(), 0, 100);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 1u);
  EXPECT_EQ((*events)[0].sequence(), 1);
  EXPECT_EQ((*events)[0].job(), a->job.job().name());
}

TEST_P(JobStoreTest, RequestIdIsIdempotent) {
  auto a = store_->CreateJob(NewJob("req-1"), Submitted());
  auto again = store_->CreateJob(NewJob("req-1"), Submitted());
  ASSERT_TRUE(a.ok() && again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(a->job.id(), again->job.id());
  auto different = store_->CreateJob(NewJob("req-1", 7), Submitted());
  EXPECT_EQ(different.status().code(), absl::StatusCode::kAlreadyExists);
  auto all = store_->ListJobs({});
  EXPECT_EQ(all->size(), 1u);
}

TEST_P(JobStoreTest, CommitRoundTripsEverything) {
  auto a = store_->CreateJob(NewJob(), Submitted());
  ASSERT_TRUE(a.ok());
  Mutation m;
  m.job = a->job;
  m.job->mutable_job()->set_state(tally::v1::JOB_STATE_RUNNING);
  m.job->mutable_job()->set_last_event_sequence(2);
  tally::v1::JobEvent e;
  e.set_job(a->job.job().name());
  e.set_sequence(2);
  e.set_type("state");
  m.events.push_back(e);
  AttemptRecord attempt;
  attempt.set_job_id(a->job.id());
  attempt.set_attempt(1);
  attempt.add_worker_ids("w1");
  attempt.set_state(ATTEMPT_STATE_RUNNING);
  m.attempts.push_back(attempt);
  tally::v1::Checkpoint c;
  c.set_job(a->job.job().name());
  c.set_step(10);
  c.set_path("/ckpt/10");
  m.checkpoints.push_back(c);
  ASSERT_TRUE(store_->Commit(m).ok());

  EXPECT_EQ(store_->GetJob(a->job.id())->job().state(),
            tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(store_->ListEvents(a->job.id(), 1, 10)->size(), 1u);
  EXPECT_EQ(store_->ListEvents(a->job.id(), 0, 1)->size(), 1u);
  auto attempts = store_->ListAttempts(a->job.id());
  ASSERT_EQ(attempts->size(), 1u);
  EXPECT_EQ((*attempts)[0].worker_ids(0), "w1");
  attempt.set_state(ATTEMPT_STATE_LOST);
  Mutation m2;
  m2.attempts.push_back(attempt);
  ASSERT_TRUE(store_->Commit(m2).ok());
  EXPECT_EQ((*store_->ListAttempts(a->job.id()))[0].state(), ATTEMPT_STATE_LOST);
  auto ckpts = store_->ListCheckpoints(a->job.id());
  ASSERT_EQ(ckpts->size(), 1u);
  EXPECT_EQ((*ckpts)[0].path(), "/ckpt/10");
}

TEST_P(JobStoreTest, ListFiltersPagesAndCounts) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(store_->CreateJob(NewJob(), Submitted()).ok());
  auto jobs = store_->ListJobs({});
  ASSERT_EQ(jobs->size(), 5u);
  EXPECT_GT((*jobs)[0].id(), (*jobs)[4].id()) << "newest first";
  Mutation m;
  m.job = (*jobs)[0];
  m.job->mutable_job()->set_state(tally::v1::JOB_STATE_CANCELLED);
  ASSERT_TRUE(store_->Commit(m).ok());
  JobQuery q;
  q.states = {tally::v1::JOB_STATE_QUEUED};
  q.limit = 2;
  auto page1 = store_->ListJobs(q);
  ASSERT_EQ(page1->size(), 2u);
  q.before_id = (*page1)[1].id();
  auto page2 = store_->ListJobs(q);
  ASSERT_EQ(page2->size(), 2u);
  EXPECT_LT((*page2)[0].id(), (*page1)[1].id());
  EXPECT_EQ(store_->ListActiveJobs()->size(), 4u);
  auto counts = store_->CountJobsByState();
  ASSERT_TRUE(counts.ok());
  std::map<JobState, int64_t> by_state(counts->begin(), counts->end());
  EXPECT_EQ(by_state[tally::v1::JOB_STATE_QUEUED], 4);
  EXPECT_EQ(by_state[tally::v1::JOB_STATE_CANCELLED], 1);
}

ExperimentRecord NewExperiment(const std::string& request_id = "", const std::string& name = "x") {
  ExperimentRecord r;
  r.mutable_experiment()->set_state(tally::v1::EXPERIMENT_STATE_RUNNING);
  r.mutable_experiment()->set_request_id(request_id);
  r.mutable_experiment()->mutable_spec()->set_display_name(name);
  r.add_resolved()->set_display_name(name + "/a");
  return r;
}

tally::v1::ExperimentEvent Created() {
  tally::v1::ExperimentEvent e;
  e.set_type("created");
  return e;
}

TEST_P(JobStoreTest, ExperimentsRoundTripWithEventsAndIdempotentCreate) {
  auto a = store_->CreateExperiment(NewExperiment("req"), Created());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->created);
  EXPECT_EQ(a->experiment.experiment().name(), "experiments/1");
  EXPECT_EQ(a->experiment.experiment().last_event_sequence(), 1);
  auto again = store_->CreateExperiment(NewExperiment("req"), Created());
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->experiment.id(), a->experiment.id());
  EXPECT_EQ(store_->CreateExperiment(NewExperiment("req", "other"), Created()).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto b = store_->CreateExperiment(NewExperiment(), Created());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->experiment.id(), 2);

  ExperimentMutation m{a->experiment, {}};
  m.experiment.mutable_experiment()->set_state(tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  m.experiment.mutable_experiment()->set_last_event_sequence(2);
  tally::v1::ExperimentEvent ended;
  ended.set_experiment("experiments/1");
  ended.set_sequence(2);
  ended.set_type("succeeded");
  m.events.push_back(ended);
  ASSERT_TRUE(store_->CommitExperiment(m).ok());
  EXPECT_EQ(store_->GetExperiment(1)->experiment().state(),
            tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_EQ(store_->GetExperiment(1)->resolved(0).display_name(), "x/a");
  auto events = store_->ListExperimentEvents(1, 0, 10);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[1].type(), "succeeded");
  EXPECT_EQ(store_->ListExperimentEvents(1, 1, 10)->size(), 1u);
  // A gap in the sequence is refused, all or nothing.
  ended.set_sequence(5);
  EXPECT_FALSE(store_->CommitExperiment({m.experiment, {ended}}).ok());
  EXPECT_EQ(store_->ListExperimentEvents(1, 0, 10)->size(), 2u);

  auto active = store_->ListActiveExperiments();
  ASSERT_EQ(active->size(), 1u);
  EXPECT_EQ((*active)[0].id(), 2);
  auto list = store_->ListExperiments(0, 10, std::nullopt);
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].id(), 2);  // newest first
  EXPECT_EQ(store_->ListExperiments(2, 10, std::nullopt)->size(), 1u);
  EXPECT_EQ(store_->GetExperiment(9).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListExperimentEvents(9, 0, 10).status().code(), absl::StatusCode::kNotFound);
}

TEST_P(JobStoreTest, MissingJobIsNotFound) {
  EXPECT_EQ(store_->GetJob(99).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->ListEvents(99, 0, 10).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_P(JobStoreTest, WorkersRoundTrip) {
  WorkerRecord w;
  w.set_worker_id("w1");
  w.set_gpu_type("cpu");
  w.set_slots(2);
  ASSERT_TRUE(store_->PutWorker(w).ok());
  w.set_slots(3);
  ASSERT_TRUE(store_->PutWorker(w).ok());
  auto workers = store_->ListWorkers();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ((*workers)[0].slots(), 3);
}

// A job's quantized losses (proto3 optional) come back as stored: present
// (0 included) or absent, on the job, its curve, its events and its
// checkpoints; SQLite's after a reopen too (a tallyd restart).
TEST_P(JobStoreTest, QuantizedLossesRoundTripPresentOrAbsent) {
  auto a = store_->CreateJob(NewJob(), Submitted());
  ASSERT_TRUE(a.ok());
  Mutation m;
  m.job = a->job;
  tally::v1::Job& j = *m.job->mutable_job();
  j.set_last_event_sequence(2);
  j.set_val_loss(2.31);
  j.set_quantized_val_loss(2.38);
  j.add_curve()->set_val_loss(5.0);  // step 0: not evaluated quantized
  auto* p = j.add_curve();
  p->set_step(10);
  p->set_val_loss(2.31);
  p->set_quantized_val_loss(0.0);  // present, even at 0
  j.mutable_early_stopping()->set_metric("quantized_val_loss");
  tally::v1::JobEvent e;
  e.set_job(j.name());
  e.set_sequence(2);
  e.set_type("eval");
  e.set_val_loss(2.31);
  e.set_quantized_val_loss(2.38);
  m.events.push_back(e);
  tally::v1::Checkpoint c;
  c.set_job(j.name());
  c.set_step(10);
  c.set_path("/ckpt/10");
  c.set_val_loss(2.31);
  c.set_quantized_val_loss(2.38);
  m.checkpoints.push_back(c);
  ASSERT_TRUE(store_->Commit(m).ok());

  auto check = [&](JobStore& store) {
    const tally::v1::Job got = store.GetJob(a->job.id())->job();
    EXPECT_DOUBLE_EQ(got.quantized_val_loss(), 2.38);
    ASSERT_EQ(got.curve_size(), 2);
    EXPECT_FALSE(got.curve(0).has_quantized_val_loss());
    EXPECT_TRUE(got.curve(1).has_quantized_val_loss());
    EXPECT_EQ(got.early_stopping().metric(), "quantized_val_loss");
    auto events = store.ListEvents(a->job.id(), 1, 10);
    ASSERT_EQ(events->size(), 1u);
    EXPECT_DOUBLE_EQ((*events)[0].quantized_val_loss(), 2.38);
    auto ckpts = store.ListCheckpoints(a->job.id());
    ASSERT_EQ(ckpts->size(), 1u);
    EXPECT_DOUBLE_EQ((*ckpts)[0].quantized_val_loss(), 2.38);
  };
  check(*store_);
  if (!path_.empty()) {
    store_.reset();
    auto reopened = SqliteJobStore::Open(path_);
    ASSERT_TRUE(reopened.ok()) << reopened.status();
    check(**reopened);
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, JobStoreTest,
                         ::testing::Values("memory", "sqlite", "postgres"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

TEST(SqliteJobStoreTest, SurvivesReopen) {
  const std::string path = TempDbPath();
  int64_t id;
  {
    auto store = SqliteJobStore::Open(path);
    ASSERT_TRUE(store.ok());
    auto a = (*store)->CreateJob(NewJob("r"), Submitted());
    ASSERT_TRUE(a.ok());
    id = a->job.id();
  }
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->GetJob(id)->job().request_id(), "r");
  EXPECT_EQ(*(*store)->SchemaVersion(), SqliteJobStore::kSchemaVersion);
  // Ids keep growing after a reopen, never reused.
  auto b = (*store)->CreateJob(NewJob(), Submitted());
  EXPECT_GT(b->job.id(), id);
}

TEST(SqliteJobStoreTest, MigratesAnOlderSchemaKeepingData) {
  const std::string path = TempDbPath();
  {
    auto v1 = SqliteJobStore::OpenAtVersion(path, 1);
    ASSERT_TRUE(v1.ok()) << v1.status();
    EXPECT_EQ(*(*v1)->SchemaVersion(), 1);
  }
  // A job as a version-1 tallyd wrote it (no tenant column yet).
  JobRecord old = NewJob("req-1");
  old.set_id(1);
  old.mutable_job()->set_name("jobs/1");
  old.mutable_job()->set_last_event_sequence(0);
  {
    sqlite3* db;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_stmt* stmt;
    ASSERT_EQ(sqlite3_prepare_v2(db,
                                 "INSERT INTO jobs (id, request_id, state, create_time_us, "
                                 "record) VALUES (1, 'req-1', 1, 0, ?)",
                                 -1, &stmt, nullptr),
              SQLITE_OK);
    const std::string blob = old.SerializeAsString();
    sqlite3_bind_blob(stmt, 1, blob.data(), blob.size(), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(stmt), SQLITE_DONE);
    sqlite3_finalize(stmt);
    sqlite3_close(db);
  }
  auto store = SqliteJobStore::Open(path);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->SchemaVersion(), SqliteJobStore::kSchemaVersion);
  EXPECT_TRUE((*store)->GetJob(1).ok());
  // Checkpoints arrive in version 2, experiments in 3.
  EXPECT_TRUE((*store)->ListCheckpoints(1).ok());
  EXPECT_TRUE((*store)->ListActiveExperiments().ok());
  // Tenants arrive in 4: the old job is the empty tenant's, its request id
  // still finds it.
  JobQuery q;
  q.tenant = "";
  EXPECT_EQ((*store)->ListJobs(q)->size(), 1u);
  q.tenant = "research";
  EXPECT_TRUE((*store)->ListJobs(q)->empty());
  auto again = (*store)->CreateJob(NewJob("req-1"), Submitted());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.id(), 1);
}

TEST_P(JobStoreTest, RequestIdsAndListsArePerTenant) {
  JobRecord a = NewJob("same");
  a.mutable_job()->set_tenant("research");
  JobRecord b = NewJob("same");
  b.mutable_job()->set_tenant("dev");
  auto ca = store_->CreateJob(a, Submitted());
  auto cb = store_->CreateJob(b, Submitted());
  ASSERT_TRUE(ca.ok() && cb.ok());
  EXPECT_TRUE(ca->created);
  EXPECT_TRUE(cb->created);
  EXPECT_NE(ca->job.id(), cb->job.id());
  // The same tenant's repeat finds its own job.
  auto again = store_->CreateJob(a, Submitted());
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created);
  EXPECT_EQ(again->job.id(), ca->job.id());
  JobQuery q;
  q.tenant = "dev";
  auto listed = store_->ListJobs(q);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].id(), cb->job.id());
  EXPECT_EQ(store_->ListJobs(JobQuery())->size(), 2u);
}

TEST(SqliteJobStoreTest, RefusesANewerSchema) {
  const std::string path = TempDbPath();
  {
    sqlite3* db;
    ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
    sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr);
    sqlite3_close(db);
  }
  auto store = SqliteJobStore::Open(path);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), ::testing::HasSubstr("newer"));
}

// Every connection the process opens, recorded by an SQLite auto-extension,
// so a test can read a connection-level setting of the store's own handle.
sqlite3* last_opened_db = nullptr;
int RecordOpenedDb(sqlite3* db, const char**, const sqlite3_api_routines*) {
  last_opened_db = db;
  return SQLITE_OK;
}

TEST(SqliteJobStoreTest, KeepsTemporaryTablesInMemory) {
  // In Kubernetes tallyd runs with a read-only root filesystem: SQLite's
  // sorts and temporary indices must not need a writable temp directory.
  last_opened_db = nullptr;
  ASSERT_EQ(sqlite3_auto_extension(
                reinterpret_cast<void (*)(void)>(&RecordOpenedDb)),
            SQLITE_OK);
  auto store = SqliteJobStore::Open(TempDbPath());
  sqlite3_reset_auto_extension();
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_NE(last_opened_db, nullptr);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(last_opened_db, "PRAGMA temp_store", -1, &stmt,
                               nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  constexpr int kTempStoreMemory = 2;  // 0 default, 1 file, 2 memory
  EXPECT_EQ(sqlite3_column_int(stmt, 0), kTempStoreMemory);
  sqlite3_finalize(stmt);
}

TEST(SqliteJobStoreTest, UnwritablePathIsAClearError) {
  auto store = SqliteJobStore::Open("/nonexistent-dir/x/tally.db");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()),
              ::testing::HasSubstr("/nonexistent-dir/x/tally.db"));
}

}  // namespace
}  // namespace tally::store
