#include "server/sched/log_report_checks.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/log_lines.h"
#include "common/text.h"

namespace tally::sched {
namespace {

// 0001-01-01 .. 9999-12-31, as google.protobuf.Timestamp allows.
constexpr int64_t kMinSeconds = -62135596800;
constexpr int64_t kMaxSeconds = 253402300799;

absl::Status CheckLine(int i, const tally::v1::LogLine& l) {
  const std::string f = absl::StrCat("logs.lines[", i, "]");
  if (l.text().size() > kMaxLogLineBytes) {
    return absl::InvalidArgumentError(absl::StrCat(f, ".text: at most ", kMaxLogLineBytes,
                                                   " bytes, got ", l.text().size(),
                                                   "; the worker cuts longer lines"));
  }
  if (l.text().find('\n') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ".text: one line, no newline; the worker splits text into lines"));
  }
  if (!IsLogLevel(l.level())) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ".level: one of trace, debug, info, warning, error, critical; got ",
                     QuoteForMessage(l.level(), 32)));
  }
  if (!IsWorkerLogSource(l.source())) {
    return absl::InvalidArgumentError(absl::StrCat(
        f, ".source: \"trainer\" or \"worker\"; got ", QuoteForMessage(l.source(), 32)));
  }
  if (!l.has_time() || l.time().seconds() < kMinSeconds || l.time().seconds() > kMaxSeconds ||
      l.time().nanos() < 0 || l.time().nanos() > 999999999) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ".time: must be set to a valid timestamp (when the line was captured)"));
  }
  if (l.sequence() != 0 || l.dropped_bytes() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(f, ": sequence and dropped_bytes are tallyd's to set; leave them 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckLogBatch(const tally::v1::LogBatch& b) {
  if (b.job().empty() || b.attempt() < 1) {
    return absl::InvalidArgumentError("logs: job and attempt (>= 1) must name the attempt");
  }
  if (b.rank() < 0 || b.rank() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("logs.rank: 0-65535, got ", b.rank()));
  }
  if (b.dropped_bytes() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("logs.dropped_bytes: must not be negative, got ", b.dropped_bytes()));
  }
  if (b.lines_size() > kMaxLogBatchLines) {
    return absl::InvalidArgumentError(absl::StrCat("logs.lines: at most ", kMaxLogBatchLines,
                                                   " a batch, got ", b.lines_size()));
  }
  int64_t bytes = 0;
  for (int i = 0; i < b.lines_size(); ++i) {
    if (absl::Status s = CheckLine(i, b.lines(i)); !s.ok()) return s;
    bytes += static_cast<int64_t>(b.lines(i).text().size());
  }
  if (bytes > kMaxLogBatchBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "logs.lines: at most ", kMaxLogBatchBytes, " bytes of text a batch, got ", bytes));
  }
  return absl::OkStatus();
}

}  // namespace tally::sched
