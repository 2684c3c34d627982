// tallyctl's exit codes, by what the caller should do; the usage text
// (usage.h) lists them for users.
#ifndef TALLY_CLI_TALLYCTL_EXIT_CODES_H_
#define TALLY_CLI_TALLYCTL_EXIT_CODES_H_

namespace tally::cli {

enum Exit {
  kOk = 0,
  kError = 1,           // anything else
  kUsage = 2,           // bad flags or a bad spec: fix the input
  kNotFound = 3,
  kFailedPrecondition = 4,  // e.g. cancelling a job that has ended
  kUnavailable = 5,     // tallyd not reachable: retry later
  kJobUnsuccessful = 6, // watch: the job ended FAILED, CANCELLED or BUDGET_EXHAUSTED
};

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_EXIT_CODES_H_
