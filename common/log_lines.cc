#include "common/log_lines.h"

#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace tally {

bool IsLogLevel(absl::string_view level) {
  return level == "trace" || level == "debug" || level == "info" || level == "warning" ||
         level == "error" || level == "critical";
}

bool IsWorkerLogSource(absl::string_view source) {
  return source == "trainer" || source == "worker";
}

namespace {

// The length of the valid UTF-8 sequence at the start of `s`, 0 if none.
size_t Utf8SequenceLength(absl::string_view s) {
  for (size_t n = 1; n <= 4 && n <= s.size(); ++n) {
    if (IsValidUtf8(s.substr(0, n))) return n;
  }
  return 0;
}

}  // namespace

std::string CapLogText(absl::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  std::string valid;
  valid.reserve(text.size());
  if (IsValidUtf8(text)) {
    valid.assign(text.data(), text.size());
  } else {
    for (size_t i = 0; i < text.size();) {
      const size_t n = Utf8SequenceLength(text.substr(i));
      if (n == 0) {
        valid.push_back('?');
        ++i;
      } else {
        valid.append(text.data() + i, n);
        i += n;
      }
    }
  }
  if (valid.size() <= kMaxLogLineBytes) return valid;
  const std::string suffix = absl::StrCat(" [cut: ", valid.size(), " bytes]");
  size_t keep = kMaxLogLineBytes - suffix.size();
  // Back to a character boundary (not a UTF-8 continuation byte).
  while (keep > 0 && (static_cast<unsigned char>(valid[keep]) & 0xC0) == 0x80) --keep;
  valid.resize(keep);
  return valid + suffix;
}

int64_t LogLineCost(absl::string_view text) {
  return static_cast<int64_t>(text.size()) + 32;
}

}  // namespace tally
