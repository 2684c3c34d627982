// What tallyd keeps of a job's output, decided as pure code: the lines a
// worker's batch becomes, and which of a job's oldest lines go once it holds
// more than its limit (logs.keep_mib). A store runs the decision inside the
// transaction that appends the batch (AppendLogs below), so a crash leaves
// all of an append and its drop or none.
//
// Dropping works down to 90% of the limit, so it happens once per tenth of
// the limit appended rather than on every batch. What was dropped is
// replaced by one marker line (source "tally", dropped_bytes the job's total
// so far) at the sequence of the newest line dropped, so a page that starts
// at the oldest kept line begins with it.
#ifndef TALLY_SERVER_LOGS_LOG_RETENTION_H_
#define TALLY_SERVER_LOGS_LOG_RETENTION_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/workers.pb.h"

namespace tally::logs {

// A stored line as the drop decision sees it.
struct StoredLine {
  int64_t sequence = 0;
  int64_t cost = 0;  // LogLineCost of its text
};

// Per job: the last sequence given, bytes kept, bytes dropped so far.
struct LogState {
  int64_t last_sequence = 0;
  int64_t kept_bytes = 0;
  int64_t dropped_bytes = 0;
};

struct DropPlan {
  int64_t through_sequence = 0;  // drop every line up to this one; 0: none
  int64_t bytes = 0;
  int64_t lines = 0;
};

// Which of `oldest` (the job's lines, markers excluded, oldest first) to
// drop when `kept_bytes` is over `keep_bytes`: the oldest ones until at most
// 90% of keep_bytes is kept. None when within the limit.
DropPlan PlanLogDrop(int64_t kept_bytes, int64_t keep_bytes,
                     const std::vector<StoredLine>& oldest);

// The marker that stands for everything dropped so far.
tally::v1::LogLine DroppedMarker(int64_t sequence, int64_t total_dropped_bytes,
                                 const google::protobuf::Timestamp& time);

// The lines a batch stores, without sequences: a marker first when the
// worker dropped output (batch.dropped_bytes > 0), then its lines with the
// batch's attempt and rank.
std::vector<tally::v1::LogLine> LinesOfBatch(const tally::v1::LogBatch& batch);

// The steps of an append, as a store runs them inside one transaction.
class LogTable {
 public:
  virtual ~LogTable() = default;
  virtual absl::StatusOr<LogState> ReadState(int64_t job_id) = 0;
  virtual absl::Status WriteState(int64_t job_id, const LogState& state) = 0;
  // Lines with their sequences set.
  virtual absl::Status Insert(int64_t job_id, const std::vector<tally::v1::LogLine>& lines) = 0;
  // Every stored line that is not a marker, oldest first.
  virtual absl::StatusOr<std::vector<StoredLine>> Lines(int64_t job_id) = 0;
  // Deletes every line (markers too) up to `sequence`.
  virtual absl::Status DeleteThrough(int64_t job_id, int64_t sequence) = 0;
};

struct AppendResult {
  int64_t first_sequence = 0;  // of the lines stored; 0 when none
  int64_t last_sequence = 0;
  int64_t lines = 0;
  int64_t dropped_bytes = 0;   // dropped by this append
};

// Gives `lines` the job's next sequences, stores them and drops the oldest
// over `keep_bytes`, replacing them with one marker.
absl::StatusOr<AppendResult> AppendLogs(LogTable& table, int64_t job_id,
                                        std::vector<tally::v1::LogLine> lines,
                                        int64_t keep_bytes);

}  // namespace tally::logs

#endif  // TALLY_SERVER_LOGS_LOG_RETENTION_H_
