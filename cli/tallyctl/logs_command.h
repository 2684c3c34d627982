// tallyctl logs JOB: what the job's attempts printed, as tallyd keeps it
// (GetJobLogs), or followed until the job ends (--follow: WatchJobLogs,
// resumed after the last line seen when tallyd is briefly away). Filters:
// --attempt K, --rank R, --since 10m (lines of the last ten minutes),
// --tail N (the last N lines; with --follow, then every new one). Text is the
// workers': every control character is printed escaped (Safe), so no line
// can move the cursor, clear the screen or hide what follows it.
// --output=json prints one LogLine a line. Exit codes as for get (kOk, or
// the call's failure); kUsage for a bad flag.
#ifndef TALLY_CLI_TALLYCTL_LOGS_COMMAND_H_
#define TALLY_CLI_TALLYCTL_LOGS_COMMAND_H_

#include <string>

#include "absl/time/time.h"
#include "cli/tallyctl/client.h"
#include "tally/v1/jobs.pb.h"

namespace tally::cli {

int Logs(Client& c, const std::string& job);

// One line as `logs` prints it: "2026-12-06 13:40:01.123 a1 r0 info  TEXT",
// TEXT escaped; the source named when it is not the trainer ("[worker]",
// "[tally]").
std::string LogLineText(const tally::v1::LogLine& line, absl::TimeZone tz);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_LOGS_COMMAND_H_
