#include "server/experiments/verdict.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/text.h"
#include "server/experiments/figures.h"
#include "server/policy/loss_metric.h"

namespace tally::experiments {

using tally::v1::Experiment;
using tally::v1::VariantStatus;

namespace {

// "val_loss 2.5000": the target with the loss it is of.
std::string TargetOf(const Experiment& e) {
  return absl::StrFormat("%s %.4f", policy::LossMetricName(MetricOf(e.spec())),
                         e.target_val_loss());
}

}  // namespace

// The ended experiment's verdict: the variant cheapest to the target by
// recipe cost (what a step of each recipe costs, not when or where it ran),
// or by billed dollars for all when a variant that reached the target has no
// recipe cost (no price, or too few steps to time): the two are never mixed.
std::string Verdict(const Experiment& e, int ref) {
  const bool by_recipe = std::all_of(
      e.variants().begin(), e.variants().end(), [](const VariantStatus& v) {
        return !v.reached_target() || v.recipe_cost_to_target_usd() > 0;
      });
  auto figure = [by_recipe](const VariantStatus& v) {
    return by_recipe ? v.recipe_cost_to_target_usd() : v.cost_to_target_usd();
  };
  const VariantStatus* best = nullptr;
  for (const auto& v : e.variants()) {
    if (v.reached_target() && (best == nullptr || figure(v) < figure(*best))) best = &v;
  }
  std::string reason = "every variant ended";
  if (e.target_val_loss() <= 0) {
    absl::StrAppend(&reason, "; no target was known");
    return reason;
  }
  if (best == nullptr) {
    absl::StrAppend(&reason, "; no variant reached the target ", TargetOf(e));
    return reason;
  }
  absl::StrAppendFormat(&reason, "; cheapest to the target %s: %s at %s %s", TargetOf(e),
                        best->name(), FormatDollars(figure(*best)),
                        by_recipe ? "by recipe cost" : "billed");
  if (by_recipe) {
    absl::StrAppend(&reason, " (", FormatDollars(best->cost_to_target_usd()), " billed)");
  }
  const VariantStatus& rv = e.variants(ref);
  const double ratio =
      by_recipe ? best->recipe_ratio_to_reference() : best->ratio_to_reference();
  if (best->name() != rv.name() && ratio > 0) {
    absl::StrAppendFormat(&reason, ", %.2fx %s's %s", ratio, rv.name(), FormatDollars(figure(rv)));
  }
  absl::StrAppend(&reason,
                  "; one run of each, so no interval (set replicates to run each several times)");
  return reason;
}

// The verdict over replicates: the variant with the lowest mean recipe cost
// to the target, with its 90% interval, and whether its ratio to the
// reference is told apart from 1.
std::string ReplicatesVerdict(const Experiment& e) {
  std::string reason = "every variant ended";
  if (e.target_val_loss() <= 0) return reason + "; no target was known";
  const tally::v1::VariantSummary* best = nullptr;
  const tally::v1::VariantSummary* ref = nullptr;
  for (const auto& s : e.summaries()) {
    if (s.verdict() == "reference") ref = &s;
    if (s.recipe_cost_to_target_usd() > 0 &&
        (best == nullptr || s.recipe_cost_to_target_usd() < best->recipe_cost_to_target_usd())) {
      best = &s;
    }
  }
  if (best == nullptr) {
    absl::StrAppend(&reason, "; no variant reached the target ", TargetOf(e),
                    " with a recipe cost");
    return reason;
  }
  absl::StrAppendFormat(&reason,
                        "; lowest mean recipe cost to the target %s: %s at %s (90%% interval "
                        "%s to %s, %d of %d runs reached it)",
                        TargetOf(e), best->name(),
                        FormatDollars(best->recipe_cost_to_target_usd()),
                        FormatDollars(best->recipe_cost_ci90_low_usd()),
                        FormatDollars(best->recipe_cost_ci90_high_usd()),
                        best->reached_target(), best->replicates());
  if (best != ref && ref != nullptr && best->recipe_ratio_to_reference() > 0) {
    absl::StrAppendFormat(&reason, ", %.2fx %s's (90%% interval %.2fx to %.2fx over %d pairs): %s",
                          best->recipe_ratio_to_reference(), ref->name(),
                          best->recipe_ratio_ci90_low(), best->recipe_ratio_ci90_high(),
                          best->ratio_pairs(), best->verdict());
  }
  return reason;
}

}  // namespace tally::experiments
