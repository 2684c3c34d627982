#include "common/names.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/text.h"

namespace tally {

namespace {

// "{prefix}{id}" with a positive decimal id; INVALID_ARGUMENT naming
// `field` and showing `example` otherwise.
absl::StatusOr<int64_t> ParseName(absl::string_view name, absl::string_view prefix,
                                  absl::string_view field, absl::string_view example) {
  absl::string_view rest = name;
  int64_t id = 0;
  if (!absl::ConsumePrefix(&rest, prefix) || !absl::SimpleAtoi(rest, &id) || id <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", example, ", got \"",
                                                   EscapeUnprintable(name), "\""));
  }
  return id;
}

}  // namespace

std::string JobName(int64_t id) { return absl::StrCat("jobs/", id); }

absl::StatusOr<int64_t> ParseJobName(absl::string_view name, absl::string_view field) {
  return ParseName(name, "jobs/", field, "a job name like \"jobs/42\"");
}

std::string ExperimentName(int64_t id) { return absl::StrCat("experiments/", id); }

absl::StatusOr<int64_t> ParseExperimentName(absl::string_view name, absl::string_view field) {
  return ParseName(name, "experiments/", field, "an experiment name like \"experiments/7\"");
}

absl::Status ValidateRequestId(absl::string_view request_id) {
  if (request_id.size() > 128) {
    return absl::InvalidArgumentError("request_id: must be at most 128 characters");
  }
  if (std::optional<std::string> why = UnprintableReason(request_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request_id: must be printable text; it ", *why));
  }
  return absl::OkStatus();
}

}  // namespace tally
