#include "common/names.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/text.h"

namespace tally {

std::string JobName(int64_t id) { return absl::StrCat("jobs/", id); }

absl::StatusOr<int64_t> ParseJobName(absl::string_view name,
                                     absl::string_view field) {
  absl::string_view rest = name;
  int64_t id = 0;
  if (!absl::ConsumePrefix(&rest, "jobs/") || !absl::SimpleAtoi(rest, &id) ||
      id <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a job name like \"jobs/42\", got \"",
                     EscapeUnprintable(name), "\""));
  }
  return id;
}

std::string ExperimentName(int64_t id) { return absl::StrCat("experiments/", id); }

absl::StatusOr<int64_t> ParseExperimentName(absl::string_view name,
                                            absl::string_view field) {
  absl::string_view rest = name;
  int64_t id = 0;
  if (!absl::ConsumePrefix(&rest, "experiments/") || !absl::SimpleAtoi(rest, &id) ||
      id <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected an experiment name like \"experiments/7\", got \"",
        EscapeUnprintable(name), "\""));
  }
  return id;
}

}  // namespace tally
