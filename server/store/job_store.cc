#include "server/store/job_store.h"

#include "absl/strings/str_cat.h"

namespace tally::store {

std::string RequestKey(const std::string& tenant, const std::string& request_id) {
  // Request ids carry no control characters (Submit refuses them), so the
  // separator cannot be forged.
  if (request_id.empty() || tenant.empty()) return request_id;
  return absl::StrCat(tenant, "\x1f", request_id);
}

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
absl::StatusOr<std::vector<SpendRecord>> JobStore::ListSpend(int64_t) {
  return absl::UnimplementedError("this store keeps no tenant spend");
}
absl::StatusOr<ExperimentRecord> JobStore::GetExperiment(int64_t) {
  return NoExperiments();
}
absl::StatusOr<std::vector<ExperimentRecord>> JobStore::ListExperiments(int64_t, int,
                                                                       const std::optional<std::string>&) {
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
