// The closest of tallyctl's commands to a word it does not know, so an
// unknown command is answered with what was probably meant (pure).
#ifndef TALLY_CLI_TALLYCTL_SUGGEST_H_
#define TALLY_CLI_TALLYCTL_SUGGEST_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tally::cli {

// The command in `commands` nearest to `word` by edit distance (case
// ignored; a command that `word` starts, or that starts `word`, counts as
// near), or "" when none is within a third of the longer one's length (at
// least 2 edits allowed). Ties go to the earlier command.
std::string ClosestCommand(absl::string_view word, absl::Span<const char* const> commands);

// The one line tallyctl prints for an unknown command: what it was (escaped
// for the terminal), the closest command when there is one, and where the
// list is.
std::string UnknownCommandMessage(absl::string_view word,
                                  absl::Span<const char* const> commands);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_SUGGEST_H_
