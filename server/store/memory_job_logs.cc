// InMemoryJobStore: job logs, kept as SQLite keeps them.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log_lines.h"
#include "common/names.h"
#include "google/protobuf/util/time_util.h"
#include "server/store/memory_job_store.h"

namespace tally::store {
namespace {

class MemoryLogTable final : public logs::LogTable {
 public:
  explicit MemoryLogTable(logs::LogState* state, std::map<int64_t, tally::v1::LogLine>* lines)
      : state_(state), lines_(lines) {}
  absl::StatusOr<logs::LogState> ReadState(int64_t) override { return *state_; }
  absl::Status WriteState(int64_t, const logs::LogState& state) override {
    *state_ = state;
    return absl::OkStatus();
  }
  absl::Status Insert(int64_t, const std::vector<tally::v1::LogLine>& lines) override {
    for (const auto& l : lines) (*lines_)[l.sequence()] = l;
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<logs::StoredLine>> Lines(int64_t) override {
    std::vector<logs::StoredLine> out;
    for (const auto& [seq, l] : *lines_) {
      if (l.attempt() > 0) out.push_back({seq, LogLineCost(l.text())});
    }
    return out;
  }
  absl::Status DeleteThrough(int64_t, int64_t sequence) override {
    lines_->erase(lines_->begin(), lines_->upper_bound(sequence));
    return absl::OkStatus();
  }

 private:
  logs::LogState* state_;
  std::map<int64_t, tally::v1::LogLine>* lines_;
};

bool Matches(const tally::v1::LogLine& l, const LogQuery& q) {
  if (l.sequence() <= q.after_sequence) return false;
  const bool job_wide = l.attempt() == 0;
  if (q.attempt != 0 && l.attempt() != q.attempt && !job_wide) return false;
  if (q.rank >= 0 && l.rank() != q.rank && !job_wide) return false;
  return google::protobuf::util::TimeUtil::TimestampToMicroseconds(l.time()) >= q.since_micros;
}

}  // namespace

absl::StatusOr<logs::AppendResult> InMemoryJobStore::AppendJobLogs(
    int64_t job_id, std::vector<tally::v1::LogLine> lines, int64_t keep_bytes) {
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(job_id)) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
  // On a failed step nothing is kept: the append works on a copy.
  LogEntry copy = logs_[job_id];
  MemoryLogTable table(&copy.state, &copy.lines);
  absl::StatusOr<logs::AppendResult> r = logs::AppendLogs(table, job_id, std::move(lines), keep_bytes);
  if (r.ok()) logs_[job_id] = std::move(copy);
  return r;
}

absl::StatusOr<std::vector<tally::v1::LogLine>> InMemoryJobStore::ListJobLogs(
    int64_t job_id, const LogQuery& q) {
  absl::MutexLock lock(&mu_);
  if (!jobs_.count(job_id)) return absl::NotFoundError(absl::StrCat(JobName(job_id), " not found"));
  std::vector<tally::v1::LogLine> out;
  auto it = logs_.find(job_id);
  if (it == logs_.end()) return out;
  for (const auto& [seq, l] : it->second.lines) {
    if (Matches(l, q)) out.push_back(l);
  }
  const int64_t keep = q.tail > 0 ? std::min(q.tail, q.limit) : q.limit;
  if (static_cast<int64_t>(out.size()) > keep) {
    if (q.tail > 0) {
      out.erase(out.begin(), out.end() - keep);
    } else {
      out.resize(keep);
    }
  }
  return out;
}

}  // namespace tally::store
