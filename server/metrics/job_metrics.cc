#include "server/metrics/job_metrics.h"

#include <string>

namespace tally::metrics {
namespace {

bool Terminal(tally::v1::JobState s) {
  return s == tally::v1::JOB_STATE_SUCCEEDED || s == tally::v1::JOB_STATE_EARLY_STOPPED ||
         s == tally::v1::JOB_STATE_BUDGET_EXHAUSTED || s == tally::v1::JOB_STATE_CANCELLED ||
         s == tally::v1::JOB_STATE_FAILED;
}

}  // namespace

JobMetrics::JobMetrics(Registry* registry) {
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(*registry);
  };
  step_ = gauge("tally_job_step", "Latest step of a running job.");
  train_loss_ = gauge("tally_job_train_loss", "Latest training loss of a running job.");
  val_loss_ = gauge("tally_job_val_loss", "Latest validation loss of a running job.");
  best_val_loss_ = gauge("tally_job_best_val_loss", "Best validation loss of a running job so far.");
  tokens_ = gauge("tally_job_tokens", "Tokens a running job has computed, by kind (useful or padding).");
  useful_tokens_per_second_ = gauge("tally_job_useful_tokens_per_second",
                                    "Document tokens per second of a running job.");
  padding_fraction_ = gauge("tally_job_padding_fraction",
                            "Fraction of a running job's tokens that are padding.");
  cost_ = gauge("tally_job_cost_dollars", "Dollars a running job has cost so far.");
  checkpoint_cost_ = gauge("tally_job_checkpoint_cost_dollars",
                           "Dollars between a running job's two latest checkpoints.");
  patience_left_ = gauge("tally_job_patience_left",
                         "Evaluations a running job may go without improving before it is stopped.");
  budget_fraction_ = gauge("tally_job_budget_used_ratio",
                           "Fraction of budget.max_dollars a running job has spent.");
  fp8_overflows_ = gauge("tally_job_fp8_overflows",
                         "Values an FP8 job's current attempt clamped to the format's range.");
  fp8_product_fraction_ = gauge("tally_job_fp8_product_fraction",
                                "Fraction of an FP8 job's matrix products computed in FP8.");
  fp8_amax_ = gauge("tally_job_fp8_amax", "Latest amax of an FP8 job's tensors, by group.");
  moe_load_ = gauge("tally_job_moe_max_over_mean_load",
                    "MoE jobs: the busiest expert's tokens over the mean, per MoE layer (1 is balanced).");
  moe_entropy_ = gauge("tally_job_moe_router_entropy", "MoE jobs: mean router entropy per layer, nats.");
  moe_dropped_ = gauge("tally_job_moe_dropped_fraction",
                       "MoE jobs: token assignments over capacity, per layer.");
  moe_expert_tokens_ = gauge("tally_job_moe_expert_tokens",
                             "MoE jobs: tokens each expert took at the latest step.");
  forecast_ = gauge("tally_job_forecast_val_loss",
                    "Validation loss a running job's fitted loss curve predicts at max_steps, "
                    "by bound (predicted, low, high).");
  target_ = gauge("tally_job_target_val_loss",
                  "The target validation loss in force for a running job.");
}

void JobMetrics::Set(const std::string& job, GaugeFamily* family, Labels labels, double value) {
  // Every per-job series is made here, so one that exists is already known.
  const bool known = family->Has(labels);
  family->Add(labels).Set(value);
  if (!known) series_[job].insert({family, std::move(labels)});
}

void JobMetrics::Remove(const std::string& job) {
  auto it = series_.find(job);
  if (it == series_.end()) return;
  for (const auto& [family, labels] : it->second) {
    if (family->Has(labels)) family->Remove(&family->Add(labels));
  }
  series_.erase(it);
}

void JobMetrics::Update(const tally::v1::Job& j, const tally::v1::CostStatus& cost) {
  if (Terminal(j.state())) {
    Remove(j.name());
    return;
  }
  if (j.state() != tally::v1::JOB_STATE_RUNNING) return;
  const std::string& n = j.name();
  const Labels l = {{"tally_job", n}};
  Set(n, step_, l, static_cast<double>(j.step()));
  Set(n, cost_, l, cost.cost_usd());
  Set(n, tokens_, {{"tally_job", n}, {"kind", "useful"}}, static_cast<double>(j.tokens()));
  Set(n, tokens_, {{"tally_job", n}, {"kind", "padding"}},
      static_cast<double>(j.padding_tokens()));
  if (j.train_loss() != 0) Set(n, train_loss_, l, j.train_loss());
  if (j.val_loss() != 0) Set(n, val_loss_, l, j.val_loss());
  if (j.early_stopping().has_best()) Set(n, best_val_loss_, l, j.early_stopping().best_val_loss());
  if (j.spec().early_stopping().patience() > 0) {
    Set(n, patience_left_, l,
        j.early_stopping().evals() > 0 ? j.early_stopping().patience_left()
                                       : j.spec().early_stopping().patience());
  }
  if (j.spec().budget().max_dollars() > 0) {
    Set(n, budget_fraction_, l, cost.cost_usd() / j.spec().budget().max_dollars());
  }
  if (j.forecast().valid()) {
    Set(n, forecast_, {{"tally_job", n}, {"bound", "predicted"}}, j.forecast().final_val_loss());
    Set(n, forecast_, {{"tally_job", n}, {"bound", "low"}}, j.forecast().low());
    Set(n, forecast_, {{"tally_job", n}, {"bound", "high"}}, j.forecast().high());
  }
  if (j.target_val_loss() > 0) Set(n, target_, l, j.target_val_loss());
}

void JobMetrics::OnCheckpoint(const tally::v1::Job& j, const tally::v1::Checkpoint& ck) {
  if (j.state() != tally::v1::JOB_STATE_RUNNING) return;
  Set(j.name(), checkpoint_cost_, {{"tally_job", j.name()}}, ck.cost_since_previous_usd());
}

void JobMetrics::OnProgress(const tally::v1::Job& j, const tally::v1::Progress& p) {
  if (j.state() != tally::v1::JOB_STATE_RUNNING || !p.trained()) return;
  const std::string& n = j.name();
  const Labels l = {{"tally_job", n}};
  Set(n, useful_tokens_per_second_, l, p.useful_tokens_per_second());
  Set(n, padding_fraction_, l, p.padding_fraction());
  if (p.fp8_product_fraction() > 0) {
    Set(n, fp8_overflows_, l, static_cast<double>(p.fp8_overflows()));
    Set(n, fp8_product_fraction_, l, p.fp8_product_fraction());
    for (const auto& [group, amax] : p.fp8_amax()) {
      Set(n, fp8_amax_, {{"tally_job", n}, {"group", group}}, amax);
    }
  }
  for (const auto& layer : p.moe()) {
    const std::string at = std::to_string(layer.layer());
    Set(n, moe_load_, {{"tally_job", n}, {"layer", at}}, layer.max_over_mean_load());
    Set(n, moe_entropy_, {{"tally_job", n}, {"layer", at}}, layer.router_entropy());
    Set(n, moe_dropped_, {{"tally_job", n}, {"layer", at}}, layer.dropped_fraction());
    for (int e = 0; e < layer.tokens_per_expert_size(); ++e) {
      Set(n, moe_expert_tokens_,
          {{"tally_job", n}, {"layer", at}, {"expert", std::to_string(e)}},
          static_cast<double>(layer.tokens_per_expert(e)));
    }
  }
}

}  // namespace tally::metrics
