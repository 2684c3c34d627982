// Reads a JobSpec from YAML (or JSON, which YAML includes). Strict: an unknown
// field, a wrong type or an unknown enum value is INVALID_ARGUMENT naming the
// field path and what is allowed. Enum values may be written in full
// ("PRECISION_FP8") or short and in any case ("fp8"). Fields may be written
// with their proto name (num_layers) or their JSON name (numLayers).
//
// Any byte string is safe to read: the reader never crashes, and its time and
// memory are linear in the input, which is at most kMaxSpecBytes. Before
// reading any field it walks the YAML event stream and refuses, naming the
// line:
// - input longer than kMaxSpecBytes;
// - more than one YAML document ("---");
// - anchors and aliases (&name, *name): nothing is expanded, so an alias bomb
//   ("billion laughs") is refused at its first anchor;
// - nesting deeper than kMaxSpecDepth, or more than kMaxSpecValues values;
// - a list or mapping used as a mapping key.
// While reading fields it refuses a key given twice in one mapping, including
// one field written under both of its names (num_layers and numLayers), or
// two fields of one oneof, naming both lines.
//
// The reader checks types, not values: ranges, cross-field rules and whether
// strings are printable UTF-8 are ValidateJobSpec's (common/spec_validation.h).
// Every error is INVALID_ARGUMENT, except that ReadJobSpecFile returns
// NOT_FOUND for a file it cannot open. User text quoted in a message is
// escaped (common/text.h), so messages are safe to print.
//
// All functions are thread-safe.
#ifndef TALLY_COMMON_SPEC_YAML_H_
#define TALLY_COMMON_SPEC_YAML_H_

#include <cstddef>
#include <istream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "google/protobuf/struct.pb.h"
#include "tally/v1/spec.pb.h"

namespace tally {

// Limits on one spec. A real spec is a few hundred bytes (64 labels of the
// longest kind are 21 KB), a few dozen values and four levels deep. The byte
// limit also bounds yaml-cpp's own work: its scanner may queue a token per
// byte of one line before the first event (about 250 bytes of memory each).
inline constexpr size_t kMaxSpecBytes = size_t{256} << 10;
inline constexpr int kMaxSpecDepth = 32;
inline constexpr int kMaxSpecValues = 10000;

// The entry point for any spec text, e.g. a fuzzer's bytes. `source` names
// the input in messages ("job.yaml: spec.model.num_layers (line 3): ...");
// empty for none. Empty text (or only comments) is an empty JobSpec.
absl::StatusOr<tally::v1::JobSpec> ParseJobSpecYaml(
    absl::string_view text, absl::string_view source = "");

// Reads at most kMaxSpecBytes + 1 bytes from `in` and parses them; longer
// input is refused without being read to its end.
absl::StatusOr<tally::v1::JobSpec> ReadJobSpecStream(std::istream& in,
                                                     absl::string_view source);

// ReadJobSpecStream on the file at `path`, which names it in messages.
absl::StatusOr<tally::v1::JobSpec> ReadJobSpecFile(const std::string& path);

// The generic reader behind ParseJobSpecYaml, for any message type, with the
// same limits. `root` starts every field path in messages; under an empty
// root paths start at the first field ("base.model (line 2): ...") and
// refusals of the whole input name the line ("line 4: ...").
//
// A google.protobuf.Struct field takes any mapping, unchecked, keeping the
// text of every value: a plain scalar becomes a bool or a number only when it
// is written as that value prints (true, 8, 2.5); quoted scalars and anything
// else (1e-4, 007, yes) become strings as written; an empty value is null.
// Reading the Struct with ReadStructInto then gives what the same YAML would
// have given.
absl::Status ParseYamlInto(absl::string_view text,
                           google::protobuf::Message* message,
                           absl::string_view root = "spec");

// Reads `data` (e.g. a Struct filled by ParseYamlInto) into `message` by the
// same strict rules and limits as ParseYamlInto, with field paths under
// `root` and no line numbers. Numbers are read as their shortest text, so a
// number_value into an integer field must be integral and in range.
absl::Status ReadStructInto(const google::protobuf::Struct& data,
                            google::protobuf::Message* message,
                            absl::string_view root = "spec");

}  // namespace tally

#endif  // TALLY_COMMON_SPEC_YAML_H_
