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
//
// Thread-safety: Request() from any thread; the latest request wins (a
// cancel after a stop that keeps the state stops at once).
#ifndef TALLY_WORKER_TRAIN_STOP_H_
#define TALLY_WORKER_TRAIN_STOP_H_

#include <atomic>
#include <cstdint>

namespace tally::train {

enum class StopKind : uint8_t { kNone, kNow, kKeepState };

class StopFlag {
 public:
  void Request(StopKind kind) { kind_.store(kind, std::memory_order_release); }
  StopKind requested() const { return kind_.load(std::memory_order_acquire); }

 private:
  std::atomic<StopKind> kind_{StopKind::kNone};
};

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_STOP_H_
