// FaultInjectionJobStore: a JobStore that forwards to another and fails on
// demand, the way LevelDB's FaultInjectionTestEnv fails file writes. Tests
// use it to prove that a state change whose commit fails changes nothing.
//
// Thread-safe (the switches are atomics; the base store is thread-safe).
#ifndef TALLY_TESTS_SUPPORT_STORE_FAULT_INJECTION_JOB_STORE_H_
#define TALLY_TESTS_SUPPORT_STORE_FAULT_INJECTION_JOB_STORE_H_

#include <atomic>

#include "server/store/job_store.h"

namespace tally::store {

#define RETURN_IF_FAILING_WRITE()                                         \
  do {                                                                    \
    if (fail_writes_) {                                                   \
      ++failed_writes_;                                                   \
      return absl::UnavailableError("injected fault: the store refused the write"); \
    }                                                                     \
    ++writes_;                                                            \
  } while (0)
#define RETURN_IF_FAILING_READ()                                          \
  do {                                                                    \
    if (fail_reads_) return absl::UnavailableError("injected fault: the store refused the read"); \
  } while (0)

class FaultInjectionJobStore final : public JobStore {
 public:
  // `base` must outlive this store.
  explicit FaultInjectionJobStore(JobStore* base) : base_(base) {}

  // While set, every write (CreateJob, Commit, PutWorker and the
  // experiment writes) fails with
  // UNAVAILABLE and writes nothing.
  void FailWrites(bool fail) { fail_writes_ = fail; }
  // While set, Commit and CommitExperiment (only) fail with UNAVAILABLE: a store that still
  // creates jobs and records workers but cannot commit a state change.
  void FailCommits(bool fail) {
    fail_commits_ = fail;
    commits_before_failing_ = -1;
  }
  // The next `n` commits go through, then Commit fails as with
  // FailCommits(true) until FailCommits(false): a change that fails half way
  // through a sequence of commits.
  void FailCommitsAfter(int n) { commits_before_failing_ = n; }
  // While set, every read fails with UNAVAILABLE.
  void FailReads(bool fail) { fail_reads_ = fail; }
  // Writes that reached the base store, and writes refused.
  int writes() const { return writes_; }
  int failed_writes() const { return failed_writes_; }

  absl::StatusOr<CreateResult> CreateJob(JobRecord job, tally::v1::JobEvent first) override {
    RETURN_IF_FAILING_WRITE();
    return base_->CreateJob(std::move(job), std::move(first));
  }
  absl::Status Commit(const Mutation& m) override {
    if (commits_before_failing_ >= 0 && commits_before_failing_-- == 0) fail_commits_ = true;
    if (fail_commits_) {
      ++failed_writes_;
      return absl::UnavailableError("injected fault: the store refused the commit");
    }
    RETURN_IF_FAILING_WRITE();
    return base_->Commit(m);
  }
  absl::StatusOr<std::vector<SpendRecord>> ListSpend(int64_t since_hour) override {
    RETURN_IF_FAILING_READ();
    return base_->ListSpend(since_hour);
  }
  absl::Status PutWorker(const WorkerRecord& w) override {
    RETURN_IF_FAILING_WRITE();
    return base_->PutWorker(w);
  }
  absl::StatusOr<JobRecord> GetJob(int64_t id) override {
    RETURN_IF_FAILING_READ();
    return base_->GetJob(id);
  }
  absl::StatusOr<std::vector<JobRecord>> ListJobs(const JobQuery& q) override {
    RETURN_IF_FAILING_READ();
    return base_->ListJobs(q);
  }
  absl::StatusOr<std::vector<JobRecord>> ListActiveJobs() override {
    RETURN_IF_FAILING_READ();
    return base_->ListActiveJobs();
  }
  absl::StatusOr<std::vector<tally::v1::JobEvent>> ListEvents(int64_t id, int64_t after,
                                                              int limit) override {
    RETURN_IF_FAILING_READ();
    return base_->ListEvents(id, after, limit);
  }
  absl::StatusOr<std::vector<AttemptRecord>> ListAttempts(int64_t id) override {
    RETURN_IF_FAILING_READ();
    return base_->ListAttempts(id);
  }
  absl::StatusOr<std::vector<tally::v1::Checkpoint>> ListCheckpoints(int64_t id) override {
    RETURN_IF_FAILING_READ();
    return base_->ListCheckpoints(id);
  }
  absl::StatusOr<std::vector<std::pair<tally::v1::JobState, int64_t>>> CountJobsByState()
      override {
    RETURN_IF_FAILING_READ();
    return base_->CountJobsByState();
  }
  absl::StatusOr<std::vector<WorkerRecord>> ListWorkers() override {
    RETURN_IF_FAILING_READ();
    return base_->ListWorkers();
  }
  absl::StatusOr<ExperimentCreateResult> CreateExperiment(
      ExperimentRecord e, tally::v1::ExperimentEvent first) override {
    RETURN_IF_FAILING_WRITE();
    return base_->CreateExperiment(std::move(e), std::move(first));
  }
  absl::Status CommitExperiment(const ExperimentMutation& m) override {
    if (fail_commits_) {
      ++failed_writes_;
      return absl::UnavailableError("injected fault: the store refused the commit");
    }
    RETURN_IF_FAILING_WRITE();
    return base_->CommitExperiment(m);
  }
  absl::StatusOr<ExperimentRecord> GetExperiment(int64_t id) override {
    RETURN_IF_FAILING_READ();
    return base_->GetExperiment(id);
  }
  absl::StatusOr<std::vector<ExperimentRecord>> ListExperiments(
      int64_t before, int limit, const std::optional<std::string>& tenant) override {
    RETURN_IF_FAILING_READ();
    return base_->ListExperiments(before, limit, tenant);
  }
  absl::StatusOr<std::vector<ExperimentRecord>> ListActiveExperiments() override {
    RETURN_IF_FAILING_READ();
    return base_->ListActiveExperiments();
  }
  absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> ListExperimentEvents(
      int64_t id, int64_t after, int limit) override {
    RETURN_IF_FAILING_READ();
    return base_->ListExperimentEvents(id, after, limit);
  }

 private:
  JobStore* const base_;
  std::atomic<bool> fail_writes_{false};
  std::atomic<bool> fail_reads_{false};
  std::atomic<bool> fail_commits_{false};
  std::atomic<int> commits_before_failing_{-1};  // -1: not counting
  std::atomic<int> writes_{0};
  std::atomic<int> failed_writes_{0};
};

#undef RETURN_IF_FAILING_WRITE
#undef RETURN_IF_FAILING_READ

}  // namespace tally::store

#endif  // TALLY_TESTS_SUPPORT_STORE_FAULT_INJECTION_JOB_STORE_H_
