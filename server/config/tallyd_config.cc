#include "server/config/tallyd_config.h"

#include <cmath>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
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

}  // namespace

absl::Status TallydConfig::Validate() const {
  if (absl::Status s = CheckTable("usd_per_gpu_hour", prices.usd_per_gpu_hour, false); !s.ok()) {
    return s;
  }
  return CheckTable("flops_per_second_per_gpu", prices.flops_per_second_per_gpu, true);
}

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
      if (key == "usd_per_gpu_hour") {
        into = &config.prices.usd_per_gpu_hour;
      } else if (key == "flops_per_second_per_gpu") {
        into = &config.prices.flops_per_second_per_gpu;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            key, " (line ", line,
            "): unknown key; expected usd_per_gpu_hour or flops_per_second_per_gpu"));
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
  std::string text;
  text.resize(kMaxConfigBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  auto config = ParseTallydConfig(text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--config: ", path, ": ", config.status().message()));
  }
  return config;
}

}  // namespace tally::config
