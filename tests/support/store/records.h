// Records the store tests write: a queued job and its "submitted" event.
#ifndef TALLY_TESTS_SUPPORT_STORE_RECORDS_H_
#define TALLY_TESTS_SUPPORT_STORE_RECORDS_H_

#include <string>

#include "server/store/job_store.h"

namespace tally::store::testing {

inline JobRecord NewJob(const std::string& request_id = "", int layers = 2,
                        const std::string& tenant = "") {
  JobRecord r;
  r.mutable_job()->set_state(tally::v1::JOB_STATE_QUEUED);
  r.mutable_job()->set_request_id(request_id);
  r.mutable_job()->set_tenant(tenant);
  r.mutable_job()->mutable_spec()->mutable_model()->set_num_layers(layers);
  r.mutable_job()->mutable_create_time()->set_seconds(1000);
  return r;
}

inline tally::v1::JobEvent Submitted() {
  tally::v1::JobEvent e;
  e.set_type("submitted");
  e.set_state(tally::v1::JOB_STATE_QUEUED);
  return e;
}

}  // namespace tally::store::testing

#endif  // TALLY_TESTS_SUPPORT_STORE_RECORDS_H_
