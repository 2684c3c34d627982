#include "cli/tallyctl/output.h"

#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/tallyctl/job_format.h"
#include "common/text.h"
#include "google/protobuf/util/json_util.h"

namespace tally::cli {

std::string Safe(absl::string_view text) { return EscapeUnprintable(text); }

std::string StateName(tally::v1::JobState s) {
  absl::string_view name = tally::v1::JobState_Name(s);
  absl::ConsumePrefix(&name, "JOB_STATE_");
  return std::string(name);
}

namespace {

google::protobuf::util::JsonPrintOptions EveryField() {
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  return opts;
}

}  // namespace

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts = EveryField();
  opts.add_whitespace = true;
  if (auto s = google::protobuf::util::MessageToJsonString(m, &out, opts); !s.ok()) {
    std::cerr << "tallyctl: cannot print as JSON: " << Safe(s.ToString()) << "\n";
  }
  return out;
}

std::string JsonLine(const google::protobuf::Message& m) {
  std::string line;
  (void)google::protobuf::util::MessageToJsonString(m, &line, EveryField());
  return line;
}

std::string Time(const google::protobuf::Timestamp& t) {
  return FormatTimestamp(t, absl::LocalTimeZone());
}

std::string OwnershipLine(absl::string_view tenant, absl::string_view by_label,
                          absl::string_view by, absl::string_view cancelled_by) {
  std::vector<std::string> parts;
  if (!tenant.empty()) parts.push_back(absl::StrCat("tenant:    ", Safe(tenant)));
  if (!by.empty()) parts.push_back(absl::StrCat(by_label, ": ", Safe(by)));
  if (!cancelled_by.empty()) parts.push_back(absl::StrCat("cancelled by: ", Safe(cancelled_by)));
  if (parts.empty()) return "";
  return absl::StrCat("  ", absl::StrJoin(parts, "   "), "\n");
}

std::string ByPrincipal(absl::string_view principal) {
  return principal.empty() ? std::string() : absl::StrCat(" by ", Safe(principal));
}

}  // namespace tally::cli
