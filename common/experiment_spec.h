// Experiment files: one base JobSpec and named variants of it, trained and
// compared against a target (proto/tally/v1/experiments.proto).
//
//   display_name: recipe-ab
//   base: {model: {...}, data: {...}, ...}     # a complete JobSpec
//   variants:
//     - name: naive
//       overrides: {data: {packing: pad_to_seq_len}}
//     - name: packed
//       overrides: {}
//   target: {from_variant: naive}               # or {val_loss: 2.5}
//                                               # metric: quantized_val_loss judges
//                                               # every variant by its quantized loss
//   budget: {max_dollars: 5.0}                  # optional; 0 means none
//   strategy: all                               # or successive_halving
//   replicates: 3                               # optional; runs of each variant
//
// A variant's spec is the base with its overrides merged in, field by field:
// - a message (model, model.moe, ...) merges: fields the override does not
//   name keep the base's values;
// - a scalar (number, string, bool, enum) replaces, its zero value included
//   ({training: {checkpoint_interval_steps: 0}} sets 0);
// - a list replaces the base's list (unlike protobuf's MergeFrom, which
//   appends);
// - a map (labels) merges key by key: a key in the override replaces or adds
//   that entry, the base's other entries stay;
// - an empty value (`packing:` or `packing: null`) clears the field back to
//   its zero value, i.e. its default.
// Overrides use the JobSpec field names and value forms of a job spec file
// (common/spec_yaml.h), enum short names included.
//
// Errors are INVALID_ARGUMENT. Reading names the field path and line as the
// job spec reader does ("exp.yaml: base.model.num_layers (line 4): ...").
// Problems of one variant start with the variant, then the JobSpec path:
// "variants[2] (packed-moe): spec.model.moe.top_k: must be ...". Validation
// lists every problem, separated by "; ", the first 20 of them. Quoted user
// text is escaped (common/text.h), so messages are safe to print.
//
// All functions are thread-safe.
#ifndef TALLY_COMMON_EXPERIMENT_SPEC_H_
#define TALLY_COMMON_EXPERIMENT_SPEC_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/spec.pb.h"

namespace tally {

inline constexpr int kMaxExperimentVariants = 32;
inline constexpr int kMaxVariantNameChars = 64;
inline constexpr int kMaxExperimentReplicates = 8;

// 1 to kMaxVariantNameChars characters of a-z, 0-9, '.', '_' and '-'.
bool IsVariantName(absl::string_view name);

// Reads an experiment file with the job spec reader's strictness and limits
// (kMaxSpecBytes, no anchors or aliases, no duplicate keys, one document,
// unknown fields refused; two targets are refused too). `base` is read as a
// JobSpec; each variant's `overrides` is kept as written, as a Struct, and
// checked only when the variant is resolved. `source` names the input in
// messages; empty for none. Checks types, not values: see
// ValidateExperimentSpec.
absl::StatusOr<tally::v1::ExperimentSpec> ParseExperimentYaml(
    absl::string_view text, absl::string_view source = "");

// Variant `index`'s JobSpec: the base with its overrides merged by the rules
// above, as written (defaults not filled in; tallyd fills them on submit),
// with target.metric quantized_val_loss set as its early_stopping.metric (a
// variant then needs training.qat or training.eval_quantized, and one that
// names another early_stopping.metric is refused). It must pass
// PrepareJobSpec. INVALID_ARGUMENT for an index out of range, an
// override that is not a JobSpec field or has the wrong type, or a merged
// spec PrepareJobSpec refuses, each problem prefixed with the variant.
absl::StatusOr<tally::v1::JobSpec> ResolveVariant(
    const tally::v1::ExperimentSpec& spec, int index);

// The merge behind ResolveVariant, for any message type: reads `overrides`
// into `base`'s type strictly (ReadStructInto, paths under `root`) and, if
// that succeeds, merges it into `base` by the rules above; on error `base` is
// unchanged.
absl::Status MergeOverrides(const google::protobuf::Struct& overrides,
                            google::protobuf::Message* base,
                            absl::string_view root = "spec");

// Fills fields whose zero value means "default": strategy UNSPECIFIED
// becomes ALL, replicates 0 becomes 1. Idempotent.
void ApplyExperimentDefaults(tally::v1::ExperimentSpec* spec);

// OK, or INVALID_ARGUMENT listing every problem:
// - 1 to kMaxExperimentVariants variants, each named with 1 to
//   kMaxVariantNameChars of [a-z0-9._-], names unique;
// - display_name printable text (common/text.h) of at most 200 characters;
// - target set: from_variant naming a variant, or val_loss a positive
//   finite number; target.metric empty, val_loss or quantized_val_loss
//   (which every variant's spec must be able to measure, see
//   ResolveVariant);
// - budget.max_dollars and rung_dollars finite and >= 0;
// - strategy ALL or SUCCESSIVE_HALVING (UNSPECIFIED is taken as ALL);
// - every variant resolves (ResolveVariant) and its spec validates.
absl::Status ValidateExperimentSpec(const tally::v1::ExperimentSpec& spec);

}  // namespace tally

#endif  // TALLY_COMMON_EXPERIMENT_SPEC_H_
