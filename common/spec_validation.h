// JobSpec defaults and validation, in one place for tallyd, tallyctl and the
// standalone trainer. Validation reports every problem at once; each names the
// field path (as in the YAML spec) and what is allowed.
#ifndef TALLY_COMMON_SPEC_VALIDATION_H_
#define TALLY_COMMON_SPEC_VALIDATION_H_

#include "absl/status/status.h"
#include "tally/v1/spec.pb.h"

namespace tally {

// Fills fields whose zero value means "default" (documented in spec.proto).
// Idempotent; does not validate.
void ApplySpecDefaults(tally::v1::JobSpec* spec);

// OK, or INVALID_ARGUMENT whose message lists "spec.<path>: <problem>" for
// every bad field, separated by "; ". Call after ApplySpecDefaults.
absl::Status ValidateJobSpec(const tally::v1::JobSpec& spec);

}  // namespace tally

#endif  // TALLY_COMMON_SPEC_VALIDATION_H_
