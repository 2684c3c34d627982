// Fuzzes the job spec reader (YAML, and JSON through it), ApplySpecDefaults
// and ValidateJobSpec: what tallyctl and tallyd do with a spec a user wrote.
//
// Beyond "no crash, no sanitizer report" it checks:
// - a rejected spec is INVALID_ARGUMENT with a message (the field to fix);
// - ApplySpecDefaults is idempotent;
// - validation is deterministic;
// - a spec that validates survives a round trip through protobuf's JSON
//   printer and the reader: the reader accepts what the JSON form says.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/spec_validation.h"
#include "common/spec_yaml.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "tally/v1/spec.pb.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "spec_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tally::v1::JobSpec> spec = tally::ParseJobSpecYaml(text);
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("a rejected spec is not INVALID_ARGUMENT: " + spec.status().ToString());
    }
    if (spec.status().message().empty()) Fail("a rejected spec has no message");
    return 0;
  }
  tally::ApplySpecDefaults(&*spec);
  tally::v1::JobSpec again = *spec;
  tally::ApplySpecDefaults(&again);
  if (!google::protobuf::util::MessageDifferencer::Equals(*spec, again)) {
    Fail("ApplySpecDefaults is not idempotent:\n" + spec->DebugString() + "\nvs\n" +
         again.DebugString());
  }
  const absl::Status valid = tally::ValidateJobSpec(*spec);
  if (valid != tally::ValidateJobSpec(again)) Fail("validation is not deterministic");
  if (!valid.ok()) {
    if (valid.code() != absl::StatusCode::kInvalidArgument || valid.message().empty()) {
      Fail("an invalid spec is not INVALID_ARGUMENT with a message: " + valid.ToString());
    }
    return 0;
  }

  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(*spec, &json, options).ok()) {
    return 0;  // e.g. a string field that is not UTF-8: protobuf will not print it
  }
  absl::StatusOr<tally::v1::JobSpec> reread = tally::ParseJobSpecYaml(json);
  if (!reread.ok()) {
    Fail("the reader rejects the JSON form of a valid spec: " + reread.status().ToString() +
         "\nJSON: " + json);
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(*spec, *reread)) {
    Fail("the JSON form of a valid spec reads back differently:\n" + spec->DebugString() +
         "\nvs\n" + reread->DebugString() + "\nJSON: " + json);
  }
  return 0;
}
