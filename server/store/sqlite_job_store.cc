#include "server/store/sqlite_job_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "google/protobuf/util/time_util.h"

namespace tally::store {
namespace {

using google::protobuf::util::MessageDifferencer;

// Migration i brings the schema from version i to i + 1. Append only: a
// released migration never changes.
const char* const kMigrations[] = {
    // 0 -> 1: jobs, their events and attempts, workers.
    R"sql(
    CREATE TABLE jobs (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      request_id TEXT UNIQUE,
      state INTEGER NOT NULL,
      create_time_us INTEGER NOT NULL,
      record BLOB NOT NULL);
    CREATE TABLE events (
      job_id INTEGER NOT NULL REFERENCES jobs(id),
      seq INTEGER NOT NULL,
      event BLOB NOT NULL,
      PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
    CREATE TABLE attempts (
      job_id INTEGER NOT NULL REFERENCES jobs(id),
      attempt INTEGER NOT NULL,
      record BLOB NOT NULL,
      PRIMARY KEY (job_id, attempt)) WITHOUT ROWID;
    CREATE TABLE workers (
      worker_id TEXT PRIMARY KEY,
      record BLOB NOT NULL);
    )sql",
    // 1 -> 2: checkpoints, and an index for listing by state.
    R"sql(
    CREATE TABLE checkpoints (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      job_id INTEGER NOT NULL REFERENCES jobs(id),
      step INTEGER NOT NULL,
      record BLOB NOT NULL);
    CREATE INDEX checkpoints_by_job ON checkpoints(job_id, id);
    CREATE INDEX jobs_by_state ON jobs(state, id);
    )sql",
    // 2 -> 3: experiments and their events.
    R"sql(
    CREATE TABLE experiments (
      id INTEGER PRIMARY KEY AUTOINCREMENT,
      request_id TEXT UNIQUE,
      state INTEGER NOT NULL,
      record BLOB NOT NULL);
    CREATE INDEX experiments_by_state ON experiments(state, id);
    CREATE TABLE experiment_events (
      experiment_id INTEGER NOT NULL REFERENCES experiments(id),
      seq INTEGER NOT NULL,
      event BLOB NOT NULL,
      PRIMARY KEY (experiment_id, seq)) WITHOUT ROWID;
    )sql",
    // 3 -> 4: tenants. request_id becomes the per-tenant key (RequestKey),
    // which is the request id itself for rows made before tenants.
    R"sql(
    ALTER TABLE jobs ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
    CREATE INDEX jobs_by_tenant ON jobs(tenant, id);
    ALTER TABLE experiments ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
    CREATE INDEX experiments_by_tenant ON experiments(tenant, id);
    )sql",
    // 4 -> 5: dollars per tenant and hour, for tenant quotas.
    R"sql(
    CREATE TABLE tenant_spend (
      tenant TEXT NOT NULL,
      hour INTEGER NOT NULL,
      usd REAL NOT NULL,
      PRIMARY KEY (tenant, hour)) WITHOUT ROWID;
    )sql",
    // 5 -> 6: what attempts printed (sqlite_job_logs.cc); cost 0: a marker.
    R"sql(
    CREATE TABLE job_logs (
      job_id INTEGER NOT NULL, seq INTEGER NOT NULL, attempt INTEGER NOT NULL,
      rank INTEGER NOT NULL, time_us INTEGER NOT NULL, cost INTEGER NOT NULL,
      line BLOB NOT NULL, PRIMARY KEY (job_id, seq)) WITHOUT ROWID;
    CREATE TABLE job_log_state (job_id INTEGER PRIMARY KEY, last_seq INTEGER NOT NULL,
      kept_bytes INTEGER NOT NULL, dropped_bytes INTEGER NOT NULL);
    )sql",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) ==
              SqliteJobStore::kSchemaVersion);

absl::Status SqlError(sqlite3* db, absl::string_view what) {
  const int code = sqlite3_errcode(db);
  std::string msg = absl::StrCat(what, ": ", sqlite3_errmsg(db));
  if (code == SQLITE_BUSY || code == SQLITE_LOCKED) {
    return absl::UnavailableError(msg);
  }
  if (code == SQLITE_FULL || code == SQLITE_IOERR) {
    return absl::ResourceExhaustedError(msg);
  }
  return absl::InternalError(msg);
}

absl::Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    return absl::InternalError(absl::StrCat("sqlite: ", msg));
  }
  return absl::OkStatus();
}

// A prepared statement; binds are 1-based like SQLite's.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      status_ = SqlError(db, absl::StrCat("prepare ", sql));
    }
  }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  const absl::Status& status() const { return status_; }
  Stmt& Bind(int i, int64_t v) {
    if (stmt_) sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& Bind(int i, const std::string& v) {
    if (stmt_) sqlite3_bind_text(stmt_, i, v.data(), v.size(), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& BindDouble(int i, double v) {
    if (stmt_) sqlite3_bind_double(stmt_, i, v);
    return *this;
  }
  Stmt& BindNull(int i) {
    if (stmt_) sqlite3_bind_null(stmt_, i);
    return *this;
  }
  Stmt& BindBlob(int i, const std::string& v) {
    if (stmt_) sqlite3_bind_blob(stmt_, i, v.data(), v.size(), SQLITE_TRANSIENT);
    return *this;
  }
  // true: a row is ready; false: done.
  absl::StatusOr<bool> Step() {
    if (!status_.ok()) return status_;
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqlError(db_, "step");
  }
  absl::Status Run() {
    absl::StatusOr<bool> row = Step();
    return row.status();
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  double Double(int col) { return sqlite3_column_double(stmt_, col); }
  std::string Text(int col) {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t == nullptr ? std::string()
                        : std::string(reinterpret_cast<const char*>(t),
                                      sqlite3_column_bytes(stmt_, col));
  }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return std::string(static_cast<const char*>(p),
                       sqlite3_column_bytes(stmt_, col));
  }

 private:
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  absl::Status status_;
};

template <typename Proto>
absl::StatusOr<Proto> ParseRow(Stmt& s, int col, absl::string_view table) {
  Proto p;
  if (!p.ParseFromString(s.Blob(col))) {
    return absl::DataLossError(absl::StrCat("corrupt record in ", table));
  }
  return p;
}

// Every row's column 0, parsed as Proto.
template <typename Proto>
absl::StatusOr<std::vector<Proto>> ReadAll(Stmt& s, absl::string_view table) {
  std::vector<Proto> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return out;
    ASSIGN_OR_RETURN(Proto p, ParseRow<Proto>(s, 0, table));
    out.push_back(std::move(p));
  }
}

// Rolls back unless Commit() was called.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {
    status_ = Exec(db_, "BEGIN IMMEDIATE");
  }
  ~Transaction() {
    if (status_.ok() && !done_) Exec(db_, "ROLLBACK").IgnoreError();
  }
  const absl::Status& status() const { return status_; }
  absl::Status Commit() {
    done_ = true;
    return Exec(db_, "COMMIT");
  }

 private:
  sqlite3* db_;
  absl::Status status_;
  bool done_ = false;
};

int64_t CreateMicros(const JobRecord& job) {
  return google::protobuf::util::TimeUtil::TimestampToMicroseconds(
      job.job().create_time());
}

absl::StatusOr<int> UserVersion(sqlite3* db) {
  Stmt s(db, "PRAGMA user_version");
  ASSIGN_OR_RETURN(bool row, s.Step());
  return row ? static_cast<int>(s.Int(0)) : 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::Open(
    const std::string& path) {
  return OpenAtVersion(path, kSchemaVersion);
}

absl::StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::OpenAtVersion(
    const std::string& path, int version) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE |
                          SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    absl::Status s = absl::FailedPreconditionError(absl::StrCat(
        "cannot open database ", path, ": ",
        db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return s;
  }
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(db));
  sqlite3_busy_timeout(db, 5000);
  absl::MutexLock lock(&store->mu_);
  RETURN_IF_ERROR(Exec(db, "PRAGMA journal_mode=WAL"));
  RETURN_IF_ERROR(Exec(db, "PRAGMA synchronous=FULL"));
  RETURN_IF_ERROR(Exec(db, "PRAGMA foreign_keys=ON"));
  RETURN_IF_ERROR(Exec(db, "PRAGMA temp_store=MEMORY"));
  RETURN_IF_ERROR(store->Migrate(version));
  return store;
}

SqliteJobStore::~SqliteJobStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status SqliteJobStore::Migrate(int target) {
  ASSIGN_OR_RETURN(int current, UserVersion(db_));
  if (current > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "database schema version ", current, " is newer than this tallyd (",
        kSchemaVersion, "); run a newer tallyd or point --data_dir elsewhere"));
  }
  for (int v = current; v < target; ++v) {
    Transaction tx(db_);
    RETURN_IF_ERROR(tx.status());
    RETURN_IF_ERROR(Exec(db_, kMigrations[v]));
    RETURN_IF_ERROR(
        Exec(db_, absl::StrCat("PRAGMA user_version=", v + 1).c_str()));
    RETURN_IF_ERROR(tx.Commit());
  }
  return absl::OkStatus();
}

absl::StatusOr<int> SqliteJobStore::SchemaVersion() {
  absl::MutexLock lock(&mu_);
  return UserVersion(db_);
}

// ---------------------------------------------------------------- group commit

SqliteJobStore::BatchStats SqliteJobStore::batch_stats() const {
  absl::MutexLock lock(&queue_mu_);
  return stats_;
}

int SqliteJobStore::NumQueuedWrites() const {
  absl::MutexLock lock(&queue_mu_);
  return static_cast<int>(queue_.size());
}

void SqliteJobStore::SetCommitHookForTesting(std::function<bool()> hook) {
  absl::MutexLock lock(&mu_);
  commit_hook_ = std::move(hook);
  if (commit_hook_) {
    sqlite3_commit_hook(
        db_,
        [](void* self) -> int {
          // Non-zero turns the COMMIT into a rollback.
          return static_cast<SqliteJobStore*>(self)->commit_hook_() ? 0 : 1;
        },
        this);
  } else {
    sqlite3_commit_hook(db_, nullptr, nullptr);
  }
}

absl::Status SqliteJobStore::WriteBatched(std::function<absl::Status()> write) {
  PendingWrite w;
  w.write = std::move(write);
  std::vector<PendingWrite*> batch;
  {
    absl::MutexLock lock(&queue_mu_);
    queue_.push_back(&w);
    auto ready = [this, &w]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(queue_mu_) {
      return w.done || queue_.front() == &w;
    };
    queue_mu_.Await(absl::Condition(&ready));
    // A writer ahead of this one committed it in its batch.
    if (w.done) return w.status;
    // This writer leads: it takes what is queued now. The batch stays at the
    // front of the queue until it is answered, so writers arriving in the
    // meantime wait for the next batch.
    for (PendingWrite* p : queue_) {
      if (static_cast<int>(batch.size()) == kMaxBatch) break;
      batch.push_back(p);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    CommitBatch(batch);
  }
  absl::MutexLock lock(&queue_mu_);
  for (PendingWrite* p : batch) {
    p->done = true;
    queue_.pop_front();
  }
  ++stats_.batches;
  stats_.writes += static_cast<int64_t>(batch.size());
  write_health_.Record(w.status);
  return w.status;
}

absl::Status SqliteJobStore::ProbeWrite() {
  return WriteBatched([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    ASSIGN_OR_RETURN(const int version, UserVersion(db_));
    if (sqlite3_exec(db_, absl::StrCat("PRAGMA user_version=", version).c_str(), nullptr,
                     nullptr, nullptr) != SQLITE_OK) {
      return SqlError(db_, "sqlite: cannot write");
    }
    // That page may fit in space the WAL already holds: also take fresh
    // blocks beside the database, as the next real write may need them.
    const char* db_path = sqlite3_db_filename(db_, "main");
    if (db_path == nullptr || db_path[0] == '\0') return absl::OkStatus();
    const std::string probe = absl::StrCat(db_path, "-probe");
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot create a file beside the database: ", std::strerror(errno)));
    }
    const std::string block(64 * 1024, '\0');
    const bool written = ::write(fd, block.data(), block.size()) ==
                             static_cast<ssize_t>(block.size()) &&
                         ::fsync(fd) == 0;
    const int saved = errno;
    ::close(fd);
    ::unlink(probe.c_str());
    if (!written) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot write 64 KiB beside the database: ", std::strerror(saved)));
    }
    return absl::OkStatus();
  });
}

void SqliteJobStore::CommitBatch(const std::vector<PendingWrite*>& batch) {
  // Fails every write of the batch not already failed on its own, and
  // undoes whatever the transaction holds.
  auto fail_all = [&](const absl::Status& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!sqlite3_get_autocommit(db_)) Exec(db_, "ROLLBACK").IgnoreError();
    for (PendingWrite* p : batch) {
      if (p->status.ok()) p->status = why;
    }
  };
  const int n = static_cast<int>(batch.size());
  if (sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    fail_all(SqlError(db_, "sqlite: cannot begin a write transaction"));
    return;
  }
  if (n == 1) {
    // A lone write needs no savepoint: its failure rolls back everything.
    batch[0]->status = batch[0]->write();
    if (!batch[0]->status.ok()) {
      fail_all(batch[0]->status);
      return;
    }
  } else {
    for (PendingWrite* p : batch) {
      if (sqlite3_exec(db_, "SAVEPOINT batched_write", nullptr, nullptr, nullptr) !=
          SQLITE_OK) {
        fail_all(SqlError(db_, "sqlite: cannot open a savepoint in a batch of writes"));
        return;
      }
      p->status = p->write();
      if (!p->status.ok()) {
        if (sqlite3_get_autocommit(db_)) {
          // SQLite itself rolled the transaction back (an I/O error, a full
          // disk): the writes before this one are gone too.
          fail_all(absl::Status(
              p->status.code(),
              absl::StrCat("the batch of ", n, " writes this one was in was rolled back: ",
                           p->status.message())));
          return;
        }
        if (sqlite3_exec(db_, "ROLLBACK TO batched_write", nullptr, nullptr, nullptr) !=
            SQLITE_OK) {
          fail_all(SqlError(db_, "sqlite: cannot roll back a failed write in a batch"));
          return;
        }
      }
      if (sqlite3_exec(db_, "RELEASE batched_write", nullptr, nullptr, nullptr) != SQLITE_OK) {
        fail_all(SqlError(db_, "sqlite: cannot release a savepoint in a batch of writes"));
        return;
      }
    }
  }
  if (sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
    fail_all(SqlError(db_, absl::StrCat("sqlite: commit of a batch of ", n,
                                        n == 1 ? " write" : " writes", " failed")));
  }
}

absl::StatusOr<CreateResult> SqliteJobStore::CreateJob(
    JobRecord job, tally::v1::JobEvent first_event) {
  absl::StatusOr<CreateResult> result;
  absl::Status s = WriteBatched([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    result = CreateJobLocked(std::move(job), std::move(first_event));
    return result.status();
  });
  if (!s.ok()) return s;
  return result;
}

absl::StatusOr<CreateResult> SqliteJobStore::CreateJobLocked(
    JobRecord job, tally::v1::JobEvent first_event) {
  const std::string& request_id = job.job().request_id();
  const std::string key = RequestKey(job.job().tenant(), request_id);
  if (!request_id.empty()) {
    Stmt s(db_, "SELECT record FROM jobs WHERE request_id = ?");
    s.Bind(1, key);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (row) {
      ASSIGN_OR_RETURN(JobRecord existing, ParseRow<JobRecord>(s, 0, "jobs"));
      if (!MessageDifferencer::Equals(existing.job().spec(), job.job().spec())) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id \"", request_id, "\" was already used for ",
            existing.job().name(), " with a different spec"));
      }
      return CreateResult{existing, false};
    }
  }
  {
    Stmt s(db_,
           "INSERT INTO jobs (request_id, state, create_time_us, record, tenant) "
           "VALUES (?, ?, ?, x'', ?)");
    if (request_id.empty()) {
      s.BindNull(1);
    } else {
      s.Bind(1, key);
    }
    s.Bind(2, job.job().state()).Bind(3, CreateMicros(job)).Bind(4, job.job().tenant());
    RETURN_IF_ERROR(s.Run());
  }
  const int64_t id = sqlite3_last_insert_rowid(db_);
  job.set_id(id);
  job.mutable_job()->set_name(JobName(id));
  job.mutable_job()->set_last_event_sequence(1);
  first_event.set_job(job.job().name());
  first_event.set_sequence(1);
  Mutation m;
  m.job = job;
  m.events.push_back(first_event);
  RETURN_IF_ERROR(WriteMutationLocked(m));
  return CreateResult{job, true};
}

absl::Status SqliteJobStore::WriteMutationLocked(const Mutation& m) {
  if (m.job) {
    Stmt s(db_, "UPDATE jobs SET state = ?, record = ? WHERE id = ?");
    s.Bind(1, m.job->job().state())
        .BindBlob(2, m.job->SerializeAsString())
        .Bind(3, m.job->id());
    RETURN_IF_ERROR(s.Run());
    if (sqlite3_changes(db_) != 1) {
      return absl::NotFoundError(absl::StrCat(JobName(m.job->id()), " not found"));
    }
  }
  for (const auto& e : m.events) {
    ASSIGN_OR_RETURN(int64_t job_id, ParseJobName(e.job(), "event.job"));
    Stmt s(db_, "INSERT INTO events (job_id, seq, event) VALUES (?, ?, ?)");
    s.Bind(1, job_id).Bind(2, e.sequence()).BindBlob(3, e.SerializeAsString());
    RETURN_IF_ERROR(s.Run());
  }
  for (const auto& a : m.attempts) {
    Stmt s(db_,
           "INSERT OR REPLACE INTO attempts (job_id, attempt, record) "
           "VALUES (?, ?, ?)");
    s.Bind(1, a.job_id()).Bind(2, a.attempt()).BindBlob(3, a.SerializeAsString());
    RETURN_IF_ERROR(s.Run());
  }
  for (const auto& c : m.checkpoints) {
    ASSIGN_OR_RETURN(int64_t job_id, ParseJobName(c.job(), "checkpoint.job"));
    Stmt s(db_, "INSERT INTO checkpoints (job_id, step, record) VALUES (?, ?, ?)");
    s.Bind(1, job_id).Bind(2, c.step()).BindBlob(3, c.SerializeAsString());
    RETURN_IF_ERROR(s.Run());
  }
  for (const SpendRecord& r : m.spend) {
    Stmt s(db_,
           "INSERT INTO tenant_spend (tenant, hour, usd) VALUES (?, ?, ?) "
           "ON CONFLICT (tenant, hour) DO UPDATE SET usd = usd + excluded.usd");
    s.Bind(1, r.tenant).Bind(2, r.hour).BindDouble(3, r.usd);
    RETURN_IF_ERROR(s.Run());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SpendRecord>> SqliteJobStore::ListSpend(int64_t since_hour) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT tenant, hour, usd FROM tenant_spend WHERE hour >= ? ORDER BY tenant, hour");
  s.Bind(1, since_hour);
  std::vector<SpendRecord> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back({s.Text(0), s.Int(1), s.Double(2)});
  }
  return out;
}

absl::Status SqliteJobStore::Commit(const Mutation& m) {
  return WriteBatched(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return WriteMutationLocked(m); });
}

absl::StatusOr<JobRecord> SqliteJobStore::GetJob(int64_t id) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT record FROM jobs WHERE id = ?");
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat(JobName(id), " not found"));
  return ParseRow<JobRecord>(s, 0, "jobs");
}

absl::StatusOr<std::vector<JobRecord>> SqliteJobStore::ListJobs(
    const JobQuery& q) {
  absl::MutexLock lock(&mu_);
  std::string sql = "SELECT record FROM jobs WHERE id < ?1";
  if (q.tenant) sql += " AND tenant = ?3";
  if (!q.states.empty()) {
    sql += " AND state IN (";
    for (size_t i = 0; i < q.states.size(); ++i) {
      absl::StrAppend(&sql, i ? "," : "", static_cast<int>(q.states[i]));
    }
    sql += ")";
  }
  sql += " ORDER BY id DESC LIMIT ?2";
  Stmt s(db_, sql.c_str());
  s.Bind(1, q.before_id > 0 ? q.before_id : std::numeric_limits<int64_t>::max())
      .Bind(2, q.limit);
  if (q.tenant) s.Bind(3, *q.tenant);
  return ReadAll<JobRecord>(s, "jobs");
}

absl::StatusOr<std::vector<JobRecord>> SqliteJobStore::ListActiveJobs() {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT record FROM jobs WHERE state IN (?, ?) ORDER BY id");
  s.Bind(1, tally::v1::JOB_STATE_QUEUED).Bind(2, tally::v1::JOB_STATE_RUNNING);
  return ReadAll<JobRecord>(s, "jobs");
}

absl::StatusOr<std::vector<tally::v1::JobEvent>> SqliteJobStore::ListEvents(
    int64_t job_id, int64_t after_sequence, int limit) {
  absl::MutexLock lock(&mu_);
  {
    Stmt s(db_, "SELECT 1 FROM jobs WHERE id = ?");
    s.Bind(1, job_id);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
  }
  Stmt s(db_,
         "SELECT event FROM events WHERE job_id = ? AND seq > ? ORDER BY seq "
         "LIMIT ?");
  s.Bind(1, job_id).Bind(2, after_sequence).Bind(3, limit);
  return ReadAll<tally::v1::JobEvent>(s, "events");
}

absl::StatusOr<std::vector<AttemptRecord>> SqliteJobStore::ListAttempts(
    int64_t job_id) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT record FROM attempts WHERE job_id = ? ORDER BY attempt");
  s.Bind(1, job_id);
  return ReadAll<AttemptRecord>(s, "attempts");
}

absl::StatusOr<std::vector<tally::v1::Checkpoint>>
SqliteJobStore::ListCheckpoints(int64_t job_id) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT record FROM checkpoints WHERE job_id = ? ORDER BY id");
  s.Bind(1, job_id);
  return ReadAll<tally::v1::Checkpoint>(s, "checkpoints");
}

absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>>
SqliteJobStore::CountJobsByState() {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state ORDER BY state");
  std::vector<std::pair<tally::v1::JobState, int64_t>> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.emplace_back(static_cast<tally::v1::JobState>(s.Int(0)), s.Int(1));
  }
  return out;
}

absl::Status SqliteJobStore::PutWorker(const WorkerRecord& worker) {
  return WriteBatched([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Stmt s(db_, "INSERT OR REPLACE INTO workers (worker_id, record) VALUES (?, ?)");
    s.Bind(1, worker.worker_id()).BindBlob(2, worker.SerializeAsString());
    return s.Run();
  });
}

absl::StatusOr<std::vector<WorkerRecord>> SqliteJobStore::ListWorkers() {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT record FROM workers ORDER BY worker_id");
  return ReadAll<WorkerRecord>(s, "workers");
}

absl::StatusOr<ExperimentCreateResult> SqliteJobStore::CreateExperiment(
    ExperimentRecord rec, tally::v1::ExperimentEvent first_event) {
  absl::StatusOr<ExperimentCreateResult> result;
  absl::Status s = WriteBatched([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    result = CreateExperimentLocked(std::move(rec), std::move(first_event));
    return result.status();
  });
  if (!s.ok()) return s;
  return result;
}

absl::StatusOr<ExperimentCreateResult> SqliteJobStore::CreateExperimentLocked(
    ExperimentRecord rec, tally::v1::ExperimentEvent first_event) {
  const std::string& request_id = rec.experiment().request_id();
  const std::string key = RequestKey(rec.experiment().tenant(), request_id);
  if (!request_id.empty()) {
    Stmt s(db_, "SELECT record FROM experiments WHERE request_id = ?");
    s.Bind(1, key);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (row) {
      ASSIGN_OR_RETURN(ExperimentRecord existing,
                       ParseRow<ExperimentRecord>(s, 0, "experiments"));
      if (!MessageDifferencer::Equals(existing.experiment().spec(),
                                      rec.experiment().spec())) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id \"", request_id, "\" was already used for ",
            existing.experiment().name(), " with a different spec"));
      }
      return ExperimentCreateResult{existing, false};
    }
  }
  {
    Stmt s(db_,
           "INSERT INTO experiments (request_id, state, record, tenant) VALUES (?, ?, x'', ?)");
    if (request_id.empty()) {
      s.BindNull(1);
    } else {
      s.Bind(1, key);
    }
    s.Bind(2, rec.experiment().state()).Bind(3, rec.experiment().tenant());
    RETURN_IF_ERROR(s.Run());
  }
  const int64_t id = sqlite3_last_insert_rowid(db_);
  rec.set_id(id);
  rec.mutable_experiment()->set_name(ExperimentName(id));
  rec.mutable_experiment()->set_last_event_sequence(1);
  first_event.set_experiment(rec.experiment().name());
  first_event.set_sequence(1);
  ExperimentMutation m{rec, {first_event}};
  RETURN_IF_ERROR(WriteExperimentLocked(m));
  return ExperimentCreateResult{rec, true};
}

absl::Status SqliteJobStore::WriteExperimentLocked(const ExperimentMutation& m) {
  {
    Stmt s(db_, "UPDATE experiments SET state = ?, record = ? WHERE id = ?");
    s.Bind(1, m.experiment.experiment().state())
        .BindBlob(2, m.experiment.SerializeAsString())
        .Bind(3, m.experiment.id());
    RETURN_IF_ERROR(s.Run());
    if (sqlite3_changes(db_) != 1) {
      return absl::NotFoundError(
          absl::StrCat(ExperimentName(m.experiment.id()), " not found"));
    }
  }
  int64_t last = 0;
  if (!m.events.empty()) {
    Stmt s(db_, "SELECT COALESCE(MAX(seq), 0) FROM experiment_events WHERE experiment_id = ?");
    s.Bind(1, m.experiment.id());
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (row) last = s.Int(0);
  }
  for (const auto& e : m.events) {
    if (e.sequence() != ++last) {
      return absl::InternalError(absl::StrCat("experiment event sequence gap for ",
                                              m.experiment.experiment().name(), ": got ",
                                              e.sequence(), ", expected ", last));
    }
    Stmt s(db_,
           "INSERT INTO experiment_events (experiment_id, seq, event) VALUES (?, ?, ?)");
    s.Bind(1, m.experiment.id()).Bind(2, e.sequence()).BindBlob(3, e.SerializeAsString());
    RETURN_IF_ERROR(s.Run());
  }
  return absl::OkStatus();
}

absl::Status SqliteJobStore::CommitExperiment(const ExperimentMutation& m) {
  return WriteBatched(
      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return WriteExperimentLocked(m); });
}

absl::StatusOr<ExperimentRecord> SqliteJobStore::GetExperiment(int64_t id) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT record FROM experiments WHERE id = ?");
  s.Bind(1, id);
  ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return absl::NotFoundError(absl::StrCat(ExperimentName(id), " not found"));
  return ParseRow<ExperimentRecord>(s, 0, "experiments");
}

absl::StatusOr<std::vector<ExperimentRecord>> SqliteJobStore::ListExperiments(
    int64_t before_id, int limit, const std::optional<std::string>& tenant) {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, tenant ? "SELECT record FROM experiments WHERE id < ?1 AND tenant = ?3 "
                       "ORDER BY id DESC LIMIT ?2"
                     : "SELECT record FROM experiments WHERE id < ?1 ORDER BY id DESC LIMIT ?2");
  s.Bind(1, before_id > 0 ? before_id : std::numeric_limits<int64_t>::max()).Bind(2, limit);
  if (tenant) s.Bind(3, *tenant);
  return ReadAll<ExperimentRecord>(s, "experiments");
}

absl::StatusOr<std::vector<ExperimentRecord>> SqliteJobStore::ListActiveExperiments() {
  absl::MutexLock lock(&mu_);
  Stmt s(db_, "SELECT record FROM experiments WHERE state = ? ORDER BY id");
  s.Bind(1, tally::v1::EXPERIMENT_STATE_RUNNING);
  return ReadAll<ExperimentRecord>(s, "experiments");
}

absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> SqliteJobStore::ListExperimentEvents(
    int64_t experiment_id, int64_t after_sequence, int limit) {
  absl::MutexLock lock(&mu_);
  {
    Stmt s(db_, "SELECT 1 FROM experiments WHERE id = ?");
    s.Bind(1, experiment_id);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) {
      return absl::NotFoundError(absl::StrCat(ExperimentName(experiment_id), " not found"));
    }
  }
  Stmt s(db_,
         "SELECT event FROM experiment_events WHERE experiment_id = ? AND seq > ? "
         "ORDER BY seq LIMIT ?");
  s.Bind(1, experiment_id).Bind(2, after_sequence).Bind(3, limit);
  return ReadAll<tally::v1::ExperimentEvent>(s, "experiment_events");
}

}  // namespace tally::store
