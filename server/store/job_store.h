// JobStore: tallyd's durable state. Synchronous; every method is one
// transaction, so a crash leaves either all of a write or none of it.
// Implementations are thread-safe.
#ifndef TALLY_SERVER_STORE_JOB_STORE_H_
#define TALLY_SERVER_STORE_JOB_STORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/logs/log_retention.h"
#include "server/store/job_logs.h"
#include "server/store/write_health.h"
#include "tally/store/records.pb.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::store {

// Dollars a tenant spent in one hour (hours since the Unix epoch), added to
// what that hour already holds.
struct SpendRecord {
  std::string tenant;
  int64_t hour = 0;
  double usd = 0;
};

// Everything one state change writes, applied atomically by Commit().
struct Mutation {
  std::optional<JobRecord> job;                  // replaces the stored job
  std::vector<tally::v1::JobEvent> events;       // appended; sequences given
  std::vector<AttemptRecord> attempts;           // inserted or replaced
  std::vector<tally::v1::Checkpoint> checkpoints;  // appended
  std::vector<SpendRecord> spend;                // added to the tenant's hour
};

struct CreateResult {
  JobRecord job;
  bool created = false;  // false: request_id matched an existing job
};

struct ExperimentCreateResult {
  ExperimentRecord experiment;
  bool created = false;  // false: request_id matched an existing experiment
};

// Everything one experiment change writes, applied atomically.
struct ExperimentMutation {
  ExperimentRecord experiment;                       // replaces the stored one
  std::vector<tally::v1::ExperimentEvent> events;    // appended; sequences given
};

struct JobQuery {
  std::vector<tally::v1::JobState> states;  // empty: all states
  std::optional<std::string> tenant;        // only this tenant's; unset: every tenant's
  int64_t before_id = 0;                    // 0: from the newest
  int limit = 50;
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Whether writes are being refused (write_health.h); null for a store
  // that does not track it (memory). Owned by the store.
  virtual const WriteHealth* write_health() const { return nullptr; }
  // One small write that changes nothing, recorded in write_health(): how
  // tallyd finds out that a store refusing writes takes them again.
  // UNIMPLEMENTED where write_health() is null.
  virtual absl::Status ProbeWrite() {
    return absl::UnimplementedError("this store does not probe writes");
  }

  // Assigns the job an id and name, stores it with its first event (whose
  // sequence is set to 1). With a non-empty request_id already used by the
  // same tenant (request ids are per tenant), returns that job and
  // created=false if the specs are equal, else ALREADY_EXISTS.
  virtual absl::StatusOr<CreateResult> CreateJob(
      JobRecord job, tally::v1::JobEvent first_event) = 0;

  // Applies a mutation in one transaction. Events must carry the sequences
  // that follow the job's last one (the caller owns last_event_sequence).
  virtual absl::Status Commit(const Mutation& mutation) = 0;

  virtual absl::StatusOr<JobRecord> GetJob(int64_t id) = 0;
  // Newest first.
  virtual absl::StatusOr<std::vector<JobRecord>> ListJobs(
      const JobQuery& query) = 0;
  // Every job not in a terminal state, oldest first (start-up recovery).
  virtual absl::StatusOr<std::vector<JobRecord>> ListActiveJobs() = 0;
  // Events with sequence > after_sequence, in order, at most `limit`.
  virtual absl::StatusOr<std::vector<tally::v1::JobEvent>> ListEvents(
      int64_t job_id, int64_t after_sequence, int limit) = 0;
  virtual absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(
      int64_t job_id) = 0;
  virtual absl::StatusOr<std::vector<tally::v1::Checkpoint>> ListCheckpoints(
      int64_t job_id) = 0;
  // Counts of jobs per state.
  virtual absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>>
  CountJobsByState() = 0;

  // Every tenant's spend in hours >= since_hour, by tenant and hour.
  virtual absl::StatusOr<std::vector<SpendRecord>> ListSpend(int64_t since_hour) = 0;

  virtual absl::Status PutWorker(const WorkerRecord& worker) = 0;
  virtual absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() = 0;

  // --- Experiments (experiments/{id}), in the same database and
  // transactions as jobs.

  // Assigns an id and name and stores the experiment with its first event
  // (sequence 1). A non-empty request_id already used returns that
  // experiment and created=false if the specs are equal, else ALREADY_EXISTS.
  virtual absl::StatusOr<ExperimentCreateResult> CreateExperiment(
      ExperimentRecord experiment, tally::v1::ExperimentEvent first_event) = 0;
  virtual absl::Status CommitExperiment(const ExperimentMutation& mutation) = 0;
  virtual absl::StatusOr<ExperimentRecord> GetExperiment(int64_t id) = 0;
  // Newest first, ids below before_id (0: from the newest), at most limit;
  // with `tenant`, only that tenant's.
  virtual absl::StatusOr<std::vector<ExperimentRecord>> ListExperiments(
      int64_t before_id, int limit, const std::optional<std::string>& tenant) = 0;
  // Every experiment still RUNNING, oldest first.
  virtual absl::StatusOr<std::vector<ExperimentRecord>> ListActiveExperiments() = 0;
  virtual absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> ListExperimentEvents(
      int64_t experiment_id, int64_t after_sequence, int limit) = 0;

  // --- Job logs, in the same database. In one transaction: `lines` get the
  // job's next sequences and are stored, and the oldest lines over
  // keep_bytes are dropped for a marker (logs::AppendLogs).
  virtual absl::StatusOr<logs::AppendResult> AppendJobLogs(
      int64_t job_id, std::vector<tally::v1::LogLine> lines, int64_t keep_bytes) {
    return absl::UnimplementedError("this store keeps no job logs");
  }
  virtual absl::StatusOr<std::vector<tally::v1::LogLine>> ListJobLogs(
      int64_t job_id, const LogQuery& query) {
    return absl::UnimplementedError("this store keeps no job logs");
  }
};

bool IsTerminal(tally::v1::JobState state);

// The key a request_id is unique under: request ids are per tenant, so one
// tenant's id neither finds nor blocks another's. Empty for no request_id.
std::string RequestKey(const std::string& tenant, const std::string& request_id);

}  // namespace tally::store

#endif  // TALLY_SERVER_STORE_JOB_STORE_H_
