// Resource names: "jobs/{id}" and "experiments/{id}" with a positive decimal id.
#ifndef TALLY_COMMON_NAMES_H_
#define TALLY_COMMON_NAMES_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

std::string JobName(int64_t id);
// INVALID_ARGUMENT naming `field` when `name` is not "jobs/{id}".
absl::StatusOr<int64_t> ParseJobName(absl::string_view name,
                                     absl::string_view field = "name");

std::string ExperimentName(int64_t id);
// INVALID_ARGUMENT naming `field` when `name` is not "experiments/{id}".
absl::StatusOr<int64_t> ParseExperimentName(absl::string_view name,
                                            absl::string_view field = "name");

// A request_id (the idempotency key of SubmitJob and CreateExperiment):
// empty, or at most 128 printable characters. INVALID_ARGUMENT naming
// request_id otherwise.
absl::Status ValidateRequestId(absl::string_view request_id);

}  // namespace tally

#endif  // TALLY_COMMON_NAMES_H_
