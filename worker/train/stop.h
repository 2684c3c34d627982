// StopFlag: how whoever controls a training run asks it to stop. Header-only
// and free of LibTorch and protobuf, so the agent (which has neither the
// trainer nor ATen) and the trainer share it.
//
//   kNow        stop at once: between micro-batches with one rank, at the
//               end of the step (not applied) with several; nothing is kept
//               beyond the checkpoints already written.
//   kKeepState  finish the step under way, then evaluate the state if the
//               latest evaluation is of another step and write a checkpoint
//               unless the latest one is of this step (both reported, in
//               that order), and stop. Without a checkpoint directory it is
//               a stop at the next step boundary.
//   kPreempt    the worker is going away or its slots are wanted (a
//               preemption): finish the step under way, write a checkpoint
//               of it unless the latest one is of this step (reported), and
//               stop, WITHOUT evaluating (time matters under a deadline; the
//               next attempt evaluates). Without a checkpoint directory it
//               is a stop at the next step boundary.
//
// Requests combine by precedence, not order: kNow > kPreempt > kKeepState.
// A cancel after a preemption (or a stop that keeps the state) stops at
// once; a preemption after a stop that keeps the state skips its
// evaluation; nothing weaker undoes a stronger request.
//
// Thread-safety: Request() from any thread.
#ifndef TALLY_WORKER_TRAIN_STOP_H_
#define TALLY_WORKER_TRAIN_STOP_H_

#include <atomic>
#include <cstdint>

namespace tally::train {

// Ordered by precedence: a request never replaces a stronger one.
enum class StopKind : uint8_t { kNone, kKeepState, kPreempt, kNow };

class StopFlag {
 public:
  void Request(StopKind kind) {
    StopKind current = kind_.load(std::memory_order_acquire);
    while (current < kind &&
           !kind_.compare_exchange_weak(current, kind, std::memory_order_acq_rel)) {
    }
  }
  StopKind requested() const { return kind_.load(std::memory_order_acquire); }

 private:
  std::atomic<StopKind> kind_{StopKind::kNone};
};

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_STOP_H_
