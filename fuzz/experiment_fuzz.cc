// Fuzzes the experiment file reader, its defaults, validation and the
// resolution of each variant (base spec + field-wise overrides): what tallyctl
// and tallyd will do with an experiment file a user wrote.
//
// Beyond "no crash, no sanitizer report" it checks:
// - a rejected file is INVALID_ARGUMENT with a message;
// - validation is deterministic;
// - when the experiment validates, every variant resolves to a spec that
//   itself passes PrepareJobSpec (what the experiment will submit).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/experiment_spec.h"
#include "common/spec_validation.h"
#include "tally/v1/experiments.pb.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "experiment_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

void ExpectRejection(const absl::Status& s, const char* what) {
  if (s.code() != absl::StatusCode::kInvalidArgument || s.message().empty()) {
    Fail(std::string(what) + " is not INVALID_ARGUMENT with a message: " + s.ToString());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<tally::v1::ExperimentSpec> spec = tally::ParseExperimentYaml(text);
  if (!spec.ok()) {
    ExpectRejection(spec.status(), "a rejected file");
    return 0;
  }
  tally::ApplyExperimentDefaults(&*spec);
  const absl::Status valid = tally::ValidateExperimentSpec(*spec);
  if (valid != tally::ValidateExperimentSpec(*spec)) Fail("validation is not deterministic");
  if (!valid.ok()) {
    ExpectRejection(valid, "an invalid experiment");
    return 0;
  }
  for (int i = 0; i < spec->variants_size(); ++i) {
    absl::StatusOr<tally::v1::JobSpec> resolved = tally::ResolveVariant(*spec, i);
    if (!resolved.ok()) {
      Fail("a variant of a valid experiment does not resolve: " + resolved.status().ToString());
    }
    if (absl::Status s = tally::PrepareJobSpec(&*resolved); !s.ok()) {
      Fail("a variant of a valid experiment does not validate: " + s.ToString());
    }
  }
  return 0;
}
