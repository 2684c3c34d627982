// TrainerRunner: runs an assignment with the LibTorch trainer. It maps the
// JobSpec to a TrainConfig, resumes from the assignment's checkpoint, and
// turns the trainer's events into Progress, EvalResult and CheckpointRecord
// reports. Checkpoints go to <checkpoint_dir>/<job>/ (jobs/7 -> job-7), which
// workers that may resume each other's jobs must share, mounted at the same
// resolved path.
//
// Before anything is opened, an assignment fails without retry when its job
// name cannot name a single folder under the checkpoint root, when a dataset
// file it would read resolves outside the data roots (if any are set), or
// when its resume checkpoint resolves outside the job's checkpoint folder
// (path_confinement.h).
//
// A resume checkpoint that is damaged (missing, cut short, a flipped byte,
// not the SHA-256 tallyd recorded, inconsistent contents, or a symlink where
// the file was: train::TrainResult::damaged_checkpoint) fails the attempt
// with AttemptExit.damaged_checkpoint set to resume_from.path, so that
// tallyd resumes from an earlier intact checkpoint; no other failure sets
// it.
//
// Checkpoints are written only into a real job folder (not a symlink) and
// never through a symlinked file; each CheckpointRecord.path is the
// checkpoint's resolved path (no symlink, "." or ".."), a regular file
// directly in the job's folder (train::TrainConfig::checkpoint_root).
//
// An assignment whose spec is a timing calibration (JobSpec.calibration)
// trains nothing of its own: every spec it lists is checked as above, then
// timed in bursts (train/calibrate.h); a SUCCEEDED exit carries each one's
// step time.
//
// A preemption (StopKind::kPreempt) ends the attempt as
// ATTEMPT_OUTCOME_PREEMPTED, after the checkpoint of its last step is
// reported; the runner leaves AttemptExit.preemption_cause to the agent,
// which knows why.
#ifndef TALLY_WORKER_AGENT_TRAINER_RUNNER_H_
#define TALLY_WORKER_AGENT_TRAINER_RUNNER_H_

#include <string>

#include "worker/agent/path_confinement.h"
#include "worker/agent/runner.h"

namespace tally::worker {

struct TrainerRunnerOptions {
  std::string device = "cpu";
  std::string checkpoint_dir = "tally-checkpoints";
  // Where datasets may be read from; none: anywhere.
  DataRoots data_roots;
  double peak_flops = 0;
  std::string rendezvous_local_host = "127.0.0.1";  // this worker's address for Gloo
  double collective_timeout_seconds = 120;
  // Tests only: forced FP8 overflows, grouped FP8 expert products turned
  // off and MoE routing collapse in every assignment, and a delay before every preemption's checkpoint
  // (train::TrainConfig's test_* fields); off by default.
  double test_fp8_overflow_fraction = 0;
  std::string test_fp8_grouped_off;
  int64_t test_moe_forced_expert = -1;
  double test_preempt_checkpoint_delay_seconds = 0;
};

class TrainerRunner final : public Runner {
 public:
  explicit TrainerRunner(TrainerRunnerOptions options) : options_(std::move(options)) {}
  tally::v1::AttemptExit Run(const tally::v1::Assignment& assignment, Reporter* reporter,
                             const train::StopFlag* stop) override;

 private:
  // A timing calibration (JobSpec.calibration): every spec's step timed in
  // bursts (train/calibrate.h), reported on the exit; Progress after each
  // burst (steps so far, the burst's mean train loss, no tokens).
  tally::v1::AttemptExit Calibrate(const tally::v1::Assignment& assignment, Reporter* reporter,
                                   const train::StopFlag* stop);

  const TrainerRunnerOptions options_;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_TRAINER_RUNNER_H_
