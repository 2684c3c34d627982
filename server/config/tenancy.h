// The `tenancy` section of tallyd's --config: how far one tenant's jobs may
// reach over another's.
//
//   tenancy:
//     max_priority: 100                  # every tenant's cap (default 100)
//     tenant_max_priority: {research: 500, batch: 10}
//     cross_tenant_preemption: false     # default false
//
// - A job's spec.priority may be at most its tenant's cap (the tenant's entry
//   in tenant_max_priority, else max_priority); a higher one is refused at
//   SubmitJob and CreateExperiment (every variant) with INVALID_ARGUMENT
//   naming spec.priority and the cap. The jobs of a global admin (tenant "")
//   and of a tallyd without user authentication are not capped (the spec's
//   own range, -1000 to 1000, still holds).
// - A waiting job preempts only attempts of its own tenant unless
//   cross_tenant_preemption is true.
// Caps are between -1000 and 1000. Re-read on SIGHUP (the caps; the
// preemption switch is read at start).
#ifndef TALLY_SERVER_CONFIG_TENANCY_H_
#define TALLY_SERVER_CONFIG_TENANCY_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace YAML {
class Node;
}  // namespace YAML

namespace tally::config {

inline constexpr int kDefaultMaxPriority = 100;

struct TenancyPolicy {
  int max_priority = kDefaultMaxPriority;
  std::map<std::string, int> tenant_max_priority;
  bool cross_tenant_preemption = false;

  // The cap of `tenant`'s jobs.
  int MaxPriority(const std::string& tenant) const;

  // OK when a job of `tenant` may have `priority`; INVALID_ARGUMENT naming
  // `field` and the cap otherwise. Tenant "" is not capped.
  absl::Status CheckPriority(const std::string& tenant, int priority,
                             absl::string_view field = "spec.priority") const;
};

// Parses the `tenancy` section into `out`; INVALID_ARGUMENT naming the key
// and its line.
absl::Status ParseTenancyPolicy(const YAML::Node& node, int line, TenancyPolicy* out);

}  // namespace tally::config

#endif  // TALLY_SERVER_CONFIG_TENANCY_H_
