// SqliteJobStore: job logs (schema version 6: job_logs, job_log_state).
#include <sqlite3.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_lines.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "server/store/sqlite_job_store.h"

namespace tally::store {
namespace {

// A prepared statement with 1-based binds.
class LogStmt {
 public:
  LogStmt(sqlite3* db, const char* sql) : db_(db) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) {
      status_ = Error("prepare");
    }
  }
  ~LogStmt() { sqlite3_finalize(stmt_); }
  LogStmt(const LogStmt&) = delete;
  LogStmt& operator=(const LogStmt&) = delete;

  LogStmt& Bind(int i, int64_t v) {
    if (stmt_) sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  LogStmt& BindBlob(int i, const std::string& v) {
    if (stmt_) sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  absl::StatusOr<bool> Step() {
    if (!status_.ok()) return status_;
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return Error("step");
  }
  absl::Status Run() { return Step().status(); }
  void Reset() {
    if (stmt_) sqlite3_reset(stmt_);
  }
  int64_t Int(int col) { return sqlite3_column_int64(stmt_, col); }
  std::string Blob(int col) {
    const void* p = sqlite3_column_blob(stmt_, col);
    return std::string(static_cast<const char*>(p), sqlite3_column_bytes(stmt_, col));
  }

 private:
  absl::Status Error(absl::string_view what) {
    return absl::InternalError(absl::StrCat("sqlite job_logs ", what, ": ", sqlite3_errmsg(db_)));
  }
  sqlite3* db_;
  sqlite3_stmt* stmt_ = nullptr;
  absl::Status status_;
};

int64_t Micros(const google::protobuf::Timestamp& t) {
  return google::protobuf::util::TimeUtil::TimestampToMicroseconds(t);
}

class SqliteLogTable final : public logs::LogTable {
 public:
  explicit SqliteLogTable(sqlite3* db) : db_(db) {}

  absl::StatusOr<logs::LogState> ReadState(int64_t job_id) override {
    LogStmt s(db_, "SELECT last_seq, kept_bytes, dropped_bytes FROM job_log_state WHERE job_id = ?");
    s.Bind(1, job_id);
    logs::LogState state;
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (row) state = {s.Int(0), s.Int(1), s.Int(2)};
    return state;
  }
  absl::Status WriteState(int64_t job_id, const logs::LogState& st) override {
    LogStmt s(db_,
              "INSERT OR REPLACE INTO job_log_state (job_id, last_seq, kept_bytes, dropped_bytes) "
              "VALUES (?, ?, ?, ?)");
    s.Bind(1, job_id).Bind(2, st.last_sequence).Bind(3, st.kept_bytes).Bind(4, st.dropped_bytes);
    return s.Run();
  }
  absl::Status Insert(int64_t job_id, const std::vector<tally::v1::LogLine>& lines) override {
    LogStmt s(db_,
              "INSERT INTO job_logs (job_id, seq, attempt, rank, time_us, cost, line) "
              "VALUES (?, ?, ?, ?, ?, ?, ?)");
    for (const tally::v1::LogLine& l : lines) {
      // Markers tallyd writes for the whole job (attempt 0) cost nothing.
      s.Bind(1, job_id).Bind(2, l.sequence()).Bind(3, l.attempt()).Bind(4, l.rank());
      s.Bind(5, Micros(l.time())).Bind(6, l.attempt() == 0 ? 0 : LogLineCost(l.text()));
      s.BindBlob(7, l.SerializeAsString());
      RETURN_IF_ERROR(s.Run());
      s.Reset();
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<logs::StoredLine>> Lines(int64_t job_id) override {
    LogStmt s(db_, "SELECT seq, cost FROM job_logs WHERE job_id = ? AND attempt > 0 ORDER BY seq");
    s.Bind(1, job_id);
    std::vector<logs::StoredLine> out;
    while (true) {
      ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) return out;
      out.push_back({s.Int(0), s.Int(1)});
    }
  }
  absl::Status DeleteThrough(int64_t job_id, int64_t sequence) override {
    LogStmt s(db_, "DELETE FROM job_logs WHERE job_id = ? AND seq <= ?");
    s.Bind(1, job_id).Bind(2, sequence);
    return s.Run();
  }

 private:
  sqlite3* db_;
};

}  // namespace

absl::StatusOr<logs::AppendResult> SqliteJobStore::AppendJobLogs(
    int64_t job_id, std::vector<tally::v1::LogLine> lines, int64_t keep_bytes) {
  absl::StatusOr<logs::AppendResult> result;
  absl::Status s = WriteBatched([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    LogStmt job(db_, "SELECT 1 FROM jobs WHERE id = ?");
    job.Bind(1, job_id);
    absl::StatusOr<bool> row = job.Step();
    if (!row.ok()) return row.status();
    if (!*row) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
    SqliteLogTable table(db_);
    result = logs::AppendLogs(table, job_id, std::move(lines), keep_bytes);
    return result.status();
  });
  if (!s.ok()) return s;
  return result;
}

absl::StatusOr<std::vector<tally::v1::LogLine>> SqliteJobStore::ListJobLogs(
    int64_t job_id, const LogQuery& q) {
  absl::MutexLock lock(&mu_);
  {
    LogStmt s(db_, "SELECT 1 FROM jobs WHERE id = ?");
    s.Bind(1, job_id);
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
  }
  const bool tail = q.tail > 0;
  const std::string sql = absl::StrCat(
      "SELECT line FROM job_logs WHERE job_id = ?1 AND seq > ?2 "
      "AND (?3 = 0 OR attempt = ?3 OR attempt = 0) AND (?4 < 0 OR rank = ?4 OR attempt = 0) "
      "AND time_us >= ?5 ORDER BY seq ",
      tail ? "DESC" : "ASC", " LIMIT ?6");
  LogStmt s(db_, sql.c_str());
  s.Bind(1, job_id).Bind(2, q.after_sequence).Bind(3, q.attempt).Bind(4, q.rank);
  s.Bind(5, q.since_micros).Bind(6, tail ? std::min(q.tail, q.limit) : q.limit);
  std::vector<tally::v1::LogLine> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    tally::v1::LogLine line;
    if (!line.ParseFromString(s.Blob(0))) {
      return absl::DataLossError("corrupt record in job_logs");
    }
    out.push_back(std::move(line));
  }
  if (tail) std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace tally::store
