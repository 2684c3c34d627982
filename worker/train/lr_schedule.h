// The learning-rate schedule (pure): linear warmup from 0 to `lr` over
// `warmup_steps`, then a cosine from `lr` down to `min_lr` at `max_steps`.
// Steps are 1-based: the rate used for optimizer step s.
#ifndef TALLY_WORKER_TRAIN_LR_SCHEDULE_H_
#define TALLY_WORKER_TRAIN_LR_SCHEDULE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tally::train {

inline double LearningRate(int64_t step, double lr, double min_lr, int64_t warmup_steps,
                           int64_t max_steps) {
  if (warmup_steps > 0 && step <= warmup_steps) {
    return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  }
  if (max_steps <= warmup_steps) return lr;
  const double progress = std::clamp(
      static_cast<double>(step - warmup_steps) / static_cast<double>(max_steps - warmup_steps),
      0.0, 1.0);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

// Counts consecutive optimizer steps whose loss or gradient norm was not
// finite; the trainer skips those updates and fails after `limit` in a row.
class NonFiniteGuard {
 public:
  explicit NonFiniteGuard(int limit) : limit_(limit) {}
  // Returns true when the run must stop.
  bool Observe(bool finite) {
    streak_ = finite ? 0 : streak_ + 1;
    return streak_ >= limit_;
  }
  int streak() const { return streak_; }

 private:
  int limit_;
  int streak_ = 0;
};

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_LR_SCHEDULE_H_
