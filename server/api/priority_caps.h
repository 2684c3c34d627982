// PriorityCaps: the priority a caller's jobs may have (tallyd's --config
// tenancy section, config/tenancy.h), checked at SubmitJob and
// CreateExperiment. Set replaces the policy (SIGHUP).
//
// Thread-safe.
#ifndef TALLY_SERVER_API_PRIORITY_CAPS_H_
#define TALLY_SERVER_API_PRIORITY_CAPS_H_

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/auth/principal.h"
#include "server/config/tenancy.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::api {

class PriorityCaps {
 public:
  explicit PriorityCaps(config::TenancyPolicy policy = {}) : policy_(std::move(policy)) {}

  void Set(config::TenancyPolicy policy);

  // OK when `caller` may submit `spec`: its priority at most the cap of the
  // caller's tenant (the job's tenant). A global admin (tenant "") and the
  // anonymous admin are not capped. INVALID_ARGUMENT naming spec.priority
  // and the cap otherwise.
  absl::Status CheckJob(const auth::Principal& caller, const tally::v1::JobSpec& spec) const;
  // Every variant as it resolves (base plus overrides); the error names the
  // variant ("spec.variants[1] (fast).priority").
  absl::Status CheckExperiment(const auth::Principal& caller,
                               const tally::v1::ExperimentSpec& spec) const;

 private:
  mutable absl::Mutex mu_;
  config::TenancyPolicy policy_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_PRIORITY_CAPS_H_
