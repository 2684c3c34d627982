#include "server/api/priority_caps.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/experiment_spec.h"
#include "common/text.h"

namespace tally::api {

void PriorityCaps::Set(config::TenancyPolicy policy) {
  absl::MutexLock lock(&mu_);
  policy_ = std::move(policy);
}

absl::Status PriorityCaps::CheckJob(const auth::Principal& caller,
                                    const tally::v1::JobSpec& spec) const {
  if (caller.method == "anonymous") return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return policy_.CheckPriority(caller.tenant, spec.priority());
}

absl::Status PriorityCaps::CheckExperiment(const auth::Principal& caller,
                                           const tally::v1::ExperimentSpec& spec) const {
  if (caller.method == "anonymous") return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  if (absl::Status s =
          policy_.CheckPriority(caller.tenant, spec.base().priority(), "spec.base.priority");
      !s.ok()) {
    return s;
  }
  for (int i = 0; i < spec.variants_size(); ++i) {
    // The base with the variant's overrides; one that does not merge is
    // refused later, by the experiment's own validation.
    tally::v1::JobSpec resolved = spec.base();
    if (!MergeOverrides(spec.variants(i).overrides(), &resolved).ok()) continue;
    if (absl::Status s = policy_.CheckPriority(
            caller.tenant, resolved.priority(),
            absl::StrCat("spec.variants[", i, "] (", EscapeUnprintable(spec.variants(i).name()),
                         ").priority"));
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace tally::api
