#include "worker/agent/outbox.h"

#include <algorithm>
#include <cstddef>
#include <string>

namespace tally::worker {
namespace {

using tally::v1::WorkerMessage;

// The job, attempt and step a report is about; false for anything else.
bool About(const WorkerMessage& m, std::string* job, int32_t* attempt, int64_t* step) {
  switch (m.msg_case()) {
    case WorkerMessage::kProgress:
      *job = m.progress().job(), *attempt = m.progress().attempt(), *step = m.progress().step();
      return true;
    case WorkerMessage::kEval:
      *job = m.eval().job(), *attempt = m.eval().attempt(), *step = m.eval().step();
      return true;
    case WorkerMessage::kCheckpoint:
      *job = m.checkpoint().job(), *attempt = m.checkpoint().attempt();
      *step = m.checkpoint().step();
      return true;
    case WorkerMessage::kExit:
      *job = m.exit().job(), *attempt = m.exit().attempt(), *step = m.exit().step();
      return true;
    default:
      return false;
  }
}

int64_t LogBytes(const WorkerMessage& m) {
  int64_t n = 0;
  for (const auto& l : m.logs().lines()) n += static_cast<int64_t>(l.text().size());
  return n;
}

bool SameAttempt(const tally::v1::LogBatch& a, const tally::v1::LogBatch& b) {
  return a.job() == b.job() && a.attempt() == b.attempt() && a.rank() == b.rank();
}

}  // namespace

void Outbox::PushLogs(WorkerMessage m) {
  queue_.push_back(std::move(m));
  int64_t total = 0;
  for (size_t i = written_; i < queue_.size(); ++i) {
    if (queue_[i].has_logs()) total += LogBytes(queue_[i]);
  }
  // Over the limit: the oldest unwritten batches go; the next batch of the
  // same attempt and rank says how many bytes.
  for (size_t i = written_; total > kMaxQueuedLogBytes && i + 1 < queue_.size();) {
    if (!queue_[i].has_logs()) {
      ++i;
      continue;
    }
    const int64_t bytes = LogBytes(queue_[i]);
    const int64_t owed = queue_[i].logs().dropped_bytes() + bytes;
    for (size_t j = i + 1; j < queue_.size(); ++j) {
      if (queue_[j].has_logs() && SameAttempt(queue_[j].logs(), queue_[i].logs())) {
        auto* next = queue_[j].mutable_logs();
        next->set_dropped_bytes(next->dropped_bytes() + owed);
        break;
      }
    }
    queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
    total -= bytes;
  }
}

void Outbox::Push(WorkerMessage m) {
  if (m.has_logs()) return PushLogs(std::move(m));
  if (m.has_progress()) {
    const tally::v1::Progress& p = m.progress();
    bool merge_closed = false;  // something else of this job is queued after
    // From the back; the written front is never replaced.
    for (size_t i = queue_.size(); i-- > 0;) {
      std::string job;
      int32_t attempt = 0;
      int64_t step = 0;
      if (!About(queue_[i], &job, &attempt, &step) || job != p.job()) continue;
      if (attempt == p.attempt() && step > p.step()) return;  // would go backwards
      if (merge_closed || i < written_) continue;
      if (queue_[i].has_progress() && attempt == p.attempt()) {
        queue_[i] = std::move(m);
        return;
      }
      merge_closed = true;
    }
  }
  queue_.push_back(std::move(m));
}

void Outbox::PushUrgent(WorkerMessage m) {
  queue_.insert(queue_.begin() + static_cast<std::ptrdiff_t>(written_), std::move(m));
}

void Outbox::ReplaceNotice(WorkerMessage notice) {
  written_ = 0;
  queue_.erase(std::remove_if(queue_.begin(), queue_.end(),
                              [](const WorkerMessage& m) { return m.has_notice(); }),
               queue_.end());
  queue_.push_front(std::move(notice));
}

WorkerMessage Outbox::TakeNext(uint64_t seq) {
  WorkerMessage& m = queue_[written_++];
  m.set_seq(seq);
  return m;
}

void Outbox::Ack(uint64_t seq) {
  // Numbers rise along the written front; 0 (never written numbered) is
  // never acknowledged.
  while (written_ > 0 && queue_.front().seq() != 0 && queue_.front().seq() <= seq) {
    queue_.pop_front();
    --written_;
  }
}

void Outbox::DropWritten() {
  queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(written_));
  written_ = 0;
}

}  // namespace tally::worker
