#include "server/policy/cost.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "yaml-cpp/yaml.h"

namespace tally::policy {

double PriceTable::Price(const std::string& gpu_type) const {
  auto it = usd_per_gpu_hour.find(gpu_type);
  return it == usd_per_gpu_hour.end() ? 0.0 : it->second;
}

absl::StatusOr<PriceTable> ParsePriceTable(absl::string_view text) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid YAML: ", e.what()));
  }
  PriceTable t;
  if (root.IsNull()) return t;
  if (!root.IsMap()) return absl::InvalidArgumentError("expected a mapping at the top level");
  for (const auto& section : root) {
    const std::string key = section.first.as<std::string>();
    std::map<std::string, double>* into = nullptr;
    if (key == "usd_per_gpu_hour") {
      into = &t.usd_per_gpu_hour;
    } else if (key == "flops_per_second_per_gpu") {
      into = &t.flops_per_second_per_gpu;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          key, " (line ", section.first.Mark().line + 1,
          "): unknown key; expected usd_per_gpu_hour or flops_per_second_per_gpu"));
    }
    if (!section.second.IsMap()) {
      return absl::InvalidArgumentError(
          absl::StrCat(key, ": expected a mapping of GPU type to number"));
    }
    for (const auto& entry : section.second) {
      const std::string gpu = entry.first.as<std::string>();
      double v = 0;
      try {
        v = entry.second.as<double>();
      } catch (const YAML::Exception&) {
        return absl::InvalidArgumentError(absl::StrCat(
            key, ".", gpu, " (line ", entry.second.Mark().line + 1, "): not a number"));
      }
      if (!std::isfinite(v) || v < 0 || (into == &t.flops_per_second_per_gpu && v == 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            key, ".", gpu, " (line ", entry.second.Mark().line + 1,
            "): must be a finite number >= 0", into == &t.usd_per_gpu_hour ? "" : " (> 0)"));
      }
      (*into)[gpu] = v;
    }
  }
  return t;
}

double CostUsd(absl::Duration held, int gpus, double usd_per_gpu_hour) {
  return absl::ToDoubleHours(held) * gpus * usd_per_gpu_hour;
}

CheckpointPrice PriceCheckpoint(double cost_usd, int64_t tokens, double val_loss,
                                const PreviousCheckpoint& prev) {
  CheckpointPrice p;
  p.cost_since_previous_usd = cost_usd - prev.cost_usd;
  p.tokens_since_previous = tokens - prev.tokens;
  if (val_loss > 0 && prev.val_loss > 0 && val_loss < prev.val_loss) {
    p.usd_per_val_loss_improvement = p.cost_since_previous_usd / (prev.val_loss - val_loss);
  }
  return p;
}

Estimate EstimateRun(double flops_per_token, int64_t tokens, int gpus,
                     double flops_per_second_per_gpu, double usd_per_gpu_hour) {
  Estimate e;
  e.flops_per_token = flops_per_token;
  e.tokens = tokens;
  e.flops_per_second_per_gpu = flops_per_second_per_gpu;
  if (flops_per_second_per_gpu > 0 && gpus > 0) {
    e.seconds = flops_per_token * static_cast<double>(tokens) /
                (flops_per_second_per_gpu * gpus);
  }
  e.gpu_hours = e.seconds * gpus / 3600.0;
  e.cost_usd = e.gpu_hours * usd_per_gpu_hour;
  return e;
}

}  // namespace tally::policy
