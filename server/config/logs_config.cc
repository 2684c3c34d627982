#include "server/config/logs_config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace tally::config {

absl::Status ParseLogsConfig(const YAML::Node& node, int line, LogsConfig* out) {
  if (!node.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat("logs (line ", line, "): expected a mapping, e.g. {keep_mib: 4}"));
  }
  for (const auto& entry : node) {
    const std::string key = entry.first.as<std::string>();
    const int at = entry.first.Mark().line + 1;
    if (key != "keep_mib") {
      return absl::InvalidArgumentError(
          absl::StrCat("logs.", key, " (line ", at, "): unknown key; expected keep_mib"));
    }
    double v = 0;
    try {
      v = entry.second.as<double>();
    } catch (const YAML::Exception&) {
      v = std::nan("");
    }
    if (!std::isfinite(v) || v < 0.0625 || v > 1024) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logs.keep_mib (line ", at,
          "): expected the MiB of output kept per job, 0.0625-1024 (default 4)"));
    }
    out->keep_mib = v;
  }
  return absl::OkStatus();
}

}  // namespace tally::config
