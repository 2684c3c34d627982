// An experiment's figures (pure): each run's from its job against the
// target, the ratios to the reference's run of the same replicate, and each
// variant's summary over its replicates (means, 90% intervals, verdict).
// decide.h's passes call FillFigures; the manager's views read what it
// fills.
#ifndef TALLY_SERVER_EXPERIMENTS_FIGURES_H_
#define TALLY_SERVER_EXPERIMENTS_FIGURES_H_

#include <optional>
#include <vector>

#include "server/policy/loss_metric.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::experiments {

// The loss an experiment's target is of, and its variants are judged by
// (target.metric).
policy::LossMetric MetricOf(const tally::v1::ExperimentSpec& spec);

// A job's last evaluation's loss of `metric` (its last evaluation that has
// one), or 0.
double FinalLoss(const tally::v1::Job& job,
                 policy::LossMetric metric = policy::LossMetric::kValLoss);

// A variant's latest and final loss of `metric` (NaN for a quantized one it
// does not have; its final is 0 until it has ended).
double LatestLoss(policy::LossMetric metric, const tally::v1::VariantStatus& v);
double FinalLossOf(policy::LossMetric metric, const tally::v1::VariantStatus& v);

// The index of the reference variant in the spec (target.from_variant, else
// 0).
int ReferenceIndex(const tally::v1::ExperimentSpec& spec);

// Whether run `run` (an index into e.variants) is one of the reference's.
bool IsReference(const tally::v1::Experiment& e, int run);

// The run of the reference with replicate `replicate` (1-based), or -1.
int ReferenceRun(const tally::v1::Experiment& e, int replicate);

// A run's replicate, 1-based (0, from before replicates, reads as 1).
int ReplicateOf(const tally::v1::VariantStatus& v);

// A variant's figures from its job against `target` (0: none known yet), a
// loss of `metric`: the figures to the target are where that metric's curve
// crosses it. Its losses are filled for both metrics (the quantized ones
// when it is evaluated quantized). Leaves name, halved and the ratio as
// they are. With `calibrated` (the experiment's timing calibration of this
// variant), its recipe cost is priced at the calibration's step time
// instead of its own.
void FillVariantFigures(const tally::v1::Job& job, double target, policy::LossMetric metric,
                        tally::v1::VariantStatus* v,
                        const tally::v1::CalibratedStepTime* calibrated = nullptr);

// Each variant's VariantSummary from its runs' figures (FillFigures calls
// it).
void FillSummaries(tally::v1::Experiment* e);

// Fills the timing calibration's status (from `calibration`, its job),
// every variant's figures, the ratios, the summaries and the experiment's
// total (the calibration's cost included).
// `jobs[i]` is variant i's job, nullopt before it has one.
void FillFigures(const std::vector<std::optional<tally::v1::Job>>& jobs,
                 tally::v1::Experiment* e,
                 const std::optional<tally::v1::Job>& calibration = std::nullopt);

}  // namespace tally::experiments

#endif  // TALLY_SERVER_EXPERIMENTS_FIGURES_H_
