// An experiment's report as one SVG image: every variant's validation loss
// against what it had spent at each evaluation, with the target and where
// each variant crossed it.
//
// The renderer is a pure function of its inputs (no I/O, no clock) and is
// thread-safe. Its output is a self-contained SVG 1.1 document (no external
// fonts, scripts or style sheets) that is well-formed XML whatever the input:
// every string from the experiment is checked as UTF-8 (bad bytes and control
// characters become U+FFFD), escaped, and cut to a readable length.
#ifndef TALLY_CLI_TALLYCTL_EXPERIMENT_REPORT_H_
#define TALLY_CLI_TALLYCTL_EXPERIMENT_REPORT_H_

#include <string>
#include <vector>

#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::cli {

// One variant's evaluation curve, in the order the evaluations happened.
struct VariantCurve {
  std::string variant;
  std::vector<tally::v1::EvalPoint> curve;
};

// How the report draws its axes.
struct ReportOptions {
  // x: recipe dollars (each evaluation's step at the variant's recipe price
  // per step, VariantStatus.recipe_usd_per_step: what the recipe costs
  // wherever it ran), when every plotted variant has one; billed dollars
  // (what each evaluation had cost on tallyd's clock) otherwise, or when
  // `billed` asks for them.
  bool billed = false;
  // y: the region around the target (from just under the lowest loss to
  // 35% above the target), curves clipped at its top edge, when there is a
  // target and the curves start above that; false: every loss.
  bool zoom = true;
};

// Renders validation loss (y) against dollars spent (x) for every variant:
//  - one <path class="variant" data-variant="NAME"> per variant with at least
//    one plottable evaluation (a single evaluation also gets a dot), its
//    colour fixed by the variant's place in experiment.variants() (then by
//    its place in `curves` for a name the experiment does not list), from a
//    ten-colour palette; variants past the tenth are drawn dashed;
//  - a dashed horizontal line (class="target") at experiment.target_val_loss()
//    when it is > 0, and a marker (class="crossing" data-variant="NAME") at
//    (cost_to_target_usd, target) for every VariantStatus that reached it;
//  - with replicates (spec.replicates > 1), the first run of each variant is
//    its curve, and a whisker (class="interval" data-variant="NAME") on the
//    target line spans the 90% interval of the variant's mean to the target
//    (recipe dollars or tokens; none on a billed axis);
//  - linear axes with round ticks, a legend with each variant's cost to the
//    target (or why there is none), and a title with the experiment's display
//    name and name.
// When no plotted evaluation has a cost above 0 (no prices configured), the
// x axis is tokens instead and its label says so; crossing markers then sit
// at tokens_to_target (at recipe_cost_to_target_usd on a recipe axis). Evaluations whose loss or x value is NaN, infinite or
// beyond 1e100 in magnitude are skipped. With nothing to plot (no variants,
// no evaluations) the image is still valid and says "no evaluations yet".
std::string RenderExperimentSvg(const tally::v1::Experiment& experiment,
                                const std::vector<VariantCurve>& curves,
                                const ReportOptions& options = {});

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_EXPERIMENT_REPORT_H_
