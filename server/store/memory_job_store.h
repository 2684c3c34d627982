// InMemoryJobStore: a complete JobStore that keeps everything in memory. For
// tests and `tallyd --store=memory`; nothing survives the process.
#ifndef TALLY_SERVER_STORE_MEMORY_JOB_STORE_H_
#define TALLY_SERVER_STORE_MEMORY_JOB_STORE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/store/job_store.h"

namespace tally::store {

class InMemoryJobStore final : public JobStore {
 public:
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
  // memory_job_logs.cc
  absl::StatusOr<logs::AppendResult> AppendJobLogs(int64_t job_id,
                                                   std::vector<tally::v1::LogLine> lines,
                                                   int64_t keep_bytes) override;
  absl::StatusOr<std::vector<tally::v1::LogLine>> ListJobLogs(int64_t job_id,
                                                              const LogQuery& query) override;

 private:
  struct Entry {
    JobRecord job;
    std::vector<tally::v1::JobEvent> events;
    std::map<int32_t, AttemptRecord> attempts;
    std::vector<tally::v1::Checkpoint> checkpoints;
  };
  absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, Entry> jobs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> by_request_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int64_t>, double> spend_ ABSL_GUARDED_BY(mu_);
  struct ExperimentEntry {
    ExperimentRecord record;
    std::vector<tally::v1::ExperimentEvent> events;
  };
  int64_t next_experiment_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<int64_t, ExperimentEntry> experiments_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> experiment_by_request_id_ ABSL_GUARDED_BY(mu_);
  struct LogEntry {
    logs::LogState state;
    std::map<int64_t, tally::v1::LogLine> lines;  // by sequence
  };
  std::map<int64_t, LogEntry> logs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::store

#endif  // TALLY_SERVER_STORE_MEMORY_JOB_STORE_H_
