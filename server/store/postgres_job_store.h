// PostgresJobStore: a JobStore in PostgreSQL (libpq), for running tallyd as a
// leader with standbys over one shared database. Records are stored as
// serialized protos (BYTEA) beside the indexed columns queries need, like
// SqliteJobStore. The schema is versioned (table tally_schema) and migrated
// forward on Open under pg_advisory_xact_lock, so two tallyds starting
// together migrate once; a database from a newer tallyd is refused.
//
// Every public method is one transaction; a write is acknowledged only after
// its COMMIT succeeded. Concurrent writes (CreateJob, Commit, PutWorker and
// the experiment writes) are batched into one transaction and one WAL flush
// (group commit): each caller's write runs under its own SAVEPOINT, so one
// caller's error (ALREADY_EXISTS, say) does not fail the others, and each
// caller returns only after the COMMIT holding its write. If the transaction
// as a whole fails, every caller in it gets that error and nothing of the
// batch is stored.
//
// Connection loss: a call that cannot reach the server returns UNAVAILABLE
// naming it; a later call reconnects (attempts spaced 100 ms doubling to 5 s;
// no call blocks on connecting for more than about 2 s). A COMMIT whose result
// was lost leaves the outcome unknown: the call returns UNAVAILABLE and
// MustRestart() turns true.
//
// Fencing: after SetFencingEpoch(e), every write transaction first reads the
// lease row under FOR SHARE and rolls back with UNAVAILABLE if its epoch is
// no longer e (another tallyd took over); MustRestart() then turns true.
//
// Thread-safe: one connection, used under a mutex; reads wait for a running
// batch's COMMIT.
#ifndef TALLY_SERVER_STORE_POSTGRES_JOB_STORE_H_
#define TALLY_SERVER_STORE_POSTGRES_JOB_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/store/job_store.h"

namespace tally::store {
namespace pg {
class Connection;  // postgres_wire.h
}  // namespace pg

class PostgresJobStore final : public JobStore {
 public:
  // The schema version this build writes.
  static constexpr int kSchemaVersion = 2;

  // Connects to `dsn` (a libpq connection string or URI) and migrates the
  // schema. FAILED_PRECONDITION for a schema newer than this build;
  // UNAVAILABLE if the server cannot be reached.
  // `clock` (not owned; null: the real one) times the reconnect backoff.
  static absl::StatusOr<std::unique_ptr<PostgresJobStore>> Open(const std::string& dsn,
                                                               const Clock* clock = nullptr);
  ~PostgresJobStore() override;

  absl::StatusOr<int> SchemaVersion();

  // From now on every write transaction first runs
  //   SELECT epoch FROM tally_lease WHERE id = 1 FOR SHARE
  // and, if the epoch differs from `epoch`, rolls back and returns
  // UNAVAILABLE ("this tallyd is no longer the leader ...").
  void SetFencingEpoch(int64_t epoch);
  // True once a write was refused for a newer lease epoch, or a COMMIT's
  // outcome is unknown (connection lost after COMMIT was sent): tallyd must
  // then exit and recover from the store.
  bool MustRestart() const;

  // Turns batching of concurrent writes on (the default) or off; off, each
  // write is its own transaction (for comparison benchmarks).
  void SetGroupCommit(bool enabled);

  struct WriteStats {
    int64_t num_writes = 0;        // writes run (committed or not)
    int64_t num_transactions = 0;  // write transactions that reached COMMIT
    int64_t num_queued = 0;        // writes waiting for a transaction now
  };
  WriteStats GetWriteStats();

  absl::StatusOr<CreateResult> CreateJob(JobRecord job, tally::v1::JobEvent first_event) override;
  absl::Status Commit(const Mutation& mutation) override;
  absl::StatusOr<std::vector<SpendRecord>> ListSpend(int64_t since_hour) override;
  absl::StatusOr<JobRecord> GetJob(int64_t id) override;
  absl::StatusOr<std::vector<JobRecord>> ListJobs(const JobQuery& query) override;
  absl::StatusOr<std::vector<JobRecord>> ListActiveJobs() override;
  absl::StatusOr<std::vector<tally::v1::JobEvent>> ListEvents(int64_t job_id,
                                                              int64_t after_sequence,
                                                              int limit) override;
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t job_id) override;
  absl::StatusOr<std::vector<tally::v1::Checkpoint>> ListCheckpoints(int64_t job_id) override;
  absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>> CountJobsByState() override;
  absl::Status PutWorker(const WorkerRecord& worker) override;
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() override;
  absl::StatusOr<ExperimentCreateResult> CreateExperiment(
      ExperimentRecord experiment, tally::v1::ExperimentEvent first_event) override;
  absl::Status CommitExperiment(const ExperimentMutation& mutation) override;
  absl::StatusOr<ExperimentRecord> GetExperiment(int64_t id) override;
  absl::StatusOr<std::vector<ExperimentRecord>> ListExperiments(
      int64_t before_id, int limit, const std::optional<std::string>& tenant) override;
  absl::StatusOr<std::vector<ExperimentRecord>> ListActiveExperiments() override;
  absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> ListExperimentEvents(
      int64_t experiment_id, int64_t after_sequence, int limit) override;
  // Job logs (postgres_job_logs.cc): an append is a queued write like the
  // others, fenced by the lease.
  absl::StatusOr<logs::AppendResult> AppendJobLogs(int64_t job_id,
                                                   std::vector<tally::v1::LogLine> lines,
                                                   int64_t keep_bytes) override;
  absl::StatusOr<std::vector<tally::v1::LogLine>> ListJobLogs(int64_t job_id,
                                                              const LogQuery& query) override;

 private:
  struct Write;

  PostgresJobStore(std::string dsn, const Clock* clock);
  // Connects if there is no usable connection, respecting the backoff.
  absl::Status EnsureConnectedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops the connection after an error that means it is gone.
  void NoteConnectionErrorLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RollbackLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status MigrateLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status NewerSchemaError(int64_t version) const;
  absl::Status StoppedWritingError() const;
  // Queues `w`, then runs it (with whatever else is queued) in one
  // transaction, or waits for the caller who does.
  void RunWrite(Write* w) ABSL_LOCKS_EXCLUDED(mu_, queue_mu_);
  // `run` as a queued write: with mu_ held, in its batch's transaction.
  absl::Status RunInWrite(std::function<absl::Status()> run) ABSL_LOCKS_EXCLUDED(mu_, queue_mu_);
  // Runs `batch` in one transaction; true if it reached COMMIT.
  bool RunBatchLocked(std::vector<Write*>& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckFenceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ApplyWriteLocked(Write* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteMutationLocked(const Mutation& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteExperimentLocked(const ExperimentMutation& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CreateResult> CreateJobLocked(JobRecord job, tally::v1::JobEvent first_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ExperimentCreateResult> CreateExperimentLocked(
      ExperimentRecord rec, tally::v1::ExperimentEvent first_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `fn` as one read transaction (connecting first if needed).
  template <typename Fn>
  auto ReadTx(Fn fn) -> decltype(fn());

  const std::string dsn_;
  const std::string server_name_;  // "PostgreSQL at host:port/dbname", for messages

  absl::Mutex mu_;  // the connection; held for a whole transaction
  std::unique_ptr<pg::Connection> conn_ ABSL_GUARDED_BY(mu_);
  const Clock* const clock_;
  absl::Time next_connect_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_);
  std::string last_connect_error_ ABSL_GUARDED_BY(mu_);
  bool opened_ ABSL_GUARDED_BY(mu_) = false;  // migrated once

  // Writes waiting for a transaction. Never held while waiting for mu_.
  // The most writes one group-commit transaction holds.
  static constexpr size_t kMaxBatch = 512;
  absl::Mutex queue_mu_;
  std::deque<Write*> queue_ ABSL_GUARDED_BY(queue_mu_);
  bool writer_active_ ABSL_GUARDED_BY(queue_mu_) = false;  // a batch is running
  int64_t num_writes_ ABSL_GUARDED_BY(queue_mu_) = 0;
  int64_t num_transactions_ ABSL_GUARDED_BY(queue_mu_) = 0;

  std::atomic<int64_t> fencing_epoch_{-1};  // -1: no fencing
  std::atomic<bool> must_restart_{false};
  std::atomic<bool> group_commit_{true};
};

}  // namespace tally::store

#endif  // TALLY_SERVER_STORE_POSTGRES_JOB_STORE_H_
