#include "server/ledger/cost_ledger.h"

#include <algorithm>
#include <set>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_flops.h"
#include "common/proto_time.h"
#include "server/policy/cost.h"
#include "server/policy/loss_metric.h"

namespace tally::ledger {

double PriceTable::Price(const std::string& gpu_type) const {
  auto it = usd_per_gpu_hour.find(gpu_type);
  return it == usd_per_gpu_hour.end() ? 0.0 : it->second;
}

double PriceTable::SpotPrice(const std::string& gpu_type) const {
  auto it = spot_usd_per_gpu_hour.find(gpu_type);
  return it == spot_usd_per_gpu_hour.end() ? Price(gpu_type) : it->second;
}

double PriceTable::PriceFor(const std::string& gpu_type, int gpus, int spot_gpus) const {
  const int n = std::max(1, gpus);
  const int spot = std::clamp(spot_gpus, 0, n);
  if (spot == 0) return Price(gpu_type);
  if (spot == n) return SpotPrice(gpu_type);
  return ((n - spot) * Price(gpu_type) + spot * SpotPrice(gpu_type)) / n;
}

std::vector<std::string> PriceTable::KnownGpuTypes() const {
  std::set<std::string> known(worker_gpu_types.begin(), worker_gpu_types.end());
  for (const auto* table : {&usd_per_gpu_hour, &spot_usd_per_gpu_hour, &flops_per_second_per_gpu}) {
    for (const auto& [type, value] : *table) known.insert(type);
  }
  return {known.begin(), known.end()};
}

std::string PriceTable::Describe() const {
  if (usd_per_gpu_hour.empty() && spot_usd_per_gpu_hour.empty()) {
    return "no prices configured: every GPU type costs $0";
  }
  std::string out = usd_per_gpu_hour.empty() ? "no on-demand prices (unpriced GPU types cost $0)"
                                             : "prices $/GPU-hour:";
  for (const auto& [gpu, usd] : usd_per_gpu_hour) absl::StrAppend(&out, " ", gpu, "=", usd);
  if (spot_usd_per_gpu_hour.empty()) {
    absl::StrAppend(&out, "; no spot prices (spot is priced at on-demand)");
  } else {
    absl::StrAppend(&out, "; spot $/GPU-hour:");
    for (const auto& [gpu, usd] : spot_usd_per_gpu_hour) absl::StrAppend(&out, " ", gpu, "=", usd);
  }
  return out;
}

CostLedger::CostLedger(PriceTable prices) : prices_(std::move(prices)) {}

void CostLedger::SetPrices(PriceTable prices) { prices_ = std::move(prices); }

Accrual CostLedger::Accrue(const tally::v1::Job& job, bool running, absl::Time now) const {
  Accrual out;
  out.cost = job.cost();
  tally::v1::CostStatus& cost = out.cost;
  const std::string& gpu_type = job.spec().resources().gpu_type();
  const int gpus = std::max(1, cost.attempt_gpus() > 0 ? cost.attempt_gpus()
                                                       : job.spec().resources().gpu_count());
  const int spot_gpus = std::clamp(cost.spot_gpus(), 0, gpus);
  const double price = prices_.PriceFor(gpu_type, gpus, spot_gpus);
  cost.set_usd_per_gpu_hour(price);
  const absl::Time from = cost.has_accrued_until() ? FromProto(cost.accrued_until()) : now;
  if (running && now > from) {
    const absl::Duration held = now - from;
    out.added_usd = policy::CostUsd(held, gpus, price);
    cost.set_cost_usd(cost.cost_usd() + out.added_usd);
    cost.set_gpu_seconds(cost.gpu_seconds() + absl::ToDoubleSeconds(held) * gpus);
    if (spot_gpus > 0) {
      cost.set_spot_gpu_seconds(cost.spot_gpu_seconds() +
                                absl::ToDoubleSeconds(held) * spot_gpus);
    }
    cost.set_attempt_usd_since_checkpoint(cost.attempt_usd_since_checkpoint() + out.added_usd);
  }
  *cost.mutable_accrued_until() = ToProto(std::max(from, now));
  return out;
}

Accrual CostLedger::ChargeLost(const tally::v1::CostStatus& cost) const {
  Accrual out;
  out.cost = cost;
  out.added_usd = cost.attempt_usd_since_checkpoint();
  out.cost.set_lost_usd(cost.lost_usd() + out.added_usd);
  out.cost.set_attempt_usd_since_checkpoint(0);
  return out;
}

Accrual CostLedger::ChargeRedone(const tally::v1::CostStatus& cost,
                                 bool checkpoint_at_exit) const {
  Accrual out;
  out.cost = cost;
  if (!checkpoint_at_exit) {
    out.added_usd = cost.attempt_usd_since_checkpoint();
    out.cost.set_redone_usd(cost.redone_usd() + out.added_usd);
  }
  out.cost.set_attempt_usd_since_checkpoint(0);
  return out;
}

tally::v1::Checkpoint CostLedger::PriceCheckpoint(
    const tally::v1::Job& job, tally::v1::Checkpoint ck,
    const std::optional<tally::v1::Checkpoint>& previous) const {
  // Gains are of the loss the job is judged by (its early-stopping
  // baseline is of that metric too); an unknown loss is 0.
  const policy::LossMetric metric =
      policy::ParseLossMetric(job.spec().early_stopping().metric());
  auto known = [](double loss) { return std::isfinite(loss) && loss > 0 ? loss : 0.0; };
  policy::PreviousCheckpoint prev;
  if (previous) {
    prev = {previous->cost_usd(), previous->tokens(), known(policy::LossOf(metric, *previous))};
  } else if (job.early_stopping().has_baseline()) {
    prev.val_loss = known(job.early_stopping().baseline_val_loss());
  }
  const policy::CheckpointPrice p = policy::PriceCheckpoint(
      job.cost().cost_usd(), ck.tokens(), known(policy::LossOf(metric, ck)), prev);
  ck.set_cost_usd(job.cost().cost_usd());
  ck.set_cost_since_previous_usd(p.cost_since_previous_usd);
  ck.set_tokens_since_previous(p.tokens_since_previous);
  ck.set_usd_per_val_loss_improvement(p.usd_per_val_loss_improvement);
  return ck;
}

std::optional<BudgetStop> CostLedger::CheckBudget(const tally::v1::Job& job,
                                                  const tally::v1::CostStatus& cost) const {
  const double max = job.spec().budget().max_dollars();
  if (max <= 0 || cost.cost_usd() < max || job.state() != tally::v1::JOB_STATE_RUNNING) {
    return std::nullopt;
  }
  return BudgetStop{
      absl::StrFormat("budget: spent $%.4f of max_dollars $%.4f", cost.cost_usd(), max),
      absl::StrFormat("%.1f GPU-seconds at $%.4f/GPU-hour", cost.gpu_seconds(),
                      cost.usd_per_gpu_hour())};
}

namespace {

ModelShape ShapeOf(const tally::v1::ModelSpec& m) {
  ModelShape shape{m.num_layers(), m.d_model(), m.d_ff(), m.vocab_size()};
  shape.num_experts = m.moe().num_experts();
  shape.top_k = std::max(1, m.moe().top_k());
  shape.every_n_layers = std::max(1, m.moe().every_n_layers());
  shape.shared_expert = m.moe().shared_expert();
  return shape;
}

}  // namespace

double CostLedger::FlopsPerToken(const tally::v1::JobSpec& spec) {
  return TrainingFlopsPerToken(ShapeOf(spec.model()), spec.data().seq_len()) +
         TeacherFlopsPerToken(spec);
}

double CostLedger::TeacherFlopsPerToken(const tally::v1::JobSpec& spec) {
  const auto& teacher = spec.training().distill().teacher();
  if (!spec.training().has_distill() || !teacher.has_model()) return 0;
  ModelShape shape = ShapeOf(teacher.model());
  // The student's vocabulary when the teacher's is not stated: they share
  // the tokenizer.
  if (shape.vocab_size == 0) shape.vocab_size = spec.model().vocab_size();
  return TrainingFlopsPerToken(shape, spec.data().seq_len()) / 3;  // forward only
}

void CostLedger::RecordFinished(const tally::v1::Job& job) {
  const tally::v1::CostStatus& cost = job.cost();
  if (cost.spot_gpu_seconds() > 0 && std::isfinite(cost.spot_gpu_seconds())) {
    Preemptions& p = preemptions_[job.spec().resources().gpu_type()];
    ++p.jobs;
    p.notices += std::max(0, job.preemption().by_notice());
    p.spot_gpu_seconds += cost.spot_gpu_seconds();
    // The job's own mean price turns its redone dollars into GPU-hours, and
    // its GPU count those into wall-clock hours.
    const double gpu_hours = cost.gpu_seconds() / 3600.0;
    const double mean_price = gpu_hours > 0 ? cost.cost_usd() / gpu_hours : 0;
    const int preempted = std::max(0, job.preemption().count());
    if (mean_price > 0 && std::isfinite(mean_price) && preempted > 0 &&
        std::isfinite(cost.redone_usd())) {
      const double gpus = std::max(1, job.spec().resources().gpu_count());
      p.priced_preemptions += preempted;
      p.redone_hours += std::max(0.0, cost.redone_usd()) / mean_price / gpus;
    }
  }
  if (job.tokens() <= 0 || job.cost().gpu_seconds() <= 0) return;
  Throughput& t = throughput_[job.spec().resources().gpu_type()];
  t.flops += FlopsPerToken(job.spec()) * static_cast<double>(job.tokens());
  t.gpu_seconds += job.cost().gpu_seconds();
  ++t.jobs;
}

tally::v1::CostEstimate CostLedger::Estimate(const tally::v1::JobSpec& spec) const {
  const std::string& gpu_type = spec.resources().gpu_type();
  tally::v1::CostEstimate out;
  double fps = 0;
  auto measured = throughput_.find(gpu_type);
  if (measured != throughput_.end() && measured->second.gpu_seconds > 0) {
    fps = measured->second.flops / measured->second.gpu_seconds;
    out.set_throughput_source(
        absl::StrCat("measured from ", measured->second.jobs, " finished ", gpu_type, " jobs"));
  } else if (auto it = prices_.flops_per_second_per_gpu.find(gpu_type);
             it != prices_.flops_per_second_per_gpu.end()) {
    fps = it->second;
    out.set_throughput_source("configured");
  } else {
    out.set_throughput_source(absl::StrCat(
        "unknown: no finished ", gpu_type,
        " jobs and no flops_per_second_per_gpu for it in tallyd's config"));
  }
  const int gpus = spec.resources().gpu_count();
  const int64_t tokens = spec.training().max_steps() * spec.training().global_batch_tokens();
  const policy::Estimate e = policy::EstimateRun(FlopsPerToken(spec), tokens, gpus, fps,
                                                 prices_.Price(gpu_type));
  out.set_flops_per_token(e.flops_per_token);
  out.set_tokens(e.tokens);
  out.set_flops_per_second_per_gpu(e.flops_per_second_per_gpu);
  out.set_seconds(e.seconds);
  out.set_gpu_hours(e.gpu_hours);
  out.set_usd_per_gpu_hour(prices_.Price(gpu_type));
  out.set_cost_usd(e.cost_usd);
  if (spec.training().has_distill()) {
    const double teacher = TeacherFlopsPerToken(spec);
    out.set_teacher_flops_per_token(teacher);
    out.set_teacher_source(
        teacher > 0
            ? "training.distill.teacher.model: its forward pass, counted in flops_per_token"
            : "not priced: the teacher's shape is not stated; add training.distill.teacher.model "
              "(num_layers, d_model, num_heads, ...) to count its forward pass");
  }
  FillSpotEstimate(spec, &out);
  return out;
}

void CostLedger::FillSpotEstimate(const tally::v1::JobSpec& spec,
                                  tally::v1::CostEstimate* out) const {
  // A non-finite value (from a hostile input that got this far) reads as 0.
  auto finite = [](double v) { return std::isfinite(v) ? v : 0.0; };
  const std::string& gpu_type = spec.resources().gpu_type();
  const double gpu_hours = finite(out->gpu_hours());
  const double spot_price = finite(prices_.SpotPrice(gpu_type));
  out->set_spot_usd_per_gpu_hour(spot_price);

  double rate = 0;
  double redone_hours_per_preemption = -1;  // < 0: not measured
  auto measured = preemptions_.find(gpu_type);
  if (measured != preemptions_.end() && measured->second.spot_gpu_seconds > 0) {
    const Preemptions& p = measured->second;
    const double spot_hours = p.spot_gpu_seconds / 3600.0;
    rate = finite(p.notices / spot_hours);
    out->set_preemption_rate_source(absl::StrFormat(
        "measured from %d finished %s jobs (%.4g spot GPU-hours)", p.jobs, gpu_type, spot_hours));
    if (p.priced_preemptions > 0) {
      redone_hours_per_preemption = finite(p.redone_hours / p.priced_preemptions);
    }
  } else {
    out->set_preemption_rate_source(absl::StrCat(
        "none observed: no finished ", gpu_type, " job has run on spot; rate taken as 0"));
  }
  out->set_preemptions_per_gpu_hour(rate);
  const double expected = finite(rate * gpu_hours);
  out->set_spot_expected_preemptions(expected);

  double redone_gpu_hours_per_preemption = 0;
  if (redone_hours_per_preemption >= 0) {
    redone_gpu_hours_per_preemption =
        redone_hours_per_preemption * std::max(1, spec.resources().gpu_count());
  } else if (const int64_t max_steps = spec.training().max_steps(); max_steps > 0) {
    int64_t interval = spec.training().checkpoint_interval_steps();
    if (interval <= 0 || interval > max_steps) interval = max_steps;
    redone_gpu_hours_per_preemption =
        0.5 * static_cast<double>(interval) / static_cast<double>(max_steps) * gpu_hours;
  }
  const double redone_usd =
      finite(expected * finite(redone_gpu_hours_per_preemption) * spot_price);
  out->set_spot_redone_usd(redone_usd);
  const double spot_cost = finite(spot_price * gpu_hours + redone_usd);
  out->set_spot_cost_usd(spot_cost);
  out->set_spot_savings_usd(finite(finite(out->cost_usd()) - spot_cost));
}

}  // namespace tally::ledger
