// How tallyctl shows what tallyd sent: its text made safe for a terminal,
// messages as JSON, times, and the parts of a job's or an experiment's
// description that both kinds share.
#ifndef TALLY_CLI_TALLYCTL_OUTPUT_H_
#define TALLY_CLI_TALLYCTL_OUTPUT_H_

#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::cli {

// Text from tallyd (names, reasons, paths) as it may be shown on a terminal:
// records written before specs were validated may hold control characters.
std::string Safe(absl::string_view text);

// The state without its prefix, e.g. "RUNNING".
std::string StateName(tally::v1::JobState s);

// `m` as indented JSON with the proto's field names and every field, zeros
// and false included (a curve's step-0 point has its "step"): scripts read
// the figures by name and should find each one. A message that cannot be
// printed is reported on stderr.
std::string Json(const google::protobuf::Message& m);

// One message as one line of JSON, every field included (watch
// --output=json).
std::string JsonLine(const google::protobuf::Message& m);

// `t` in the local time zone (FormatTimestamp in job_format.h).
std::string Time(const google::protobuf::Timestamp& t);

// "  tenant:    T   submitted by: A   cancelled by: B", the parts that are
// set; empty when none is (tallyd without authentication). `by_label` names
// the second part ("submitted by", "created by").
std::string OwnershipLine(absl::string_view tenant, absl::string_view by_label,
                          absl::string_view by, absl::string_view cancelled_by);

// " by PRINCIPAL" for an event a caller's request made, else empty.
std::string ByPrincipal(absl::string_view principal);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_OUTPUT_H_
