// Design: one libpq connection, used under mu_ for a whole transaction.
// Writes (creates, commits, PutWorker) go through a queue: a caller enqueues
// its request and waits until either a leader has answered it or no batch is
// running; in the second case it becomes the leader and runs every queued
// request in one transaction, each under a SAVEPOINT, and one COMMIT (one
// WAL flush) acknowledges them all. So a batch forms exactly while the
// previous one is committing.
//
// Every query is parameterised (PQexecParams); results come back in binary:
// BYTEA is the serialized proto, integers are big-endian.
#include "server/store/postgres_job_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"
#include "server/store/postgres_schema.h"
#include "server/store/postgres_wire.h"

namespace tally::store {
namespace {

using google::protobuf::util::MessageDifferencer;
using pg::Bytes;
using pg::Float;
using pg::Int;
using pg::IntArray;
using pg::kInt8ArrayOid;
using pg::kInt8Oid;
using pg::NullableText;
using pg::Param;
using pg::ParseCell;
using pg::ParseColumn;
using pg::Result;
using pg::Text;
using pg::kTextOid;

constexpr absl::Duration kFirstBackoff = absl::Milliseconds(100);
constexpr absl::Duration kMaxBackoff = absl::Seconds(5);


int64_t CreateMicros(const JobRecord& job) {
  return google::protobuf::util::TimeUtil::TimestampToMicroseconds(job.job().create_time());
}

void IgnoreNotice(void*, const char*) {}

}  // namespace

// One queued write and, once `done`, its outcome.
struct PostgresJobStore::Write {
  enum class Kind { kCreateJob, kCreateExperiment, kCommit, kCommitExperiment, kPutWorker, kRun };
  explicit Write(Kind k) : kind(k) {}
  const Kind kind;
  JobRecord job;
  tally::v1::JobEvent job_event;
  ExperimentRecord experiment;
  tally::v1::ExperimentEvent experiment_event;
  const Mutation* mutation = nullptr;
  const ExperimentMutation* experiment_mutation = nullptr;
  const WorkerRecord* worker = nullptr;
  std::function<absl::Status()> run;  // kRun: with mu_ held, in the batch's transaction

  absl::Status status;
  std::optional<CreateResult> create_result;
  std::optional<ExperimentCreateResult> experiment_create_result;
  bool done = false;  // guarded by queue_mu_
};

PostgresJobStore::PostgresJobStore(std::string dsn, const Clock* clock)
    : dsn_(std::move(dsn)), server_name_(pg::ServerName(dsn_)), clock_(clock),
      backoff_(kFirstBackoff) {}

PostgresJobStore::~PostgresJobStore() {
  absl::MutexLock lock(&mu_);
  conn_.reset();
}

absl::StatusOr<std::unique_ptr<PostgresJobStore>> PostgresJobStore::Open(const std::string& dsn,
                                                                         const Clock* clock) {
  static const RealClock real;
  std::unique_ptr<PostgresJobStore> store(
      new PostgresJobStore(dsn, clock != nullptr ? clock : &real));
  absl::MutexLock lock(&store->mu_);
  RETURN_IF_ERROR(store->EnsureConnectedLocked());
  absl::Status s = store->MigrateLocked();
  if (!s.ok()) {
    store->NoteConnectionErrorLocked();
    return s;
  }
  return store;
}

absl::Status PostgresJobStore::EnsureConnectedLocked() {
  if (conn_ != nullptr) {
    conn_->Poll();
    if (!conn_->Broken()) return absl::OkStatus();
    // A connection that worked was lost: reconnect at once.
    conn_.reset();
    next_connect_ = absl::InfinitePast();
  }
  const absl::Time now = clock_->Now();
  if (now < next_connect_) {
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", server_name_, " (", last_connect_error_,
                     "); tallyd retries, next attempt in ",
                     absl::FormatDuration(absl::Ceil(next_connect_ - now, absl::Milliseconds(1)))));
  }
  // Later keywords override the DSN's: bound how long a call can block on
  // connecting, and notice a dead peer instead of hanging on it.
  const char* keys[] = {"dbname",           "connect_timeout",     "keepalives",
                        "keepalives_idle",  "keepalives_interval", "keepalives_count",
                        "tcp_user_timeout", "application_name",    nullptr};
  const char* values[] = {dsn_.c_str(), "2", "1", "5", "2", "3", "10000", "tallyd", nullptr};
  PGconn* c = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (c == nullptr || PQstatus(c) != CONNECTION_OK) {
    std::string err = c ? PQerrorMessage(c) : "out of memory";
    PQfinish(c);
    std::replace(err.begin(), err.end(), '\n', ' ');
    while (!err.empty() && err.back() == ' ') err.pop_back();
    last_connect_error_ = err;
    next_connect_ = clock_->Now() + backoff_;
    backoff_ = std::min(backoff_ * 2, kMaxBackoff);
    return absl::UnavailableError(
        absl::StrCat("cannot reach ", server_name_, " (", err, "); tallyd retries with backoff"));
  }
  PQsetNoticeProcessor(c, IgnoreNotice, nullptr);
  auto conn = std::make_unique<pg::Connection>(c, server_name_);
  // Acknowledged means durable: refuse to run with commits that are not.
  ASSIGN_OR_RETURN(Result sc, conn->Exec("SELECT current_setting('synchronous_commit')"));
  if (sc.rows() == 1 && sc.Bytes(0, 0) == "off") {
    RETURN_IF_ERROR(conn->Exec("SET synchronous_commit = on").status());
  }
  if (opened_) {
    // Another tallyd may have migrated past us while we were disconnected.
    ASSIGN_OR_RETURN(Result v, conn->Exec("SELECT version FROM tally_schema WHERE id = 1"));
    if (v.rows() == 1 && v.Int(0, 0) > kSchemaVersion) {
      must_restart_ = true;
      return NewerSchemaError(v.Int(0, 0));
    }
  }
  conn_ = std::move(conn);
  backoff_ = kFirstBackoff;
  next_connect_ = absl::InfinitePast();
  return absl::OkStatus();
}

absl::Status PostgresJobStore::NewerSchemaError(int64_t version) const {
  return absl::FailedPreconditionError(absl::StrCat(
      "the schema of ", server_name_, " is version ", version, ", newer than this tallyd's (",
      kSchemaVersion, "); run a newer tallyd, or point --postgres_dsn at another database"));
}

void PostgresJobStore::NoteConnectionErrorLocked() {
  if (conn_ != nullptr && conn_->Broken()) conn_.reset();
}

void PostgresJobStore::RollbackLocked() {
  if (conn_ != nullptr && !conn_->Broken()) conn_->Exec("ROLLBACK").status().IgnoreError();
  NoteConnectionErrorLocked();
}

absl::Status PostgresJobStore::MigrateLocked() {
  RETURN_IF_ERROR(conn_->Exec("BEGIN").status());
  absl::Status s = [&]() -> absl::Status {
    // Two tallyds starting together: the second waits here, then finds the
    // schema current.
    RETURN_IF_ERROR(
        conn_->Exec("SELECT pg_advisory_xact_lock($1)", {Int(pg::kMigrationLockKey)}).status());
    RETURN_IF_ERROR(conn_->ExecScript(
        "CREATE TABLE IF NOT EXISTS tally_schema ("
        "  id INT PRIMARY KEY CHECK (id = 1), version INT NOT NULL);"
        "INSERT INTO tally_schema (id, version) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;"));
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT version FROM tally_schema WHERE id = 1"));
    const int64_t current = r.rows() == 1 ? r.Int(0, 0) : 0;
    if (current > kSchemaVersion) return NewerSchemaError(current);
    for (int64_t v = current; v < kSchemaVersion; ++v) {
      RETURN_IF_ERROR(conn_->ExecScript(pg::MigrationScript(v)));
      RETURN_IF_ERROR(
          conn_->Exec("UPDATE tally_schema SET version = $1 WHERE id = 1", {Int(v + 1)}).status());
    }
    ASSIGN_OR_RETURN(Result c, conn_->Exec("COMMIT"));
    if (c.CmdStatus() != "COMMIT") {
      return absl::InternalError(absl::StrCat("migrating ", server_name_, ": rolled back"));
    }
    return absl::OkStatus();
  }();
  if (!s.ok()) {
    RollbackLocked();
    return s;
  }
  opened_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int> PostgresJobStore::SchemaVersion() {
  return ReadTx([&]() -> absl::StatusOr<int> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT version FROM tally_schema WHERE id = 1"));
    return r.rows() == 1 ? static_cast<int>(r.Int(0, 0)) : 0;
  });
}

void PostgresJobStore::SetFencingEpoch(int64_t epoch) { fencing_epoch_ = epoch; }
bool PostgresJobStore::MustRestart() const { return must_restart_; }
void PostgresJobStore::SetGroupCommit(bool enabled) { group_commit_ = enabled; }

PostgresJobStore::WriteStats PostgresJobStore::GetWriteStats() {
  absl::MutexLock q(&queue_mu_);
  return {num_writes_, num_transactions_, static_cast<int64_t>(queue_.size())};
}

template <typename Fn>
auto PostgresJobStore::ReadTx(Fn fn) -> decltype(fn()) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnectedLocked());
  auto result = fn();
  NoteConnectionErrorLocked();
  return result;
}

// ---- Writes: queued, batched, one COMMIT per batch.

absl::Status PostgresJobStore::StoppedWritingError() const {
  return absl::UnavailableError(
      absl::StrCat("this tallyd stopped writing to ", server_name_,
                   ": another tallyd took over, or an earlier write's outcome is unknown; it must "
                   "restart and recover from the store"));
}

void PostgresJobStore::RunWrite(Write* w) {
  if (must_restart_) {
    w->status = StoppedWritingError();
    return;
  }
  std::vector<Write*> batch;
  {
    absl::MutexLock q(&queue_mu_);
    queue_.push_back(w);
    // Followers wait here (not on mu_, which the running batch holds through
    // its COMMIT), so they all return as soon as their batch is answered.
    auto done_or_free = [this, w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
      return w->done || !writer_active_;
    };
    queue_mu_.Await(absl::Condition(&done_or_free));
    if (w->done) return;
    writer_active_ = true;
    if (group_commit_) {
      // At most kMaxBatch writes per transaction, oldest first, so one
      // transaction stays short under a burst.
      const size_t n = std::min(queue_.size(), kMaxBatch);
      batch.assign(queue_.begin(), queue_.begin() + n);
      queue_.erase(queue_.begin(), queue_.begin() + n);
      if (std::find(batch.begin(), batch.end(), w) == batch.end()) {
        // Our own write is further back: run it in this batch too (it is
        // the one this thread answers for), leaving its place in the queue.
        queue_.erase(std::find(queue_.begin(), queue_.end(), w));
        batch.push_back(w);
      }
    } else {
      queue_.erase(std::find(queue_.begin(), queue_.end(), w));
      batch.push_back(w);
    }
  }
  bool reached_commit;
  {
    absl::MutexLock lock(&mu_);
    reached_commit = RunBatchLocked(batch);
  }
  absl::MutexLock q(&queue_mu_);
  for (Write* b : batch) b->done = true;
  num_writes_ += static_cast<int64_t>(batch.size());
  if (reached_commit) ++num_transactions_;
  writer_active_ = false;
}

bool PostgresJobStore::RunBatchLocked(std::vector<Write*>& batch) {
  // On a failure that loses the whole transaction every member gets it, even
  // one that had its own error: that answer may rest on a write from this
  // same batch that was rolled back.
  auto fail_all = [&](const absl::Status& s) {
    for (Write* w : batch) {
      w->status = s;
      w->create_result.reset();
      w->experiment_create_result.reset();
    }
  };
  // Writes queued behind the batch that found this out are not run either.
  absl::Status s = must_restart_ ? StoppedWritingError() : EnsureConnectedLocked();
  if (s.ok()) s = conn_->Exec("BEGIN").status();
  if (!s.ok()) {
    RollbackLocked();
    fail_all(s);
    return false;
  }
  // A lone write needs no savepoint: its error rolls back the transaction.
  // A write's RELEASE travels with the next one's SAVEPOINT, and COMMIT
  // releases the last: one round trip per write for the savepoints.
  const bool savepoints = batch.size() > 1;
  bool in_savepoint = false;
  int num_ok = 0;
  for (Write* w : batch) {
    if (savepoints) {
      s = conn_->ExecScript(in_savepoint ? "RELEASE SAVEPOINT w; SAVEPOINT w" : "SAVEPOINT w");
      in_savepoint = true;
    }
    if (s.ok()) {
      w->status = ApplyWriteLocked(w);
      if (w->status.ok()) {
        ++num_ok;
      } else if (conn_->Broken()) {
        s = w->status;
      } else if (savepoints) {
        s = conn_->ExecScript("ROLLBACK TO SAVEPOINT w; RELEASE SAVEPOINT w");
        in_savepoint = false;
      }
    }
    if (!s.ok()) {
      RollbackLocked();
      fail_all(s);
      return false;
    }
  }
  if (num_ok == 0) {
    RollbackLocked();
    return false;
  }
  // The fence last, just before COMMIT: its FOR SHARE lock on the lease row
  // is held only for the COMMIT's round trip, so the leader's own renewal
  // (an UPDATE of that row) never waits behind a long batch. Still safe: a
  // takeover committed before this read is seen here, and one after it waits
  // for our COMMIT.
  s = CheckFenceLocked();
  if (!s.ok()) {
    RollbackLocked();
    fail_all(s);
    return false;
  }
  s = CommitLocked();
  if (!s.ok()) fail_all(s);
  return true;
}

absl::Status PostgresJobStore::CheckFenceLocked() {
  const int64_t epoch = fencing_epoch_;
  if (epoch < 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT epoch FROM tally_lease WHERE id = 1 FOR SHARE"));
  if (r.rows() == 1 && r.Int(0, 0) == epoch) return absl::OkStatus();
  must_restart_ = true;
  if (r.rows() != 1) {
    return absl::UnavailableError(absl::StrCat("this tallyd is no longer the leader (lease epoch ",
                                               epoch,
                                               ", and the lease row is "
                                               "missing from tally_lease in ",
                                               server_name_, "): it must restart as a standby"));
  }
  return absl::UnavailableError(absl::StrCat(
      "this tallyd is no longer the leader (lease epoch ", epoch, ", now ", r.Int(0, 0),
      "): another tallyd took over; this one wrote nothing and must restart as a standby"));
}

absl::Status PostgresJobStore::CommitLocked() {
  absl::StatusOr<Result> r = conn_->Exec("COMMIT");
  if (!r.ok()) {
    if (conn_->Broken()) {
      // COMMIT was sent; whether it happened is unknown. Memory can no
      // longer be trusted to match the store.
      must_restart_ = true;
      NoteConnectionErrorLocked();
      return absl::UnavailableError(
          absl::StrCat("lost the connection to ", server_name_,
                       " while committing: the outcome is unknown, so this tallyd must restart and "
                       "recover from the store (",
                       r.status().message(), ")"));
    }
    // The server answered: the transaction was rolled back.
    return r.status();
  }
  if (r->CmdStatus() != "COMMIT") {
    return absl::InternalError(absl::StrCat(server_name_, " rolled the transaction back"));
  }
  return absl::OkStatus();
}

absl::Status PostgresJobStore::ApplyWriteLocked(Write* w) {
  switch (w->kind) {
    case Write::Kind::kCreateJob: {
      ASSIGN_OR_RETURN(CreateResult r, CreateJobLocked(std::move(w->job), std::move(w->job_event)));
      w->create_result = std::move(r);
      return absl::OkStatus();
    }
    case Write::Kind::kCreateExperiment: {
      ASSIGN_OR_RETURN(
          ExperimentCreateResult r,
          CreateExperimentLocked(std::move(w->experiment), std::move(w->experiment_event)));
      w->experiment_create_result = std::move(r);
      return absl::OkStatus();
    }
    case Write::Kind::kCommit:
      return WriteMutationLocked(*w->mutation);
    case Write::Kind::kCommitExperiment:
      return WriteExperimentLocked(*w->experiment_mutation);
    case Write::Kind::kPutWorker:
      return conn_
          ->Exec(
              "INSERT INTO workers (worker_id, record) VALUES ($1, $2) "
              "ON CONFLICT (worker_id) DO UPDATE SET record = EXCLUDED.record",
              {Text(w->worker->worker_id()), Bytes(w->worker->SerializeAsString())})
          .status();
    case Write::Kind::kRun:
      return w->run();
  }
  return absl::InternalError("unknown write");
}

absl::StatusOr<CreateResult> PostgresJobStore::CreateJob(JobRecord job,
                                                         tally::v1::JobEvent first_event) {
  Write w(Write::Kind::kCreateJob);
  w.job = std::move(job);
  w.job_event = std::move(first_event);
  RunWrite(&w);
  if (!w.status.ok()) return w.status;
  return std::move(*w.create_result);
}

absl::Status PostgresJobStore::Commit(const Mutation& mutation) {
  Write w(Write::Kind::kCommit);
  w.mutation = &mutation;
  RunWrite(&w);
  return w.status;
}

absl::Status PostgresJobStore::RunInWrite(std::function<absl::Status()> run) {
  Write w(Write::Kind::kRun);
  w.run = std::move(run);
  RunWrite(&w);
  return w.status;
}

absl::Status PostgresJobStore::PutWorker(const WorkerRecord& worker) {
  Write w(Write::Kind::kPutWorker);
  w.worker = &worker;
  RunWrite(&w);
  return w.status;
}

absl::StatusOr<ExperimentCreateResult> PostgresJobStore::CreateExperiment(
    ExperimentRecord experiment, tally::v1::ExperimentEvent first_event) {
  Write w(Write::Kind::kCreateExperiment);
  w.experiment = std::move(experiment);
  w.experiment_event = std::move(first_event);
  RunWrite(&w);
  if (!w.status.ok()) return w.status;
  return std::move(*w.experiment_create_result);
}

absl::Status PostgresJobStore::CommitExperiment(const ExperimentMutation& mutation) {
  Write w(Write::Kind::kCommitExperiment);
  w.experiment_mutation = &mutation;
  RunWrite(&w);
  return w.status;
}

absl::StatusOr<CreateResult> PostgresJobStore::CreateJobLocked(JobRecord job,
                                                               tally::v1::JobEvent first_event) {
  const std::string& request_id = job.job().request_id();
  const std::string key = RequestKey(job.job().tenant(), request_id);
  // The job a request id already made, else a new id: one round trip.
  ASSIGN_OR_RETURN(
      Result r,
      conn_->Exec("SELECT e.record, CASE WHEN e.record IS NULL THEN "
                  "nextval(pg_get_serial_sequence('jobs', 'id')) END "
                  "FROM (SELECT (SELECT record FROM jobs WHERE request_id = $1) AS record) e",
                  {NullableText(key)}));
  if (!r.IsNull(0, 0)) {
    ASSIGN_OR_RETURN(JobRecord existing, ParseCell<JobRecord>(r, 0, 0, "jobs"));
    if (!MessageDifferencer::Equals(existing.job().spec(), job.job().spec())) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id \"", request_id, "\" was already used for ",
                       existing.job().name(), " with a different spec"));
    }
    return CreateResult{existing, false};
  }
  const int64_t id = r.Int(0, 1);
  job.set_id(id);
  job.mutable_job()->set_name(JobName(id));
  job.mutable_job()->set_last_event_sequence(1);
  first_event.set_job(job.job().name());
  first_event.set_sequence(1);
  RETURN_IF_ERROR(
      conn_
          ->Exec("WITH j AS (INSERT INTO jobs (id, request_id, tenant, state, "
                 "create_time_us, record) VALUES ($1, $2, $3, $4, $5, $6)) "
                 "INSERT INTO events (job_id, seq, event) VALUES ($1, 1, $7)",
                 {Int(id), NullableText(key), Text(job.job().tenant()), Int(job.job().state()),
                  Int(CreateMicros(job)), Bytes(job.SerializeAsString()),
                  Bytes(first_event.SerializeAsString())})
          .status());
  return CreateResult{std::move(job), true};
}

absl::Status PostgresJobStore::WriteMutationLocked(const Mutation& m) {
  if (m.job) {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("UPDATE jobs SET state = $1, record = $2 WHERE id = $3",
                                           {Int(m.job->job().state()),
                                            Bytes(m.job->SerializeAsString()), Int(m.job->id())}));
    if (r.AffectedRows() != 1) {
      return absl::NotFoundError(absl::StrCat(JobName(m.job->id()), " not found"));
    }
  }
  for (const auto& e : m.events) {
    ASSIGN_OR_RETURN(int64_t job_id, ParseJobName(e.job(), "event.job"));
    RETURN_IF_ERROR(conn_
                        ->Exec("INSERT INTO events (job_id, seq, event) VALUES ($1, $2, $3)",
                               {Int(job_id), Int(e.sequence()), Bytes(e.SerializeAsString())})
                        .status());
  }
  for (const auto& a : m.attempts) {
    RETURN_IF_ERROR(
        conn_
            ->Exec("INSERT INTO attempts (job_id, attempt, record) VALUES ($1, $2, $3) "
                   "ON CONFLICT (job_id, attempt) DO UPDATE SET record = EXCLUDED.record",
                   {Int(a.job_id()), Int(a.attempt()), Bytes(a.SerializeAsString())})
            .status());
  }
  for (const auto& c : m.checkpoints) {
    ASSIGN_OR_RETURN(int64_t job_id, ParseJobName(c.job(), "checkpoint.job"));
    RETURN_IF_ERROR(conn_
                        ->Exec("INSERT INTO checkpoints (job_id, step, record) VALUES ($1, $2, $3)",
                               {Int(job_id), Int(c.step()), Bytes(c.SerializeAsString())})
                        .status());
  }
  for (const SpendRecord& r : m.spend) {
    RETURN_IF_ERROR(conn_
                        ->Exec("INSERT INTO tenant_spend (tenant, hour, usd) VALUES ($1, $2, $3) "
                               "ON CONFLICT (tenant, hour) DO UPDATE SET usd = tenant_spend.usd + "
                               "EXCLUDED.usd",
                               {Text(r.tenant), Int(r.hour), Float(r.usd)})
                        .status());
  }
  return absl::OkStatus();
}

absl::StatusOr<ExperimentCreateResult> PostgresJobStore::CreateExperimentLocked(
    ExperimentRecord rec, tally::v1::ExperimentEvent first_event) {
  const std::string& request_id = rec.experiment().request_id();
  const std::string key = RequestKey(rec.experiment().tenant(), request_id);
  ASSIGN_OR_RETURN(
      Result r, conn_->Exec("SELECT e.record, CASE WHEN e.record IS NULL THEN "
                            "nextval(pg_get_serial_sequence('experiments', 'id')) END "
                            "FROM (SELECT (SELECT record FROM experiments WHERE request_id = $1) "
                            "AS record) e",
                            {NullableText(key)}));
  if (!r.IsNull(0, 0)) {
    ASSIGN_OR_RETURN(ExperimentRecord existing,
                     ParseCell<ExperimentRecord>(r, 0, 0, "experiments"));
    if (!MessageDifferencer::Equals(existing.experiment().spec(), rec.experiment().spec())) {
      return absl::AlreadyExistsError(
          absl::StrCat("request_id \"", request_id, "\" was already used for ",
                       existing.experiment().name(), " with a different spec"));
    }
    return ExperimentCreateResult{existing, false};
  }
  const int64_t id = r.Int(0, 1);
  rec.set_id(id);
  rec.mutable_experiment()->set_name(ExperimentName(id));
  rec.mutable_experiment()->set_last_event_sequence(1);
  first_event.set_experiment(rec.experiment().name());
  first_event.set_sequence(1);
  RETURN_IF_ERROR(
      conn_
          ->Exec("WITH x AS (INSERT INTO experiments (id, request_id, tenant, state, record) "
                 "VALUES ($1, $2, $3, $4, $5)) "
                 "INSERT INTO experiment_events (experiment_id, seq, event) VALUES ($1, 1, $6)",
                 {Int(id), NullableText(key), Text(rec.experiment().tenant()),
                  Int(rec.experiment().state()), Bytes(rec.SerializeAsString()),
                  Bytes(first_event.SerializeAsString())})
          .status());
  return ExperimentCreateResult{std::move(rec), true};
}

absl::Status PostgresJobStore::WriteExperimentLocked(const ExperimentMutation& m) {
  {
    ASSIGN_OR_RETURN(
        Result r, conn_->Exec("UPDATE experiments SET state = $1, record = $2 WHERE id = $3",
                              {Int(m.experiment.experiment().state()),
                               Bytes(m.experiment.SerializeAsString()), Int(m.experiment.id())}));
    if (r.AffectedRows() != 1) {
      return absl::NotFoundError(absl::StrCat(ExperimentName(m.experiment.id()), " not found"));
    }
  }
  int64_t last = 0;
  if (!m.events.empty()) {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT COALESCE(MAX(seq), 0) FROM experiment_events "
                                           "WHERE experiment_id = $1",
                                           {Int(m.experiment.id())}));
    if (r.rows() == 1) last = r.Int(0, 0);
  }
  for (const auto& e : m.events) {
    if (e.sequence() != ++last) {
      return absl::InternalError(absl::StrCat("experiment event sequence gap for ",
                                              m.experiment.experiment().name(), ": got ",
                                              e.sequence(), ", expected ", last));
    }
    RETURN_IF_ERROR(
        conn_
            ->Exec("INSERT INTO experiment_events (experiment_id, seq, event) "
                   "VALUES ($1, $2, $3)",
                   {Int(m.experiment.id()), Int(e.sequence()), Bytes(e.SerializeAsString())})
            .status());
  }
  return absl::OkStatus();
}

// ---- Reads: one statement each, so each is its own transaction.

namespace {
// SQLite reads a negative LIMIT as none; so does LIMIT NULL.
Param Limit(int limit) {
  if (limit < 0) return {std::nullopt, kInt8Oid, 1};
  return Int(limit);
}
}  // namespace

absl::StatusOr<std::vector<SpendRecord>> PostgresJobStore::ListSpend(int64_t since_hour) {
  return ReadTx([&]() -> absl::StatusOr<std::vector<SpendRecord>> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT tenant, hour, usd FROM tenant_spend "
                                           "WHERE hour >= $1 ORDER BY tenant, hour",
                                           {Int(since_hour)}));
    std::vector<SpendRecord> out;
    for (int i = 0; i < r.rows(); ++i) {
      out.push_back({r.Bytes(i, 0), r.Int(i, 1), r.Double(i, 2)});
    }
    return out;
  });
}

absl::StatusOr<JobRecord> PostgresJobStore::GetJob(int64_t id) {
  return ReadTx([&]() -> absl::StatusOr<JobRecord> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT record FROM jobs WHERE id = $1", {Int(id)}));
    if (r.rows() == 0) return absl::NotFoundError(absl::StrCat(JobName(id), " not found"));
    return ParseCell<JobRecord>(r, 0, 0, "jobs");
  });
}

absl::StatusOr<std::vector<JobRecord>> PostgresJobStore::ListJobs(const JobQuery& q) {
  std::vector<int64_t> states(q.states.begin(), q.states.end());
  return ReadTx([&]() -> absl::StatusOr<std::vector<JobRecord>> {
    ASSIGN_OR_RETURN(
        Result r,
        conn_->Exec(
            "SELECT record FROM jobs WHERE id < $1 "
            "AND ($2::bigint[] IS NULL OR state = ANY($2)) "
            "AND ($3::text IS NULL OR tenant = $3) ORDER BY id DESC LIMIT $4",
            {Int(q.before_id > 0 ? q.before_id : std::numeric_limits<int64_t>::max()),
             states.empty() ? Param{std::nullopt, kInt8ArrayOid, 0} : IntArray(states),
             q.tenant ? Text(*q.tenant) : Param{std::nullopt, kTextOid, 1}, Limit(q.limit)}));
    return ParseColumn<JobRecord>(r, "jobs");
  });
}

absl::StatusOr<std::vector<JobRecord>> PostgresJobStore::ListActiveJobs() {
  return ReadTx([&]() -> absl::StatusOr<std::vector<JobRecord>> {
    ASSIGN_OR_RETURN(
        Result r,
        conn_->Exec("SELECT record FROM jobs WHERE state = ANY($1) "
                    "ORDER BY id",
                    {IntArray({tally::v1::JOB_STATE_QUEUED, tally::v1::JOB_STATE_RUNNING})}));
    return ParseColumn<JobRecord>(r, "jobs");
  });
}

absl::StatusOr<std::vector<tally::v1::JobEvent>> PostgresJobStore::ListEvents(
    int64_t job_id, int64_t after_sequence, int limit) {
  return ReadTx([&]() -> absl::StatusOr<std::vector<tally::v1::JobEvent>> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT event FROM events WHERE job_id = $1 AND "
                                           "seq > $2 ORDER BY seq LIMIT $3",
                                           {Int(job_id), Int(after_sequence), Limit(limit)}));
    if (r.rows() == 0) {
      // Jobs are never deleted, so a job with events exists: look only now.
      ASSIGN_OR_RETURN(Result j, conn_->Exec("SELECT 1 FROM jobs WHERE id = $1", {Int(job_id)}));
      if (j.rows() == 0) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
    }
    return ParseColumn<tally::v1::JobEvent>(r, "events");
  });
}

absl::StatusOr<std::vector<AttemptRecord>> PostgresJobStore::ListAttempts(int64_t job_id) {
  return ReadTx([&]() -> absl::StatusOr<std::vector<AttemptRecord>> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT record FROM attempts WHERE job_id = $1 "
                                           "ORDER BY attempt",
                                           {Int(job_id)}));
    return ParseColumn<AttemptRecord>(r, "attempts");
  });
}

absl::StatusOr<std::vector<tally::v1::Checkpoint>> PostgresJobStore::ListCheckpoints(
    int64_t job_id) {
  return ReadTx([&]() -> absl::StatusOr<std::vector<tally::v1::Checkpoint>> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT record FROM checkpoints WHERE job_id = $1 "
                                           "ORDER BY id",
                                           {Int(job_id)}));
    return ParseColumn<tally::v1::Checkpoint>(r, "checkpoints");
  });
}

absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>>
PostgresJobStore::CountJobsByState() {
  using Counts = std::vector<std::pair<tally::v1::JobState, int64_t>>;
  return ReadTx([&]() -> absl::StatusOr<Counts> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT state, COUNT(*) FROM jobs GROUP BY state "
                                           "ORDER BY state"));
    Counts out;
    for (int i = 0; i < r.rows(); ++i) {
      out.emplace_back(static_cast<tally::v1::JobState>(r.Int(i, 0)), r.Int(i, 1));
    }
    return out;
  });
}

absl::StatusOr<std::vector<WorkerRecord>> PostgresJobStore::ListWorkers() {
  return ReadTx([&]() -> absl::StatusOr<std::vector<WorkerRecord>> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT record FROM workers ORDER BY worker_id"));
    return ParseColumn<WorkerRecord>(r, "workers");
  });
}

absl::StatusOr<ExperimentRecord> PostgresJobStore::GetExperiment(int64_t id) {
  return ReadTx([&]() -> absl::StatusOr<ExperimentRecord> {
    ASSIGN_OR_RETURN(Result r,
                     conn_->Exec("SELECT record FROM experiments WHERE id = $1", {Int(id)}));
    if (r.rows() == 0) {
      return absl::NotFoundError(absl::StrCat(ExperimentName(id), " not found"));
    }
    return ParseCell<ExperimentRecord>(r, 0, 0, "experiments");
  });
}

absl::StatusOr<std::vector<ExperimentRecord>> PostgresJobStore::ListExperiments(
    int64_t before_id, int limit, const std::optional<std::string>& tenant) {
  return ReadTx([&]() -> absl::StatusOr<std::vector<ExperimentRecord>> {
    ASSIGN_OR_RETURN(
        Result r,
        conn_->Exec("SELECT record FROM experiments WHERE id < $1 "
                    "AND ($2::text IS NULL OR tenant = $2) ORDER BY id DESC LIMIT $3",
                    {Int(before_id > 0 ? before_id : std::numeric_limits<int64_t>::max()),
                     tenant ? Text(*tenant) : Param{std::nullopt, kTextOid, 1}, Limit(limit)}));
    return ParseColumn<ExperimentRecord>(r, "experiments");
  });
}

absl::StatusOr<std::vector<ExperimentRecord>> PostgresJobStore::ListActiveExperiments() {
  return ReadTx([&]() -> absl::StatusOr<std::vector<ExperimentRecord>> {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT record FROM experiments WHERE state = $1 "
                                           "ORDER BY id",
                                           {Int(tally::v1::EXPERIMENT_STATE_RUNNING)}));
    return ParseColumn<ExperimentRecord>(r, "experiments");
  });
}

absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> PostgresJobStore::ListExperimentEvents(
    int64_t experiment_id, int64_t after_sequence, int limit) {
  return ReadTx([&]() -> absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> {
    ASSIGN_OR_RETURN(Result r,
                     conn_->Exec("SELECT event FROM experiment_events WHERE experiment_id = $1 "
                                 "AND seq > $2 ORDER BY seq LIMIT $3",
                                 {Int(experiment_id), Int(after_sequence), Limit(limit)}));
    if (r.rows() == 0) {
      ASSIGN_OR_RETURN(
          Result x, conn_->Exec("SELECT 1 FROM experiments WHERE id = $1", {Int(experiment_id)}));
      if (x.rows() == 0) {
        return absl::NotFoundError(absl::StrCat(ExperimentName(experiment_id), " not found"));
      }
    }
    return ParseColumn<tally::v1::ExperimentEvent>(r, "experiment_events");
  });
}

}  // namespace tally::store
