#include "server/config/tenancy.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace tally::config {
namespace {

constexpr int kPriorityLimit = 1000;  // the spec's own range

absl::Status ParseCap(const YAML::Node& value, const std::string& where, int* out) {
  double d = 0;
  try {
    d = value.as<double>();
  } catch (const YAML::Exception&) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a number"));
  }
  if (!std::isfinite(d) || d != std::floor(d) || d < -kPriorityLimit || d > kPriorityLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": must be a whole number between -1000 and 1000 (a job priority)"));
  }
  *out = static_cast<int>(d);
  return absl::OkStatus();
}

std::string Where(const std::string& key, const YAML::Node& node) {
  return absl::StrCat(key, " (line ", node.Mark().line + 1, ")");
}

}  // namespace

int TenancyPolicy::MaxPriority(const std::string& tenant) const {
  auto it = tenant_max_priority.find(tenant);
  return it != tenant_max_priority.end() ? it->second : max_priority;
}

absl::Status TenancyPolicy::CheckPriority(const std::string& tenant, int priority,
                                          absl::string_view field) const {
  if (tenant.empty()) return absl::OkStatus();
  const int cap = MaxPriority(tenant);
  if (priority <= cap) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", priority, " is above the maximum of ",
                                                 cap, " for tenant ", tenant,
                                                 "; use a priority of at most ", cap,
                                                 " (tallyd's --config tenancy.max_priority and "
                                                 "tenancy.tenant_max_priority set it)"));
}

absl::Status ParseTenancyPolicy(const YAML::Node& node, int line, TenancyPolicy* out) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tenancy (line ", line,
                     "): expected a mapping with max_priority, tenant_max_priority "
                     "or cross_tenant_preemption"));
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    const std::string where = Where(absl::StrCat("tenancy.", key), entry.first);
    if (key == "max_priority") {
      if (absl::Status s = ParseCap(entry.second, where, &out->max_priority); !s.ok()) return s;
    } else if (key == "tenant_max_priority") {
      if (!entry.second.IsMap()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": expected a mapping of tenant to its cap, e.g. {research: 500}"));
      }
      for (const auto& t : entry.second) {
        const std::string tenant = t.first.as<std::string>();
        const std::string twhere =
            Where(absl::StrCat("tenancy.tenant_max_priority.", tenant), t.first);
        if (tenant.empty() || tenant.size() > 128) {
          return absl::InvalidArgumentError(
              absl::StrCat(twhere, ": a tenant name is 1-128 characters"));
        }
        int cap = 0;
        if (absl::Status s = ParseCap(t.second, twhere, &cap); !s.ok()) return s;
        out->tenant_max_priority[tenant] = cap;
      }
    } else if (key == "cross_tenant_preemption") {
      try {
        out->cross_tenant_preemption = entry.second.as<bool>();
      } catch (const YAML::Exception&) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": expected true or false"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where,
                       ": unknown key; expected max_priority, tenant_max_priority or "
                       "cross_tenant_preemption"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tally::config
