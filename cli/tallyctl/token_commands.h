// tallyctl's token commands: `tallyctl token create` and `tallyctl token
// hash`, local (no call to tallyd). Output, errors and exit codes as for the
// other commands (jobs_commands.h).
#ifndef TALLY_CLI_TALLYCTL_TOKEN_COMMANDS_H_
#define TALLY_CLI_TALLYCTL_TOKEN_COMMANDS_H_

#include <vector>

namespace tally::cli {

// Runs `tallyctl token SUB`, args being the command line left after the
// flags (args[2] the subcommand):
//   create  a fresh token (tokens.h) on the first line and on the second the
//           entry of tallyd's token file that admits it, from --name,
//           --tenant and --role;
//   hash    the SHA-256 (hex) of the token on stdin (surrounding whitespace
//           ignored), as tallyd's token file holds it.
// kUsage for a missing or unknown subcommand, an argument, or an entry or
// token that does not pass its checks.
int Token(const std::vector<char*>& args);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_TOKEN_COMMANDS_H_
