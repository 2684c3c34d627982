// LogCapture: what an attempt prints, on its way to tallyd. The trainer runs
// in the worker's process, on the attempt's thread, and writes through
// spdlog; AttemptLogScope marks a thread as working for one attempt (rank),
// and the spdlog sink installed by InstallAttemptLogSink() hands every line
// logged on such a thread to that attempt's LogCapture, split at newlines,
// with its level, its source ("trainer" while the runner runs, "worker" for
// the agent's own messages about the attempt) and the time it was logged.
// Lines logged on other threads (the agent's connection, other libraries'
// threads) stay in the worker's own log only.
//
// The agent takes batches (TakeBatches: at most kMaxLogBatchLines lines and
// kMaxLogBatchBytes of text each, one attempt and rank each, oldest first)
// into its outbox before each report of the attempt, before its exit and at
// each heartbeat. Between takes at most `max_bytes` of text are held; past
// that the oldest lines go and the next batch of their attempt says how many
// bytes (LogBatch.dropped_bytes). Thread-safe.
#ifndef TALLY_WORKER_AGENT_LOG_CAPTURE_H_
#define TALLY_WORKER_AGENT_LOG_CAPTURE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tally/v1/workers.pb.h"

namespace tally::worker {

struct AttemptLogKey {
  std::string job;
  int32_t attempt = 0;
  int32_t rank = 0;
  bool operator<(const AttemptLogKey& o) const {
    return std::tie(job, attempt, rank) < std::tie(o.job, o.attempt, o.rank);
  }
  bool operator==(const AttemptLogKey& o) const {
    return job == o.job && attempt == o.attempt && rank == o.rank;
  }
};

struct CapturedLine {
  AttemptLogKey key;
  tally::v1::LogLine line;  // time, level, source, text (capped)
};

// Pure: `lines` (oldest first) as batches within the limits, consecutive
// lines of one attempt and rank together; `dropped` (bytes per key) goes on
// the first batch of its key (or a batch of its own with no lines).
std::vector<tally::v1::LogBatch> BatchLines(const std::vector<CapturedLine>& lines,
                                            const std::map<AttemptLogKey, int64_t>& dropped);

class LogCapture {
 public:
  explicit LogCapture(int64_t max_bytes = int64_t{8} << 20) : max_bytes_(max_bytes) {}
  // One line per line of `text` (CapLogText each).
  void Add(const AttemptLogKey& key, absl::string_view level, absl::string_view source,
           absl::string_view text, absl::Time time);
  std::vector<tally::v1::LogBatch> TakeBatches();

 private:
  const int64_t max_bytes_;
  absl::Mutex mu_;
  std::deque<CapturedLine> lines_ ABSL_GUARDED_BY(mu_);
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<AttemptLogKey, int64_t> dropped_ ABSL_GUARDED_BY(mu_);
};

// While it lives, spdlog lines logged on this thread go to `capture` for
// `key`. Nested scopes are not supported (the inner one ends capture).
class AttemptLogScope {
 public:
  AttemptLogScope(LogCapture* capture, AttemptLogKey key, std::string source);
  ~AttemptLogScope();
  AttemptLogScope(const AttemptLogScope&) = delete;
  AttemptLogScope& operator=(const AttemptLogScope&) = delete;
  void set_source(std::string source);
};

// Adds the capturing sink to spdlog's default logger (once per process).
void InstallAttemptLogSink();

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_LOG_CAPTURE_H_
