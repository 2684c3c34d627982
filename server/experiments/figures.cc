#include "server/experiments/figures.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "server/experiments/calibration.h"
#include "server/ledger/cost_ledger.h"
#include "server/policy/replicates.h"
#include "server/policy/step_times.h"
#include "server/policy/target.h"
#include "server/sched/eval_decision.h"
#include "server/store/job_store.h"

namespace tally::experiments {

using tally::v1::Experiment;
using tally::v1::Job;
using tally::v1::VariantStatus;

policy::LossMetric MetricOf(const tally::v1::ExperimentSpec& spec) {
  return policy::ParseLossMetric(spec.target().metric());
}

// The last evaluation's loss, or 0.
double FinalLoss(const Job& job, policy::LossMetric metric) {
  for (int i = job.curve_size() - 1; i >= 0; --i) {
    const double l = policy::LossOf(metric, job.curve(i));
    if (std::isfinite(l) && l > 0) return l;
  }
  return 0;
}

double LatestLoss(policy::LossMetric metric, const VariantStatus& v) {
  return policy::LossOf(metric, v);
}

double FinalLossOf(policy::LossMetric metric, const VariantStatus& v) {
  if (metric == policy::LossMetric::kValLoss) return v.final_val_loss();
  return v.has_final_quantized_val_loss() ? v.final_quantized_val_loss()
                                          : std::numeric_limits<double>::quiet_NaN();
}

namespace {

// The lowest finite positive loss of `metric` on the job's curve, or 0.
double BestLoss(const Job& job, policy::LossMetric metric) {
  double best = 0;
  for (const auto& pt : job.curve()) {
    const double l = policy::LossOf(metric, pt);
    if (std::isfinite(l) && l > 0 && (best == 0 || l < best)) best = l;
  }
  return best;
}

// The variant's losses, both metrics: latest, final (once ended) and best.
void FillLosses(const Job& job, VariantStatus* v) {
  constexpr policy::LossMetric kQuantized = policy::LossMetric::kQuantizedValLoss;
  const bool ended = store::IsTerminal(job.state());
  v->set_val_loss(job.val_loss());
  v->set_final_val_loss(ended ? FinalLoss(job) : 0);
  v->set_best_val_loss(BestLoss(job, policy::LossMetric::kValLoss));
  v->clear_quantized_val_loss();
  v->clear_final_quantized_val_loss();
  v->clear_best_quantized_val_loss();
  if (job.has_quantized_val_loss()) v->set_quantized_val_loss(job.quantized_val_loss());
  if (const double final = FinalLoss(job, kQuantized); ended && final > 0) {
    v->set_final_quantized_val_loss(final);
  }
  if (const double best = BestLoss(job, kQuantized); best > 0) {
    v->set_best_quantized_val_loss(best);
  }
}

}  // namespace

bool IsReference(const Experiment& e, int run) {
  const tally::v1::ExperimentSpec& spec = e.spec();
  const int ref = ReferenceIndex(spec);
  return ref < spec.variants_size() && run < e.variants_size() &&
         e.variants(run).name() == spec.variants(ref).name();
}

int ReplicateOf(const VariantStatus& v) { return std::max(1, v.replicate()); }

int ReferenceRun(const Experiment& e, int replicate) {
  for (int i = 0; i < e.variants_size(); ++i) {
    if (IsReference(e, i) && ReplicateOf(e.variants(i)) == replicate) return i;
  }
  return -1;
}

int ReferenceIndex(const tally::v1::ExperimentSpec& spec) {
  if (spec.target().has_from_variant()) {
    for (int i = 0; i < spec.variants_size(); ++i) {
      if (spec.variants(i).name() == spec.target().from_variant()) return i;
    }
  }
  return 0;
}

void FillVariantFigures(const Job& job, double target, policy::LossMetric metric,
                        VariantStatus* v, const tally::v1::CalibratedStepTime* calibrated) {
  v->set_job(job.name());
  v->set_state(job.state());
  v->set_state_reason(job.state_reason());
  v->set_step(job.step());
  v->set_cost_usd(job.cost().cost_usd());
  *v->mutable_forecast() = job.forecast();
  FillLosses(job, v);
  v->set_reached_target(false);
  v->set_cost_to_target_usd(0);
  v->set_tokens_to_target(0);
  v->set_gpu_seconds_to_target(0);
  v->set_target_step(0);
  v->set_steps_to_target(0);
  v->set_flops_to_target(0);
  v->set_recipe_cost_to_target_usd(0);
  v->set_recipe_cost_low_usd(0);
  v->set_recipe_cost_high_usd(0);
  v->clear_note();
  // What a step of this recipe costs: the experiment's calibration of it
  // (every variant timed side by side), else its own steady-state step
  // times.
  std::optional<policy::StepTimeSummary> times = policy::Summarize(
      std::vector<double>(job.step_times().seconds().begin(), job.step_times().seconds().end()));
  v->set_own_step_seconds(times ? times->median : 0);
  v->set_timing_calibrated(calibrated != nullptr);
  if (calibrated != nullptr) {
    times = policy::StepTimeSummary{.median = calibrated->median_seconds(),
                                    .p10 = calibrated->p10_seconds(),
                                    .p90 = calibrated->p90_seconds(),
                                    .n = calibrated->samples()};
  }
  v->set_step_seconds(times ? times->median : 0);
  v->set_step_seconds_spread(times ? times->spread() : 0);
  v->set_step_time_varied(times && times->varied());
  // The GPU type's on-demand price (the estimate's, made at submission),
  // not an attempt's blend with spot capacity: where it ran is not the
  // recipe's.
  const double usd_per_gpu_hour = job.cost().estimate().usd_per_gpu_hour() > 0
                                      ? job.cost().estimate().usd_per_gpu_hour()
                                      : job.cost().usd_per_gpu_hour();
  const double usd_per_step_second =
      std::max(1, job.spec().resources().gpu_count()) * usd_per_gpu_hour / 3600.0;
  v->set_recipe_usd_per_step(times ? times->median * usd_per_step_second : 0);
  if (job.state() == tally::v1::JOB_STATE_FAILED) {
    // Not "no evaluations yet": it is over.
    v->set_note("failed: " + (job.state_reason().empty() ? std::string("no reason recorded")
                                                         : job.state_reason()));
  }
  if (target <= 0) return;
  const std::vector<policy::CurvePoint> curve = sched::CurveOf(job, metric);
  if (auto x = policy::FindTargetCrossing(curve, target)) {
    v->set_reached_target(true);
    v->set_cost_to_target_usd(x->cost_usd);
    v->set_tokens_to_target(x->tokens);
    v->set_gpu_seconds_to_target(x->gpu_seconds);
    v->set_target_step(x->at.step);
    v->set_steps_to_target(x->steps);
    v->set_flops_to_target(x->tokens * ledger::CostLedger::FlopsPerToken(job.spec()));
    // The recipe's cost: its steps at its own steady-state step time, on
    // its GPUs at its GPU type's price.
    if (times) {
      v->set_recipe_cost_to_target_usd(x->steps * times->median * usd_per_step_second);
      v->set_recipe_cost_low_usd(x->steps * times->p10 * usd_per_step_second);
      v->set_recipe_cost_high_usd(x->steps * times->p90 * usd_per_step_second);
    } else if (x->steps > 0 && v->note().empty()) {
      v->set_note("too few steps to time: no recipe cost");
    }
  } else if (store::IsTerminal(job.state()) && v->note().empty()) {
    const bool quantized = metric == policy::LossMetric::kQuantizedValLoss;
    const bool evaluated =
        quantized ? std::any_of(job.curve().begin(), job.curve().end(),
                                [](const auto& p) { return p.has_quantized_val_loss(); })
                  : !curve.empty();
    v->set_note(evaluated ? "never reached the target"
                          : (quantized && !curve.empty()
                                 ? "never evaluated quantized: no figure to the target"
                                 : "never evaluated: no figure to the target"));
  }
}

void FillFigures(const std::vector<std::optional<Job>>& jobs, Experiment* e,
                 const std::optional<Job>& calibration) {
  const double target = e->target_val_loss();
  const policy::LossMetric metric = MetricOf(e->spec());
  FillCalibration(calibration, e);
  double total = e->calibration().cost_usd();
  for (int i = 0; i < e->variants_size(); ++i) {
    VariantStatus* v = e->mutable_variants(i);
    if (i < static_cast<int>(jobs.size()) && jobs[i]) {
      FillVariantFigures(*jobs[i], target, metric, v, CalibratedTimeOf(*e, v->name()));
      total += v->cost_usd();
    }
    v->set_ratio_to_reference(0);
    v->set_recipe_ratio_to_reference(0);
  }
  e->set_cost_usd(total);
  // Each run against the reference's run of the same replicate (the same
  // seed offset).
  for (int i = 0; i < e->variants_size(); ++i) {
    VariantStatus* v = e->mutable_variants(i);
    const int ref = ReferenceRun(*e, ReplicateOf(*v));
    if (ref < 0) continue;
    const VariantStatus& r = e->variants(ref);
    if (v->reached_target() && r.reached_target() && r.cost_to_target_usd() > 0) {
      v->set_ratio_to_reference(v->cost_to_target_usd() / r.cost_to_target_usd());
    }
    if (v->recipe_cost_to_target_usd() > 0 && r.recipe_cost_to_target_usd() > 0) {
      v->set_recipe_ratio_to_reference(v->recipe_cost_to_target_usd() /
                                       r.recipe_cost_to_target_usd());
    }
  }
  FillSummaries(e);
}

void FillSummaries(Experiment* e) {
  e->clear_summaries();
  for (const auto& variant : e->spec().variants()) {
    tally::v1::VariantSummary* s = e->add_summaries();
    s->set_name(variant.name());
    std::vector<double> steps, tokens, recipe, billed, ratios;
    for (const VariantStatus& v : e->variants()) {
      if (v.name() != variant.name()) continue;
      s->set_replicates(s->replicates() + 1);
      if (!v.reached_target()) continue;
      s->set_reached_target(s->reached_target() + 1);
      steps.push_back(v.steps_to_target());
      tokens.push_back(v.tokens_to_target());
      billed.push_back(v.cost_to_target_usd());
      if (v.recipe_cost_to_target_usd() > 0) recipe.push_back(v.recipe_cost_to_target_usd());
      if (v.recipe_ratio_to_reference() > 0) ratios.push_back(v.recipe_ratio_to_reference());
    }
    if (auto i = policy::MeanInterval90(steps)) {
      s->set_steps_to_target(i->mean);
      s->set_steps_ci90_low(i->low);
      s->set_steps_ci90_high(i->high);
    }
    if (auto i = policy::MeanInterval90(tokens)) {
      s->set_tokens_to_target(i->mean);
      s->set_tokens_ci90_low(i->low);
      s->set_tokens_ci90_high(i->high);
    }
    if (auto i = policy::MeanInterval90(billed)) s->set_cost_to_target_usd(i->mean);
    if (auto i = policy::MeanInterval90(recipe)) {
      s->set_recipe_cost_to_target_usd(i->mean);
      s->set_recipe_cost_ci90_low_usd(std::max(0.0, i->low));
      s->set_recipe_cost_ci90_high_usd(i->high);
    }
    const bool reference =
        variant.name() == e->spec().variants(ReferenceIndex(e->spec())).name();
    if (reference) {
      s->set_verdict("reference");
    } else if (auto i = policy::RatioInterval90(ratios)) {
      s->set_recipe_ratio_to_reference(i->mean);
      s->set_recipe_ratio_ci90_low(i->low);
      s->set_recipe_ratio_ci90_high(i->high);
      s->set_ratio_pairs(i->n);
      s->set_verdict(policy::RatioVerdict(*i));
    } else {
      s->set_verdict("not reached");
    }
  }
}

}  // namespace tally::experiments
