// Reads a JobSpec from YAML (or JSON, which YAML includes). Strict: an unknown
// field, a wrong type or an unknown enum value is INVALID_ARGUMENT naming the
// field path and what is allowed. Enum values may be written in full
// ("PRECISION_FP8") or short and in any case ("fp8").
#ifndef TALLY_COMMON_SPEC_YAML_H_
#define TALLY_COMMON_SPEC_YAML_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "tally/v1/spec.pb.h"

namespace tally {

absl::StatusOr<tally::v1::JobSpec> ParseJobSpecYaml(absl::string_view text);
absl::StatusOr<tally::v1::JobSpec> ReadJobSpecFile(const std::string& path);

// The generic reader behind ParseJobSpecYaml, for any message type.
absl::Status ParseYamlInto(absl::string_view text,
                           google::protobuf::Message* message,
                           absl::string_view root = "spec");

}  // namespace tally

#endif  // TALLY_COMMON_SPEC_YAML_H_
