#include "cli/tallyctl/suggest.h"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace tally::cli {
namespace {

size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string ClosestCommand(absl::string_view word, absl::Span<const char* const> commands) {
  const std::string lower = absl::AsciiStrToLower(word);
  if (lower.empty()) return "";
  std::string best;
  size_t best_distance = 0;
  for (const char* command : commands) {
    const absl::string_view c(command);
    size_t d = EditDistance(lower, c);
    // "check" for checkpoints, "experiments" for experiment.
    if (lower.size() >= 3 && (absl::StartsWith(c, lower) || absl::StartsWith(lower, c))) d = 1;
    const size_t allowed = std::max<size_t>(2, std::max(lower.size(), c.size()) / 3);
    if (d <= allowed && (best.empty() || d < best_distance)) {
      best = std::string(c);
      best_distance = d;
    }
  }
  return best;
}

std::string UnknownCommandMessage(absl::string_view word,
                                  absl::Span<const char* const> commands) {
  std::string out = absl::StrCat("tallyctl: unknown command \"", EscapeUnprintable(word), "\"");
  if (std::string closest = ClosestCommand(word, commands); !closest.empty()) {
    absl::StrAppend(&out, "; did you mean \"", closest, "\"?");
  }
  absl::StrAppend(&out, " (tallyctl help lists every command)\n");
  return out;
}

}  // namespace tally::cli
