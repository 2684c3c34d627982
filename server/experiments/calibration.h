// An experiment's timing calibration (pure): which variants one worker can
// time side by side, the calibration job's spec, and its state and times as
// the experiment shows them (Experiment.calibration).
//
// By default (ExperimentTiming.calibrate unset or true) an experiment with
// at least two variants that each run on one GPU of the reference's GPU type
// gets one calibration job (JobSpec.calibration): it runs short bursts of
// each such variant's step back to back on one worker, so that each is timed
// under the same conditions whatever else ran beside it and whenever the
// variant itself ran. Each variant's recipe cost is then priced at the
// calibration's median step time (figures.h); a variant the calibration
// cannot time (more GPUs, another GPU type), or every variant while the
// calibration has not succeeded, keeps its own step times, and the variant's
// timing_calibrated says which. The calibration is an ordinary job of the
// experiment's tenant: billed, counted in the experiment's cost_usd and
// budget, cancelled with it.
#ifndef TALLY_SERVER_EXPERIMENTS_CALIBRATION_H_
#define TALLY_SERVER_EXPERIMENTS_CALIBRATION_H_

#include <optional>
#include <string>
#include <vector>

#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::experiments {

struct CalibrationPlan {
  // The calibration job's spec (labels added at submission); nullopt when
  // the experiment has none.
  std::optional<tally::v1::JobSpec> spec;
  // Why some variants (or all) are not calibrated; empty when all are.
  std::string note;
};

// From the experiment's spec and each variant's resolved spec (its first
// run's), in the variants' order. `display_name` is the experiment's (or
// "experiment").
CalibrationPlan PlanCalibration(const tally::v1::ExperimentSpec& spec,
                                const std::vector<tally::v1::JobSpec>& variants,
                                const std::string& display_name);

// Experiment.calibration from its job; leaves enabled and the note as they
// are, and everything as it is without a job (none yet, or not passed).
void FillCalibration(const std::optional<tally::v1::Job>& job, tally::v1::Experiment* e);

// The calibration's time for `variant`, once it succeeded; else nullptr.
const tally::v1::CalibratedStepTime* CalibratedTimeOf(const tally::v1::Experiment& e,
                                                      const std::string& variant);

// One sentence for the verdict on how the variants were timed.
std::string TimingSentence(const tally::v1::Experiment& e);

}  // namespace tally::experiments

#endif  // TALLY_SERVER_EXPERIMENTS_CALIBRATION_H_
