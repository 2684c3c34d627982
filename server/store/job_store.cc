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

}  // namespace tally::store
