// Outbox: the messages an agent has for tallyd, in the order the stream
// carries them. Progress is a gauge, so a newer progress of an attempt may
// take the place of a queued one, but only when nothing else of that job is
// queued after it: evaluations, checkpoints and exits keep their place
// relative to progress, and the step tallyd sees never goes backwards (a
// progress older than something of its attempt already queued is dropped).
//
// A stream writes the queue front to back. What it wrote stays at the front
// until tallyd acknowledges it (Ack): a tallyd that dies before committing a
// report it read loses nothing, since the next stream writes every
// unacknowledged message again, first and in order (Rewind). Written
// messages are never replaced, and nothing goes ahead of them. With a tallyd
// that does not acknowledge, written messages are dropped at once.
// PushUrgent (a preemption notice) goes ahead of everything not written.
//
// Log batches (LogBatch) are bounded: past kMaxQueuedLogBytes of unwritten
// log text (a worker out of reach of tallyd), the oldest unwritten batches
// are dropped and the next batch of their attempt and rank carries the count
// (LogBatch.dropped_bytes).
//
// Not thread-safe: the agent holds its mutex around every call.
#ifndef TALLY_WORKER_AGENT_OUTBOX_H_
#define TALLY_WORKER_AGENT_OUTBOX_H_

#include <cstdint>
#include <deque>

#include "tally/v1/workers.pb.h"

namespace tally::worker {

class Outbox {
 public:
  void Push(tally::v1::WorkerMessage m);
  // Ahead of every queued message not written yet.
  void PushUrgent(tally::v1::WorkerMessage m);
  // Between streams only (after Rewind: nothing is written): drops the
  // queued notices and puts `notice` first.
  void ReplaceNotice(tally::v1::WorkerMessage notice);

  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  const tally::v1::WorkerMessage& front() const { return queue_.front(); }
  const std::deque<tally::v1::WorkerMessage>& messages() const { return queue_; }

  // Writing. True while a message waits to be written on this stream.
  bool HasUnwritten() const { return written_ < queue_.size(); }
  // The next message to write, numbered `seq` (WorkerMessage.seq; 0 for a
  // tallyd that does not acknowledge). It counts as written from now on.
  tally::v1::WorkerMessage TakeNext(uint64_t seq);
  // tallyd took every message numbered up to `seq` on this stream: they
  // leave the queue.
  void Ack(uint64_t seq);
  // A tallyd that does not acknowledge: what was written leaves the queue.
  void DropWritten();
  // A new stream: nothing on it is written yet, so what the last one wrote
  // and tallyd did not acknowledge is written again, first.
  void Rewind() { written_ = 0; }
  size_t written() const { return written_; }

  static constexpr int64_t kMaxQueuedLogBytes = int64_t{8} << 20;

 private:
  void PushLogs(tally::v1::WorkerMessage m);
  std::deque<tally::v1::WorkerMessage> queue_;
  size_t written_ = 0;  // the front messages written on this stream
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_OUTBOX_H_
