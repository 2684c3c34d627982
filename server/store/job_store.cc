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

}  // namespace tally::store
