// PostgresJobStore: job logs (schema version 2: job_logs, job_log_state).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_lines.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "google/protobuf/util/time_util.h"
#include "server/store/postgres_job_store.h"
#include "server/store/postgres_wire.h"

namespace tally::store {
namespace {

using pg::Bytes;
using pg::Int;
using pg::Result;

class PgLogTable final : public logs::LogTable {
 public:
  explicit PgLogTable(pg::Connection* conn) : conn_(conn) {}

  absl::StatusOr<logs::LogState> ReadState(int64_t job_id) override {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT last_seq, kept_bytes, dropped_bytes FROM "
                                           "job_log_state WHERE job_id = $1",
                                           {Int(job_id)}));
    logs::LogState state;
    if (r.rows() == 1) state = {r.Int(0, 0), r.Int(0, 1), r.Int(0, 2)};
    return state;
  }
  absl::Status WriteState(int64_t job_id, const logs::LogState& st) override {
    return conn_
        ->Exec("INSERT INTO job_log_state (job_id, last_seq, kept_bytes, dropped_bytes) "
               "VALUES ($1, $2, $3, $4) ON CONFLICT (job_id) DO UPDATE SET "
               "last_seq = EXCLUDED.last_seq, kept_bytes = EXCLUDED.kept_bytes, "
               "dropped_bytes = EXCLUDED.dropped_bytes",
               {Int(job_id), Int(st.last_sequence), Int(st.kept_bytes), Int(st.dropped_bytes)})
        .status();
  }
  absl::Status Insert(int64_t job_id, const std::vector<tally::v1::LogLine>& lines) override {
    for (const tally::v1::LogLine& l : lines) {
      const int64_t micros = google::protobuf::util::TimeUtil::TimestampToMicroseconds(l.time());
      RETURN_IF_ERROR(
          conn_
              ->Exec("INSERT INTO job_logs (job_id, seq, attempt, rank, time_us, cost, line) "
                     "VALUES ($1, $2, $3, $4, $5, $6, $7)",
                     {Int(job_id), Int(l.sequence()), Int(l.attempt()), Int(l.rank()),
                      Int(micros), Int(l.attempt() == 0 ? 0 : LogLineCost(l.text())),
                      Bytes(l.SerializeAsString())})
              .status());
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<logs::StoredLine>> Lines(int64_t job_id) override {
    ASSIGN_OR_RETURN(Result r, conn_->Exec("SELECT seq, cost FROM job_logs WHERE job_id = $1 "
                                           "AND attempt > 0 ORDER BY seq",
                                           {Int(job_id)}));
    std::vector<logs::StoredLine> out;
    for (int i = 0; i < r.rows(); ++i) out.push_back({r.Int(i, 0), r.Int(i, 1)});
    return out;
  }
  absl::Status DeleteThrough(int64_t job_id, int64_t sequence) override {
    return conn_->Exec("DELETE FROM job_logs WHERE job_id = $1 AND seq <= $2",
                       {Int(job_id), Int(sequence)})
        .status();
  }

 private:
  pg::Connection* conn_;
};

}  // namespace

absl::StatusOr<logs::AppendResult> PostgresJobStore::AppendJobLogs(
    int64_t job_id, std::vector<tally::v1::LogLine> lines, int64_t keep_bytes) {
  absl::StatusOr<logs::AppendResult> result;
  absl::Status s = RunInWrite([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // with mu_ held
    absl::StatusOr<Result> job = conn_->Exec("SELECT 1 FROM jobs WHERE id = $1", {Int(job_id)});
    if (!job.ok()) return job.status();
    if (job->rows() == 0) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
    PgLogTable table(conn_.get());
    result = logs::AppendLogs(table, job_id, std::move(lines), keep_bytes);
    return result.status();
  });
  if (!s.ok()) return s;
  return result;
}

absl::StatusOr<std::vector<tally::v1::LogLine>> PostgresJobStore::ListJobLogs(
    int64_t job_id, const LogQuery& q) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EnsureConnectedLocked());
  auto read = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS
      -> absl::StatusOr<std::vector<tally::v1::LogLine>> {
    ASSIGN_OR_RETURN(Result j, conn_->Exec("SELECT 1 FROM jobs WHERE id = $1", {Int(job_id)}));
    if (j.rows() == 0) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
    const bool tail = q.tail > 0;
    const std::string sql = absl::StrCat(
        "SELECT line FROM job_logs WHERE job_id = $1 AND seq > $2 "
        "AND ($3 = 0 OR attempt = $3 OR attempt = 0) AND ($4 < 0 OR rank = $4 OR attempt = 0) "
        "AND time_us >= $5 ORDER BY seq ",
        tail ? "DESC" : "ASC", " LIMIT $6");
    ASSIGN_OR_RETURN(Result r, conn_->Exec(sql.c_str(),
                                           {Int(job_id), Int(q.after_sequence), Int(q.attempt),
                                            Int(q.rank), Int(q.since_micros),
                                            Int(tail ? std::min(q.tail, q.limit) : q.limit)}));
    std::vector<tally::v1::LogLine> out;
    for (int i = 0; i < r.rows(); ++i) {
      tally::v1::LogLine line;
      if (!line.ParseFromString(r.Bytes(i, 0))) {
        return absl::DataLossError("corrupt record in job_logs");
      }
      out.push_back(std::move(line));
    }
    if (tail) std::reverse(out.begin(), out.end());
    return out;
  };
  auto result = read();
  NoteConnectionErrorLocked();
  return result;
}

}  // namespace tally::store
