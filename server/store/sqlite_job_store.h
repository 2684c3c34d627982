// SqliteJobStore: the default JobStore, one SQLite file in WAL mode with
// synchronous=FULL, so a job acknowledged to a client survives kill -9 and
// power loss. Records are stored as serialized protos beside the indexed
// columns queries need. The schema is versioned (PRAGMA user_version) and
// migrated forward on Open; a file from a newer tallyd is refused.
#ifndef TALLY_SERVER_STORE_SQLITE_JOB_STORE_H_
#define TALLY_SERVER_STORE_SQLITE_JOB_STORE_H_

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
  static constexpr int kSchemaVersion = 5;

  // Opens (creating if needed) and migrates the database at `path`.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> Open(
      const std::string& path);
  // For migration tests: opens `path` and migrates it only up to `version`.
  static absl::StatusOr<std::unique_ptr<SqliteJobStore>> OpenAtVersion(
      const std::string& path, int version);
  ~SqliteJobStore() override;

  absl::StatusOr<int> SchemaVersion();

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

 private:
  explicit SqliteJobStore(sqlite3* db) : db_(db) {}
  absl::Status Migrate(int target_version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteMutationLocked(const Mutation& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteExperimentLocked(const ExperimentMutation& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::store

#endif  // TALLY_SERVER_STORE_SQLITE_JOB_STORE_H_
