#include "server/config/tallyd_config.h"

#include <cmath>
#include <fstream>
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file/file_system.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "yaml-cpp/yaml.h"

namespace tally::config {
namespace {

absl::Status CheckTable(const char* key, const std::map<std::string, double>& table,
                        bool positive) {
  for (const auto& [gpu, v] : table) {
    if (gpu.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(key, ": a GPU type must not be empty"));
    }
    if (!std::isfinite(v) || v < 0 || (positive && v == 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          key, ".", gpu, ": must be a finite number ", positive ? "> 0" : ">= 0", ", got ", v));
    }
  }
  return absl::OkStatus();
}

// tenants: {NAME: {max_gpus: N, max_dollars_per_day: X, max_dollars_per_month: Y}}
absl::Status ParseTenants(const YAML::Node& node, int line, ledger::TenantQuotas* out) {
  if (node.IsNull()) return absl::OkStatus();
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenants (line ", line,
        "): expected a mapping of tenant to its limits, e.g. tenants: {research: {max_gpus: 8}}"));
  }
  for (const auto& entry : node) {
    const int at = entry.first.Mark().line + 1;
    absl::StatusOr<std::string> name = TenantName("tenant name", entry.first.as<std::string>());
    if (!name.ok() || name->empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tenants (line ", at, "): ",
          name.ok() ? "a tenant name is 1-64 characters of letters, digits and _ . : -"
                    : name.status().message()));
    }
    const std::string& tenant = *name;
    const std::string where = absl::StrCat("tenants.", tenant, " (line ", at, ")");
    if (out->count(tenant)) return absl::InvalidArgumentError(absl::StrCat(where, ": given twice"));
    if (!entry.second.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": expected a mapping with max_gpus, max_dollars_per_day, max_dollars_per_month"));
    }
    ledger::TenantQuota q;
    std::map<std::string, bool> seen;
    for (const auto& field : entry.second) {
      const std::string name = field.first.as<std::string>();
      const std::string fwhere =
          absl::StrCat("tenants.", tenant, ".", name, " (line ", field.first.Mark().line + 1, ")");
      if (seen[name]) return absl::InvalidArgumentError(absl::StrCat(fwhere, ": given twice"));
      seen[name] = true;
      double v = 0;
      try {
        v = field.second.as<double>();
      } catch (const YAML::Exception&) {
        return absl::InvalidArgumentError(absl::StrCat(fwhere, ": not a number"));
      }
      if (!std::isfinite(v) || v < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(fwhere, ": must be a finite number >= 0 (0: no limit)"));
      }
      if (name == "max_gpus") {
        if (v != std::floor(v) || v > 1e6) {
          return absl::InvalidArgumentError(
              absl::StrCat(fwhere, ": must be a whole number of GPUs (0: no limit)"));
        }
        q.max_gpus = static_cast<int32_t>(v);
      } else if (name == "max_dollars_per_day") {
        q.max_dollars_per_day = v;
      } else if (name == "max_dollars_per_month") {
        q.max_dollars_per_month = v;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            fwhere, ": unknown key; expected max_gpus, max_dollars_per_day or "
                    "max_dollars_per_month"));
      }
    }
    (*out)[tenant] = q;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TallydConfig::Validate() const {
  if (absl::Status s = CheckTable("usd_per_gpu_hour", prices.usd_per_gpu_hour, false); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTable("spot_usd_per_gpu_hour", prices.spot_usd_per_gpu_hour, false);
      !s.ok()) {
    return s;
  }
  return CheckTable("flops_per_second_per_gpu", prices.flops_per_second_per_gpu, true);
}

namespace {

// worker_gpu_types: a list of GPU type names, each a valid label value.
absl::Status ParseGpuTypeList(const YAML::Node& node, int line, std::vector<std::string>* out) {
  if (!node.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker_gpu_types (line ", line, "): expected a list of GPU types, e.g. [h100, h200]"));
  }
  for (const auto& item : node) {
    const int at = item.Mark().line + 1;
    if (!item.IsScalar()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker_gpu_types (line ", at, "): each entry is a GPU type name"));
    }
    const std::string type = item.as<std::string>();
    if (absl::Status s = CheckLabelValue("worker_gpu_types entry", type); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(s.message(), " (line ", at, ")"));
    }
    if (std::find(out->begin(), out->end(), type) != out->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker_gpu_types (line ", at, "): ", type, " is listed twice"));
    }
    out->push_back(type);
  }
  return absl::OkStatus();
}

// checkpoint_root: an absolute path without ".", ".." or empty components
// (a trailing '/' dropped).
absl::Status ParseCheckpointRoot(const YAML::Node& node, int line, std::string* out) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint_root (line ", line, "): ", why,
        "; give the workers' --checkpoint_dir as they resolve it, e.g. /mnt/tally-checkpoints"));
  };
  if (!node.IsScalar()) return bad("expected a path");
  std::string root = node.as<std::string>();
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root.empty() || root[0] != '/') return bad("must be an absolute path");
  if (root == "/") return bad("must not be / itself");
  for (absl::string_view part : absl::StrSplit(root.substr(1), '/')) {
    if (part.empty() || part == "." || part == "..") {
      return bad("must not contain empty, \".\" or \"..\" components");
    }
  }
  if (UnprintableReason(root)) return bad("is not printable text");
  *out = std::move(root);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TallydConfig> ParseTallydConfig(absl::string_view text) {
  if (text.size() > kMaxConfigBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the file is ", text.size(),
                                                   " bytes; a config is at most ",
                                                   kMaxConfigBytes));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid YAML: ", e.what()));
  }
  TallydConfig config;
  if (root.IsNull()) return config;
  if (!root.IsMap()) return absl::InvalidArgumentError("expected a mapping at the top level");
  try {
    for (const auto& section : root) {
      const std::string key = section.first.as<std::string>();
      const int line = section.first.Mark().line + 1;
      std::map<std::string, double>* into = nullptr;
      if (key == "tenants") {
        if (absl::Status s = ParseTenants(section.second, line, &config.quotas); !s.ok()) {
          return s;
        }
        continue;
      }
      if (key == "grpc_server") {
        RETURN_IF_ERROR(ParseGrpcServerLimits(section.second, line, &config.grpc_server));
        continue;
      }
      if (key == "limits") {
        RETURN_IF_ERROR(ParsePrincipalLimits(section.second, line, &config.limits));
        continue;
      }
      if (key == "tenancy") {
        RETURN_IF_ERROR(ParseTenancyPolicy(section.second, line, &config.tenancy));
        continue;
      }
      if (key == "checkpoint_root") {
        RETURN_IF_ERROR(ParseCheckpointRoot(section.second, line, &config.checkpoint_root));
        continue;
      }
      if (key == "logs") {
        RETURN_IF_ERROR(ParseLogsConfig(section.second, line, &config.logs));
        continue;
      }
      if (key == "worker_gpu_types") {
        RETURN_IF_ERROR(ParseGpuTypeList(section.second, line, &config.prices.worker_gpu_types));
        continue;
      }
      if (key == "usd_per_gpu_hour") {
        into = &config.prices.usd_per_gpu_hour;
      } else if (key == "spot_usd_per_gpu_hour") {
        into = &config.prices.spot_usd_per_gpu_hour;
      } else if (key == "flops_per_second_per_gpu") {
        into = &config.prices.flops_per_second_per_gpu;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            key, " (line ", line,
            "): unknown key; expected usd_per_gpu_hour, spot_usd_per_gpu_hour, "
            "flops_per_second_per_gpu, worker_gpu_types, checkpoint_root, tenants, grpc_server, "
            "limits, tenancy or logs"));
      }
      if (!section.second.IsMap()) {
        return absl::InvalidArgumentError(
            absl::StrCat(key, " (line ", line, "): expected a mapping of GPU type to number"));
      }
      for (const auto& entry : section.second) {
        const std::string gpu = entry.first.as<std::string>();
        const int at = entry.second.Mark().line + 1;
        if (into->count(gpu)) {
          return absl::InvalidArgumentError(
              absl::StrCat(key, ".", gpu, " (line ", at, "): given twice"));
        }
        double v = 0;
        try {
          v = entry.second.as<double>();
        } catch (const YAML::Exception&) {
          return absl::InvalidArgumentError(
              absl::StrCat(key, ".", gpu, " (line ", at, "): not a number"));
        }
        const bool positive = into == &config.prices.flops_per_second_per_gpu;
        if (!std::isfinite(v) || v < 0 || (positive && v == 0)) {
          return absl::InvalidArgumentError(absl::StrCat(key, ".", gpu, " (line ", at,
                                                         "): must be a finite number ",
                                                         positive ? "> 0" : ">= 0"));
        }
        (*into)[gpu] = v;
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not a valid config: ", e.what()));
  }
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  return config;
}

absl::StatusOr<TallydConfig> LoadTallydConfig(const std::string& path) {
  if (path.empty()) return TallydConfig{};
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot read ", path));
  // One byte past the limit: ParseTallydConfig refuses a longer file.
  absl::StatusOr<std::string> text = file::ReadAtMost(in, kMaxConfigBytes);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("--config: cannot read ", path));
  auto config = ParseTallydConfig(*text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config: ", path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace tally::config
