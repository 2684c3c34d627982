// JobSpec defaults and validation, in one place for tallyd, tallyctl and the
// standalone trainer. Validation reports every problem at once; each names the
// field path (as in the YAML spec) and what is allowed.
#ifndef TALLY_COMMON_SPEC_VALIDATION_H_
#define TALLY_COMMON_SPEC_VALIDATION_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "tally/v1/spec.pb.h"

namespace tally {

// A timing calibration's bounds (JobSpec.calibration) and defaults.
inline constexpr int kDefaultCalibrationRounds = 3;
inline constexpr int kDefaultCalibrationSteps = 5;
inline constexpr int kMaxCalibrationRounds = 20;
inline constexpr int kMaxCalibrationSteps = 50;
// The steps a calibration trains in all (its job's training.max_steps):
// variants x rounds x (steps + 1), each burst's untimed first step included.
inline int64_t CalibrationTotalSteps(const tally::v1::TimingCalibrationSpec& c) {
  return int64_t{c.variants_size()} * c.rounds() * (int64_t{c.steps()} + 1);
}

// ApplySpecDefaults then ValidateJobSpec: the one check a spec passes to be
// accepted. tallyd's SubmitJob and EstimateCost and `tallyctl validate`,
// `submit` and `estimate` all call it, so what `tallyctl validate` accepts is
// exactly what tallyd accepts.
absl::Status PrepareJobSpec(tally::v1::JobSpec* spec);

// Fills fields whose zero value means "default" (documented in spec.proto).
// Idempotent; does not validate. Safe on any spec (no overflow on values out
// of range: those are left for ValidateJobSpec to refuse).
void ApplySpecDefaults(tally::v1::JobSpec* spec);

// OK, or INVALID_ARGUMENT whose message lists "spec.<path>: <problem>" for
// every bad field, separated by "; ". Call after ApplySpecDefaults.
// Every string field, label keys and values included, must be printable text
// (common/text.h): valid UTF-8, as protobuf needs to send it, with no NUL or
// other control characters. Values quoted in the message are escaped, so it
// is safe to print.
absl::Status ValidateJobSpec(const tally::v1::JobSpec& spec);

// The world sizes a valid spec (defaults applied) can train at, largest
// first: resources.gpu_count, then every smaller w that divides its
// micro-batches per step (global_batch_tokens / (seq_len *
// micro_batch_rows)) and, with expert parallelism, its experts. Checkpoints
// hold the whole model, so a job resumes at any of them (a preempted job
// waiting for slots).
std::vector<int> AllowedWorldSizes(const tally::v1::JobSpec& spec);

}  // namespace tally

#endif  // TALLY_COMMON_SPEC_VALIDATION_H_
