// SqliteJobStore: the default JobStore, one SQLite file in WAL mode with
// synchronous=FULL, so a job acknowledged to a client survives kill -9 and
// power loss. Records are stored as serialized protos beside the indexed
// columns queries need. The schema is versioned (PRAGMA user_version) and
// migrated forward on Open; a file from a newer tallyd is refused.
//
// Group commit. Every write (CreateJob, Commit, PutWorker and the experiment
// writes) joins a queue. The writer at the front of the queue commits every
// write queued so far in one transaction, so one fsync covers them all,
// while the writers behind it wait; the others are woken with their results
// only after that COMMIT returns, so no caller hears of a write before it is
// durable. In a batch of several, each write runs in its own SAVEPOINT: one
// that fails (a request_id reused with another spec, a missing job) is
// rolled back alone and fails alone. A failed BEGIN or COMMIT fails every
// write of its batch, and none of them is stored. A lone write is the same
// one transaction as before.
//
// Thread-safe. Reads share the write lock and wait for a batch's COMMIT.
#ifndef TALLY_SERVER_STORE_SQLITE_JOB_STORE_H_
#define TALLY_SERVER_STORE_SQLITE_JOB_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"

struct sqlite3;

namespace tally::store {

class SqliteJobStore final : public JobStore {
 public:
  // The schema version this build writes.
  static constexpr int kSchemaVersion = 6;

  // Opens (creating if needed) and migrates the database at `path`.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(
      const std::string& path);
  // For migration tests: opens `path` and migrates it only up to `version`.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> OpenAtVersion(
      const std::string& path, int version);
  ~SqliteJobStore() override;

  absl::StatusOr<int> SchemaVersion();

  // What the write queue has done since Open: transactions committed (or
  // failed) and the writes they held.
  struct BatchStats {
    int64_t batches = 0;
    int64_t writes = 0;
  };
  BatchStats batch_stats() const;
  // Writes queued and not yet answered, the batch being committed included.
  int NumQueuedWrites() const;
  // For tests: `hook` runs as each transaction commits, with the write lock
  // held (it may block to let writes queue up behind a batch); returning
  // false turns that COMMIT into a rollback, failing its whole batch. Null
  // removes it.
  void SetCommitHookForTesting(std::function<bool()> hook);

  // Every batch's outcome is recorded; ProbeWrite rewrites the schema
  // version (PRAGMA user_version) in a transaction of its own, which needs
  // the disk to take a page.
  const WriteHealth* write_health() const override { return &write_health_; }
  absl::Status ProbeWrite() override;

  absl::StatusOr<CreateResult> CreateJob(JobRecord job,
                                         tally::v1::JobEvent first_event) override;
  absl::Status Commit(const Mutation& mutation) override;
  absl::StatusOr<std::vector<SpendRecord>> ListSpend(int64_t since_hour) override;
  absl::StatusOr<JobRecord> GetJob(int64_t id) override;
  absl::StatusOr<std::vector<JobRecord>> ListJobs(const JobQuery& query) override;
  absl::StatusOr<std::vector<JobRecord>> ListActiveJobs() override;
  absl::StatusOr<std::vector<tally::v1::JobEvent>> ListEvents(
      int64_t job_id, int64_t after_sequence, int limit) override;
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t job_id) override;
  absl::StatusOr<std::vector<tally::v1::Checkpoint>> ListCheckpoints(
      int64_t job_id) override;
  absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>>
  CountJobsByState() override;
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
  // Job logs (sqlite_job_logs.cc): an append is a write in the group-commit
  // queue like any other.
  absl::StatusOr<logs::AppendResult> AppendJobLogs(int64_t job_id,
                                                   std::vector<tally::v1::LogLine> lines,
                                                   int64_t keep_bytes) override;
  absl::StatusOr<std::vector<tally::v1::LogLine>> ListJobLogs(int64_t job_id,
                                                              const LogQuery& query) override;

 private:
  // One write in the queue. `write` runs in its batch's transaction with
  // mu_ held; `status` is final once `done` (set under queue_mu_).
  struct PendingWrite {
    std::function<absl::Status()> write;
    absl::Status status;
    bool done = false;
  };
  // The most writes one transaction commits, so that a long queue does not
  // make its first writers wait for all of it.
  static constexpr int kMaxBatch = 512;

  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  // Queues `write` and returns its outcome once the batch holding it has
  // committed (or failed).
  absl::Status WriteBatched(std::function<absl::Status()> write)
      ABSL_LOCKS_EXCLUDED(queue_mu_, mu_);
  // Runs `batch` in one transaction and sets every write's status.
  void CommitBatch(const std::vector<PendingWrite*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<CreateResult> CreateJobLocked(JobRecord job,
                                               tally::v1::JobEvent first_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<ExperimentCreateResult> CreateExperimentLocked(
      ExperimentRecord experiment, tally::v1::ExperimentEvent first_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Migrate(int target_version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteMutationLocked(const Mutation& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteExperimentLocked(const ExperimentMutation& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Lock order: queue_mu_ is never held while taking mu_.
  mutable absl::Mutex queue_mu_;
  std::deque<PendingWrite*> queue_ ABSL_GUARDED_BY(queue_mu_);
  BatchStats stats_ ABSL_GUARDED_BY(queue_mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
  std::function<bool()> commit_hook_ ABSL_GUARDED_BY(mu_);
  WriteHealth write_health_;
};

}  // namespace tally::store

#endif  // TALLY_SERVER_STORE_SQLITE_JOB_STORE_H_
