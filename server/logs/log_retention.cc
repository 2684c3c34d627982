#include "server/logs/log_retention.h"

#include "absl/strings/str_cat.h"
#include "common/log_lines.h"
#include "common/status_macros.h"

namespace tally::logs {

DropPlan PlanLogDrop(int64_t kept_bytes, int64_t keep_bytes,
                     const std::vector<StoredLine>& oldest) {
  DropPlan plan;
  if (kept_bytes <= keep_bytes) return plan;
  const int64_t low_water = keep_bytes - keep_bytes / 10;
  for (const StoredLine& l : oldest) {
    if (kept_bytes - plan.bytes <= low_water) break;
    plan.through_sequence = l.sequence;
    plan.bytes += l.cost;
    ++plan.lines;
  }
  return plan;
}

tally::v1::LogLine DroppedMarker(int64_t sequence, int64_t total_dropped_bytes,
                                 const google::protobuf::Timestamp& time) {
  tally::v1::LogLine m;
  m.set_sequence(sequence);
  *m.mutable_time() = time;
  m.set_level("warning");
  m.set_source("tally");
  m.set_dropped_bytes(total_dropped_bytes);
  m.set_text(absl::StrCat("[", total_dropped_bytes,
                          " bytes of older output dropped: tallyd keeps the last "
                          "logs.keep_mib of each job]"));
  return m;
}

std::vector<tally::v1::LogLine> LinesOfBatch(const tally::v1::LogBatch& batch) {
  std::vector<tally::v1::LogLine> out;
  out.reserve(batch.lines_size() + 1);
  if (batch.dropped_bytes() > 0) {
    tally::v1::LogLine m;
    if (batch.lines_size() > 0) *m.mutable_time() = batch.lines(0).time();
    m.set_attempt(batch.attempt());
    m.set_rank(batch.rank());
    m.set_level("warning");
    m.set_source("tally");
    m.set_dropped_bytes(batch.dropped_bytes());
    m.set_text(absl::StrCat("[", batch.dropped_bytes(),
                            " bytes of output dropped by the worker: its buffer was full "
                            "while tallyd was out of reach]"));
    out.push_back(std::move(m));
  }
  for (const tally::v1::LogLine& l : batch.lines()) {
    tally::v1::LogLine line = l;
    line.set_sequence(0);
    line.set_dropped_bytes(0);
    line.set_attempt(batch.attempt());
    line.set_rank(batch.rank());
    out.push_back(std::move(line));
  }
  return out;
}

absl::StatusOr<AppendResult> AppendLogs(LogTable& table, int64_t job_id,
                                        std::vector<tally::v1::LogLine> lines,
                                        int64_t keep_bytes) {
  AppendResult result;
  if (lines.empty()) return result;
  ASSIGN_OR_RETURN(LogState state, table.ReadState(job_id));
  result.first_sequence = state.last_sequence + 1;
  for (tally::v1::LogLine& l : lines) {
    l.set_sequence(++state.last_sequence);
    state.kept_bytes += LogLineCost(l.text());
  }
  result.last_sequence = state.last_sequence;
  result.lines = static_cast<int64_t>(lines.size());
  const google::protobuf::Timestamp newest = lines.back().time();
  RETURN_IF_ERROR(table.Insert(job_id, lines));
  if (state.kept_bytes > keep_bytes) {
    ASSIGN_OR_RETURN(const std::vector<StoredLine> stored, table.Lines(job_id));
    const DropPlan drop = PlanLogDrop(state.kept_bytes, keep_bytes, stored);
    if (drop.lines > 0) {
      RETURN_IF_ERROR(table.DeleteThrough(job_id, drop.through_sequence));
      state.kept_bytes -= drop.bytes;
      state.dropped_bytes += drop.bytes;
      result.dropped_bytes = drop.bytes;
      RETURN_IF_ERROR(table.Insert(
          job_id, {DroppedMarker(drop.through_sequence, state.dropped_bytes, newest)}));
    }
  }
  RETURN_IF_ERROR(table.WriteState(job_id, state));
  return result;
}

}  // namespace tally::logs
