// ListJobs' filters (labels, a display-name prefix, a creation-time range):
// read from the request once, checked, then matched against each job the
// store lists. Pure: no store, no clock.
#ifndef TALLY_SERVER_API_JOB_FILTER_H_
#define TALLY_SERVER_API_JOB_FILTER_H_

#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tally/v1/jobs.pb.h"

namespace tally::api {

struct JobFilter {
  std::map<std::string, std::string> labels;  // every one must be on the job
  std::string display_name_prefix;
  std::optional<absl::Time> created_after;    // inclusive
  std::optional<absl::Time> created_before;   // exclusive

  // Whether any filter is set (else every listed job matches).
  bool empty() const {
    return labels.empty() && display_name_prefix.empty() && !created_after && !created_before;
  }
};

// The request's filters; INVALID_ARGUMENT naming the field (labels, their
// keys and values, display_name_prefix, created_after, created_before) and
// the fix when one cannot match any job or is out of bounds.
absl::StatusOr<JobFilter> ParseJobFilter(const tally::v1::ListJobsRequest& req);

// Whether `job` passes every filter.
bool Matches(const JobFilter& filter, const tally::v1::Job& job);

}  // namespace tally::api

#endif  // TALLY_SERVER_API_JOB_FILTER_H_
