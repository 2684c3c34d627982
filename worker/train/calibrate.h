// Timing calibration: what one training step of each of several configs
// costs, measured under the same conditions for all of them. Short bursts of
// each config's step run back to back on this process's device (round r
// starts at config r mod n: A B C, B C A, C A B, ...), so that whatever else
// loads the machine meanwhile loads every config alike. Each burst is a
// Train() of `steps` + 1 steps from the config's own data, model and
// precision (its seed moved by the round, so rounds read different rows),
// with no evaluation and nothing saved; its first step pays for start-up
// (the model built, caches cold) and is not timed.
//
// Thread-safety: runs on the calling thread, like Train().
#ifndef TALLY_WORKER_TRAIN_CALIBRATE_H_
#define TALLY_WORKER_TRAIN_CALIBRATE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "worker/train/stop.h"
#include "worker/train/trainer.h"

namespace tally::train {

struct CalibrationConfig {
  std::string name;
  TrainConfig config;  // its evaluation, checkpoints and resume are ignored
};

struct CalibratedTime {
  std::string name;
  double median_seconds = 0;
  double p10_seconds = 0, p90_seconds = 0;  // nearest-rank percentiles
  int samples = 0;
};

struct CalibrationResult {
  // kSucceeded with every config's time; kFailed naming the config and
  // round that failed (retryable as Train() says); kStopped or kPreempted
  // when `stop` was set (nothing to keep: a new attempt starts over).
  TrainResult::Outcome outcome = TrainResult::Outcome::kFailed;
  std::string reason;
  bool retryable = false;
  int64_t steps_done = 0;  // trained so far, every burst's counted
  std::vector<CalibratedTime> times;
};

// After each burst: the steps trained so far of `total`, and the last
// burst's mean train loss.
using CalibrationProgress = std::function<void(int64_t done, int64_t total, double train_loss)>;

// The steps a calibration trains in all: rounds x configs x (steps + 1).
int64_t CalibrationSteps(int num_configs, int rounds, int steps);

// Never throws. `progress` may be empty.
CalibrationResult Calibrate(const std::vector<CalibrationConfig>& configs, int rounds, int steps,
                            const StopFlag* stop, const CalibrationProgress& progress = {});

// The median and nearest-rank 10th and 90th percentiles of `seconds` (not
// empty), into `t`.
void SummarizeTimes(std::vector<double> seconds, CalibratedTime* t);

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_CALIBRATE_H_
