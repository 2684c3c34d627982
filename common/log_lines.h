// What a log line of an attempt may be, on both sides of the Workers stream:
// the limits of a LogBatch (workers.proto) and the text of one line. Pure.
#ifndef TALLY_COMMON_LOG_LINES_H_
#define TALLY_COMMON_LOG_LINES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace tally {

// A LogBatch holds at most this many lines and bytes of text; one line's
// text at most kMaxLogLineBytes.
inline constexpr int kMaxLogBatchLines = 512;
inline constexpr int64_t kMaxLogBatchBytes = 256 << 10;
inline constexpr size_t kMaxLogLineBytes = 4096;

// LogLine.level and LogLine.source values a worker may send.
bool IsLogLevel(absl::string_view level);
bool IsWorkerLogSource(absl::string_view source);

// `text` as one LogLine.text: trailing newlines dropped, bytes that are not
// valid UTF-8 replaced by '?', and cut to kMaxLogLineBytes at a character
// boundary ending in " [cut: N bytes]" when longer. Control characters stay
// (readers escape them when they print).
std::string CapLogText(absl::string_view text);

// What one line counts for against a batch's or a job's byte limits: its
// text and a fixed allowance for its other fields.
int64_t LogLineCost(absl::string_view text);

}  // namespace tally

#endif  // TALLY_COMMON_LOG_LINES_H_
