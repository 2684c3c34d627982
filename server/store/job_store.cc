#include "server/store/job_store.h"

namespace tally::store {

bool IsTerminal(tally::v1::JobState state) {
  switch (state) {
    case tally::v1::JOB_STATE_SUCCEEDED:
    case tally::v1::JOB_STATE_EARLY_STOPPED:
    case tally::v1::JOB_STATE_BUDGET_EXHAUSTED:
    case tally::v1::JOB_STATE_CANCELLED:
    case tally::v1::JOB_STATE_FAILED:
      return true;
    default:
      return false;
  }
}

namespace {
absl::Status NoExperiments() {
  return absl::UnimplementedError("this store does not keep experiments");
}
}  // namespace

absl::StatusOr<ExperimentCreateResult> JobStore::CreateExperiment(
    ExperimentRecord, tally::v1::ExperimentEvent) {
  return NoExperiments();
}
absl::Status JobStore::CommitExperiment(const ExperimentMutation&) {
  return NoExperiments();
}
absl::StatusOr<ExperimentRecord> JobStore::GetExperiment(int64_t) {
  return NoExperiments();
}
absl::StatusOr<std::vector<ExperimentRecord>> JobStore::ListExperiments(int64_t, int) {
  return NoExperiments();
}
absl::StatusOr<std::vector<ExperimentRecord>> JobStore::ListActiveExperiments() {
  return NoExperiments();
}
absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> JobStore::ListExperimentEvents(
    int64_t, int64_t, int) {
  return NoExperiments();
}

}  // namespace tally::store
