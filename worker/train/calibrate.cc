#include "worker/train/calibrate.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tally::train {
namespace {

// Collects one burst's step times (its first step, start-up, left out) and
// train losses.
class BurstEvents final : public TrainEvents {
 public:
  void OnStep(const StepMetrics& m) override {
    if (m.step > 1 && std::isfinite(m.step_seconds) && m.step_seconds > 0) {
      seconds.push_back(m.step_seconds);
    }
    if (std::isfinite(m.train_loss)) {
      loss_sum += m.train_loss;
      ++losses;
    }
  }
  std::vector<double> seconds;
  double loss_sum = 0;
  int losses = 0;
};

// The config as one burst trains it: `steps` + 1 steps, no evaluation,
// nothing saved or resumed, the seed moved by the round.
TrainConfig BurstConfig(const TrainConfig& c, int round, int steps) {
  TrainConfig b = c;
  b.max_steps = steps + 1;
  b.eval_interval_steps = 0;
  b.checkpoint_interval_steps = 0;
  b.checkpoint_dir.clear();
  b.checkpoint_root.clear();
  b.resume_path.clear();
  b.resume_sha256.clear();
  b.seed = c.seed + static_cast<uint64_t>(round);
  return b;
}

}  // namespace

int64_t CalibrationSteps(int num_configs, int rounds, int steps) {
  return int64_t{num_configs} * rounds * (int64_t{steps} + 1);
}

void SummarizeTimes(std::vector<double> seconds, CalibratedTime* t) {
  std::sort(seconds.begin(), seconds.end());
  const size_t n = seconds.size();
  t->samples = static_cast<int>(n);
  if (n == 0) return;
  t->median_seconds = n % 2 ? seconds[n / 2] : (seconds[n / 2 - 1] + seconds[n / 2]) / 2;
  auto rank = [&](double q) {
    const size_t r = static_cast<size_t>(std::ceil(q * static_cast<double>(n)));
    return seconds[std::clamp<size_t>(r, 1, n) - 1];
  };
  t->p10_seconds = rank(0.1);
  t->p90_seconds = rank(0.9);
}

CalibrationResult Calibrate(const std::vector<CalibrationConfig>& configs, int rounds, int steps,
                            const StopFlag* stop, const CalibrationProgress& progress) {
  CalibrationResult out;
  const int n = static_cast<int>(configs.size());
  if (n == 0 || rounds < 1 || steps < 1) {
    out.reason = absl::StrCat("calibration: needs at least one config, one round and one step ",
                              "(got ", n, " configs, ", rounds, " rounds, ", steps, " steps)");
    return out;
  }
  const int64_t total = CalibrationSteps(n, rounds, steps);
  std::vector<std::vector<double>> seconds(n);
  for (int round = 0; round < rounds; ++round) {
    for (int k = 0; k < n; ++k) {
      if (stop != nullptr && stop->requested() != StopKind::kNone) {
        const bool preempt = stop->requested() == StopKind::kPreempt;
        out.outcome =
            preempt ? TrainResult::Outcome::kPreempted : TrainResult::Outcome::kStopped;
        out.reason = absl::StrCat("calibration ", preempt ? "preempted" : "stopped",
                                  " after ", out.steps_done, " of ", total,
                                  " steps; nothing is kept (it starts over)");
        out.retryable = preempt;
        return out;
      }
      const int i = (round + k) % n;
      const CalibrationConfig& c = configs[i];
      BurstEvents events;
      const TrainResult r = Train(BurstConfig(c.config, round, steps), &events, stop);
      out.steps_done += r.step;
      if (r.outcome != TrainResult::Outcome::kSucceeded) {
        if (r.outcome == TrainResult::Outcome::kFailed) {
          out.reason = absl::StrCat("calibration of ", c.name, " (round ", round + 1, " of ",
                                    rounds, "): ", r.reason);
          out.retryable = r.retryable;
        } else {
          out.outcome = r.outcome;
          out.reason = absl::StrCat("calibration stopped in ", c.name, ": ", r.reason);
          out.retryable = r.outcome == TrainResult::Outcome::kPreempted;
        }
        return out;
      }
      seconds[i].insert(seconds[i].end(), events.seconds.begin(), events.seconds.end());
      if (progress) {
        progress(out.steps_done, total, events.losses ? events.loss_sum / events.losses : 0);
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    if (seconds[i].empty()) {
      out.reason = absl::StrCat("calibration of ", configs[i].name, ": no step was timed");
      return out;
    }
    CalibratedTime& t = out.times.emplace_back();
    t.name = configs[i].name;
    SummarizeTimes(std::move(seconds[i]), &t);
  }
  out.outcome = TrainResult::Outcome::kSucceeded;
  out.reason = absl::StrCat("calibrated ", n, " specs: ", rounds, " rounds of ", steps,
                            " timed steps each");
  return out;
}

}  // namespace tally::train
