// Outbox: the messages an agent has for tallyd, in the order the stream
// carries them. Progress is a gauge, so a newer progress of an attempt may
// take the place of a queued one, but only when nothing else of that job is
// queued after it: evaluations, checkpoints and exits keep their place
// relative to progress, and the step tallyd sees never goes backwards (a
// progress older than something of its attempt already queued is dropped).
// The front message may be on the wire: it is never replaced.
// PushUrgent (a preemption notice) goes ahead of everything but that front
// message.
//
// Not thread-safe: the agent holds its mutex around every call.
#ifndef TALLY_WORKER_AGENT_OUTBOX_H_
#define TALLY_WORKER_AGENT_OUTBOX_H_

#include <deque>

#include "tally/v1/workers.pb.h"

namespace tally::worker {

class Outbox {
 public:
  void Push(tally::v1::WorkerMessage m);
  // Second in line (first when empty): ahead of every queued report but the
  // front one, which may be on the wire.
  void PushUrgent(tally::v1::WorkerMessage m);
  // Between connections only (nothing is on the wire): drops the queued
  // notices and puts `notice` first.
  void ReplaceNotice(tally::v1::WorkerMessage notice);
  bool empty() const { return queue_.empty(); }
  size_t size() const { return queue_.size(); }
  const tally::v1::WorkerMessage& front() const { return queue_.front(); }
  void PopFront() { queue_.pop_front(); }
  const std::deque<tally::v1::WorkerMessage>& messages() const { return queue_; }

 private:
  std::deque<tally::v1::WorkerMessage> queue_;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_OUTBOX_H_
