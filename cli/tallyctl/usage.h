// tallyctl's usage text: every command, the flags they share, the config
// file and the exit codes. Printed by `tallyctl help`, and on stderr when the
// command is missing or unknown; --help prints it too.
#ifndef TALLY_CLI_TALLYCTL_USAGE_H_
#define TALLY_CLI_TALLYCTL_USAGE_H_

namespace tally::cli {

extern const char kUsageText[];

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_USAGE_H_
