#include "server/api/job_filter.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace tally::api {
namespace {

constexpr int kMaxLabels = 16;
constexpr size_t kMaxKey = 63;
constexpr size_t kMaxValue = 256;
constexpr size_t kMaxPrefix = 256;

absl::StatusOr<std::optional<absl::Time>> ReadTime(const tally::v1::ListJobsRequest& req,
                                                   bool after) {
  const bool has = after ? req.has_created_after() : req.has_created_before();
  if (!has) return std::optional<absl::Time>();
  const google::protobuf::Timestamp& t = after ? req.created_after() : req.created_before();
  // Timestamp's own range: 0001-01-01 to 9999-12-31, nanos below a second.
  if (t.seconds() < -62135596800 || t.seconds() > 253402300799 || t.nanos() < 0 ||
      t.nanos() > 999999999) {
    return absl::InvalidArgumentError(absl::StrCat(
        after ? "created_after" : "created_before",
        ": not a valid time (seconds from 0001-01-01 to 9999-12-31 UTC, nanos 0 to 999999999)"));
  }
  return std::optional<absl::Time>(absl::FromUnixSeconds(t.seconds()) +
                                   absl::Nanoseconds(t.nanos()));
}

}  // namespace

absl::StatusOr<JobFilter> ParseJobFilter(const tally::v1::ListJobsRequest& req) {
  JobFilter f;
  if (req.labels_size() > kMaxLabels) {
    return absl::InvalidArgumentError(absl::StrCat(
        "labels: ", req.labels_size(), " given; filter by at most ", kMaxLabels));
  }
  for (const auto& [key, value] : req.labels()) {
    if (key.empty() || key.size() > kMaxKey) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels[\"", EscapeUnprintable(key.substr(0, kMaxKey)),
          "\"]: a label key is 1-63 characters, as in spec.labels"));
    }
    if (value.size() > kMaxValue) {
      return absl::InvalidArgumentError(absl::StrCat(
          "labels[\"", EscapeUnprintable(key), "\"]: values are at most 256 characters, as in "
          "spec.labels"));
    }
    f.labels.emplace(key, value);
  }
  if (req.display_name_prefix().size() > kMaxPrefix) {
    return absl::InvalidArgumentError(absl::StrCat(
        "display_name_prefix: ", req.display_name_prefix().size(),
        " bytes; at most 256 (a display name is no longer)"));
  }
  f.display_name_prefix = req.display_name_prefix();
  absl::StatusOr<std::optional<absl::Time>> after = ReadTime(req, true);
  if (!after.ok()) return after.status();
  absl::StatusOr<std::optional<absl::Time>> before = ReadTime(req, false);
  if (!before.ok()) return before.status();
  f.created_after = *after;
  f.created_before = *before;
  if (f.created_after && f.created_before && *f.created_after >= *f.created_before) {
    return absl::InvalidArgumentError(absl::StrCat(
        "created_before: ", absl::FormatTime("%Y-%m-%dT%H:%M:%E*SZ", *f.created_before,
                                             absl::UTCTimeZone()),
        " is not after created_after ",
        absl::FormatTime("%Y-%m-%dT%H:%M:%E*SZ", *f.created_after, absl::UTCTimeZone()),
        "; no job can match: swap them or drop one"));
  }
  return f;
}

bool Matches(const JobFilter& filter, const tally::v1::Job& job) {
  for (const auto& [key, value] : filter.labels) {
    auto it = job.spec().labels().find(key);
    if (it == job.spec().labels().end() || it->second != value) return false;
  }
  if (!absl::StartsWith(job.spec().display_name(), filter.display_name_prefix)) return false;
  if (filter.created_after || filter.created_before) {
    const absl::Time created = absl::FromUnixSeconds(job.create_time().seconds()) +
                               absl::Nanoseconds(job.create_time().nanos());
    if (filter.created_after && created < *filter.created_after) return false;
    if (filter.created_before && created >= *filter.created_before) return false;
  }
  return true;
}

}  // namespace tally::api
