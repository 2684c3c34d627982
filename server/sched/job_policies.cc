// The scheduler's cost ledger and early stopping: the glue between the pure
// policies (server/policy) and the job records. See scheduler.h.
#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model_flops.h"
#include "common/spec_validation.h"
#include "common/status_macros.h"
#include "server/sched/proto_time.h"
#include "server/sched/scheduler.h"

namespace tally::sched {
namespace {

policy::EarlyStoppingRules Rules(const tally::v1::EarlyStoppingSpec& s) {
  policy::EarlyStoppingRules r;
  r.patience = s.patience();
  r.min_rel_delta = s.min_rel_delta();
  r.min_delta = s.min_delta();
  r.min_evals = s.min_evals();
  r.divergence_factor = s.divergence_factor();
  r.baseline_evals = s.baseline_evals();
  r.baseline_min_rel_gain = s.baseline_min_rel_gain();
  return r;
}

policy::EarlyStoppingState FromStatus(const tally::v1::EarlyStoppingStatus& s) {
  policy::EarlyStoppingState st;
  st.evals = s.evals();
  st.last_step = s.evals() > 0 ? s.last_step() : -1;
  st.has_best = s.has_best();
  st.best = s.best_val_loss();
  st.best_step = s.best_step();
  st.evals_since_best = s.evals_since_best();
  st.has_baseline = s.has_baseline();
  st.baseline = s.baseline_val_loss();
  return st;
}

void ToStatus(const policy::EarlyStoppingState& st, tally::v1::EarlyStoppingStatus* s) {
  s->set_evals(st.evals);
  s->set_last_step(st.last_step);
  s->set_has_best(st.has_best);
  s->set_best_val_loss(st.best);
  s->set_best_step(st.best_step);
  s->set_evals_since_best(st.evals_since_best);
  s->set_has_baseline(st.has_baseline);
  s->set_baseline_val_loss(st.baseline);
}

metrics::Labels JobLabels(const tally::v1::Job& job) { return {{"tally_job", job.name()}}; }

}  // namespace

std::optional<tally::v1::Job> Scheduler::ActiveJobView(int64_t job_id) {
  auto it = active_.find(job_id);
  if (it == active_.end()) return std::nullopt;
  Accrue(it->second, clock_->Now());
  return it->second.rec.job();
}

void Scheduler::SetPrices(policy::PriceTable prices) {
  const absl::Time now = clock_->Now();
  // What ran so far is charged at the old prices.
  for (auto& [id, job] : active_) Accrue(job, now);
  options_.prices = std::move(prices);
}

void Scheduler::Accrue(ActiveJob& job, absl::Time now) {
  tally::v1::Job& j = *job.rec.mutable_job();
  auto* cost = j.mutable_cost();
  const std::string& gpu_type = j.spec().resources().gpu_type();
  const double price = options_.prices.Price(gpu_type);
  cost->set_usd_per_gpu_hour(price);
  const bool running = j.state() == tally::v1::JOB_STATE_RUNNING && job.attempt.has_value();
  if (running && now > job.accrued_until) {
    const int gpus = std::max(1, j.spec().resources().gpu_count());
    const absl::Duration held = now - job.accrued_until;
    const double usd = policy::CostUsd(held, gpus, price);
    cost->set_cost_usd(cost->cost_usd() + usd);
    cost->set_gpu_seconds(cost->gpu_seconds() + absl::ToDoubleSeconds(held) * gpus);
    cost->set_attempt_usd_since_checkpoint(cost->attempt_usd_since_checkpoint() + usd);
    if (usd > 0) cost_total_->Add({{"gpu_type", gpu_type}}).Increment(usd);
  }
  job.accrued_until = std::max(job.accrued_until, now);
  *cost->mutable_accrued_until() = ToProto(job.accrued_until);
}

void Scheduler::ChargeLostWork(ActiveJob& job) {
  auto* cost = job.rec.mutable_job()->mutable_cost();
  const double lost = cost->attempt_usd_since_checkpoint();
  cost->set_lost_usd(cost->lost_usd() + lost);
  cost->set_attempt_usd_since_checkpoint(0);
  if (lost > 0) {
    lost_total_->Add({{"gpu_type", job.rec.job().spec().resources().gpu_type()}})
        .Increment(lost);
  }
}

absl::StatusOr<bool> Scheduler::EnforceBudget(ActiveJob& job) {
  const tally::v1::Job& j = job.rec.job();
  const double max = j.spec().budget().max_dollars();
  if (max <= 0 || j.cost().cost_usd() < max ||
      j.state() != tally::v1::JOB_STATE_RUNNING) {
    return false;
  }
  RETURN_IF_ERROR(StopJob(
      job, tally::v1::JOB_STATE_BUDGET_EXHAUSTED, "budget_exhausted",
      absl::StrFormat("budget: spent $%.4f of max_dollars $%.4f", j.cost().cost_usd(), max),
      absl::StrFormat("%.1f GPU-seconds at $%.4f/GPU-hour", j.cost().gpu_seconds(),
                      j.cost().usd_per_gpu_hour())));
  return true;
}

absl::Status Scheduler::StopJob(ActiveJob& job, tally::v1::JobState state,
                                const std::string& type, const std::string& reason,
                                const std::string& detail) {
  Accrue(job, clock_->Now());
  if (job.attempt) {
    job.attempt->set_state(store::ATTEMPT_STATE_STOPPED);
    *job.attempt->mutable_end_time() = ToProto(clock_->Now());
    job.attempt->set_reason(reason);
    std::set<std::string> workers(job.attempt->worker_ids().begin(),
                                  job.attempt->worker_ids().end());
    for (const auto& w : workers) Stop(w, job.rec.job().name(), job.attempt->attempt(), reason);
    attempts_ended_->Add({{"outcome", "stopped"}}).Increment();
  }
  RETURN_IF_ERROR(Record(job, state, type, reason, detail, true));
  Finish(job.rec.id());
  return absl::OkStatus();
}

absl::Status Scheduler::OnEval(ActiveJob& job, const tally::v1::EvalResult& ev) {
  tally::v1::Job& j = *job.rec.mutable_job();
  Accrue(job, clock_->Now());
  j.set_step(ev.step());
  j.set_tokens(ev.tokens());
  j.set_val_loss(ev.val_loss());
  job.last_eval = {ev.step(), ev.val_loss()};
  const policy::EarlyStoppingRules rules = Rules(j.spec().early_stopping());
  policy::EarlyStoppingState state = FromStatus(j.early_stopping());
  const policy::EarlyStoppingDecision d = policy::ObserveEval(rules, &state, ev.step(),
                                                              ev.val_loss());
  ToStatus(state, j.mutable_early_stopping());
  j.mutable_early_stopping()->set_patience_left(d.patience_left);
  // Routing collapse: one expert taking most tokens for several evaluations;
  // the streak is stored with this evaluation.
  constexpr int kCollapseEvals = 3;
  tally::v1::RoutingStatus& routing = *j.mutable_routing();
  routing.set_collapsed_evals(job.max_expert_share > 0.5 ? routing.collapsed_evals() + 1 : 0);
  const int collapsed_evals = routing.collapsed_evals();
  const bool warn = collapsed_evals >= kCollapseEvals && !routing.collapse_warned();
  tally::v1::JobEvent e = NewEvent(job, "eval", "",
                                   absl::StrCat(ev.bits_per_byte(), " bits/byte"));
  e.set_val_loss(ev.val_loss());
  RETURN_IF_ERROR(AppendEvent(job, std::move(e), {}));
  // AppendEvent replaces job.rec: no reference into it survives a commit.
  UpdateJobMetrics(job);
  if (warn) {
    // Stored with the warning itself: warned once, restarts included.
    job.rec.mutable_job()->mutable_routing()->set_collapse_warned(true);
    RETURN_IF_ERROR(AppendEvent(
        job,
        NewEvent(job, "warning",
                 absl::StrFormat("routing collapse: %s took %.0f%% of its layer's tokens for "
                                 "%d evaluations in a row",
                                 job.max_expert_where, 100 * job.max_expert_share,
                                 collapsed_evals),
                 "raise model.moe.aux_loss_coef or set model.moe.bias_balancing"),
        {}));
  }
  // At the last step there is nothing left to save by stopping.
  if (d.rule == policy::StopRule::kNone ||
      ev.step() >= job.rec.job().spec().training().max_steps()) {
    return absl::OkStatus();
  }
  // The best checkpoint: the lowest recorded validation loss, else the latest.
  ASSIGN_OR_RETURN(std::vector<tally::v1::Checkpoint> cks,
                   store_->ListCheckpoints(job.rec.id()));
  const tally::v1::Checkpoint* best = cks.empty() ? nullptr : &cks.back();
  for (const auto& c : cks) {
    if (c.val_loss() > 0 && (best->val_loss() <= 0 || c.val_loss() < best->val_loss())) {
      best = &c;
    }
  }
  std::string detail = "no checkpoint yet";
  if (best != nullptr) {
    job.rec.mutable_job()->mutable_early_stopping()->set_best_checkpoint(best->path());
    detail = absl::StrFormat("best checkpoint: step %d, val_loss %.4f, %s", best->step(),
                             best->val_loss(), best->path());
  }
  job.rec.mutable_job()->mutable_early_stopping()->set_stop_rule(policy::StopRuleName(d.rule));
  early_stops_->Add({{"rule", policy::StopRuleName(d.rule)}}).Increment();
  return StopJob(job, tally::v1::JOB_STATE_EARLY_STOPPED, "early_stopped", d.reason, detail);
}

void Scheduler::PriceCheckpoint(ActiveJob& job, tally::v1::Checkpoint* ck) {
  tally::v1::Job& j = *job.rec.mutable_job();
  Accrue(job, clock_->Now());
  policy::PreviousCheckpoint prev;
  if (!job.last_checkpoint) {
    // Once per job life in this process (e.g. after a restart): the store
    // has it; afterwards the job keeps its latest checkpoint.
    auto cks = store_->ListCheckpoints(job.rec.id());
    if (cks.ok() && !cks->empty()) job.last_checkpoint = cks->back();
  }
  if (job.last_checkpoint) {
    const auto& last = *job.last_checkpoint;
    prev = {last.cost_usd(), last.tokens(), last.val_loss()};
  } else if (j.early_stopping().has_baseline()) {
    prev.val_loss = j.early_stopping().baseline_val_loss();
  }
  const policy::CheckpointPrice p =
      policy::PriceCheckpoint(j.cost().cost_usd(), ck->tokens(), ck->val_loss(), prev);
  ck->set_cost_usd(j.cost().cost_usd());
  ck->set_cost_since_previous_usd(p.cost_since_previous_usd);
  ck->set_tokens_since_previous(p.tokens_since_previous);
  ck->set_usd_per_val_loss_improvement(p.usd_per_val_loss_improvement);
  j.mutable_cost()->set_attempt_usd_since_checkpoint(0);
  job_gauges_.checkpoint_cost->Add(JobLabels(j)).Set(p.cost_since_previous_usd);
}

double Scheduler::Flops(const tally::v1::Job& job) const {
  const auto& m = job.spec().model();
  ModelShape shape{m.num_layers(), m.d_model(), m.d_ff(), m.vocab_size()};
  shape.num_experts = m.moe().num_experts();
  shape.top_k = std::max(1, m.moe().top_k());
  shape.every_n_layers = std::max(1, m.moe().every_n_layers());
  shape.shared_expert = m.moe().shared_expert();
  return TrainingFlopsPerToken(shape, job.spec().data().seq_len());
}

void Scheduler::RecordThroughput(const tally::v1::Job& job) {
  if (job.tokens() <= 0 || job.cost().gpu_seconds() <= 0) return;
  Throughput& t = throughput_[job.spec().resources().gpu_type()];
  t.flops += Flops(job) * static_cast<double>(job.tokens());
  t.gpu_seconds += job.cost().gpu_seconds();
  ++t.jobs;
}

absl::StatusOr<tally::v1::CostEstimate> Scheduler::EstimateCost(tally::v1::JobSpec spec) const {
  ApplySpecDefaults(&spec);
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  tally::v1::Job as_job;
  *as_job.mutable_spec() = spec;
  const std::string& gpu_type = spec.resources().gpu_type();
  tally::v1::CostEstimate out;
  double fps = 0;
  auto measured = throughput_.find(gpu_type);
  if (measured != throughput_.end() && measured->second.gpu_seconds > 0) {
    fps = measured->second.flops / measured->second.gpu_seconds;
    out.set_throughput_source(
        absl::StrCat("measured from ", measured->second.jobs, " finished ", gpu_type, " jobs"));
  } else if (auto it = options_.prices.flops_per_second_per_gpu.find(gpu_type);
             it != options_.prices.flops_per_second_per_gpu.end()) {
    fps = it->second;
    out.set_throughput_source("configured");
  } else {
    out.set_throughput_source(absl::StrCat(
        "unknown: no finished ", gpu_type,
        " jobs and no flops_per_second_per_gpu for it in tallyd's config"));
  }
  const int gpus = spec.resources().gpu_count();
  const int64_t tokens = spec.training().max_steps() * spec.training().global_batch_tokens();
  const policy::Estimate e = policy::EstimateRun(Flops(as_job), tokens, gpus, fps,
                                                 options_.prices.Price(gpu_type));
  out.set_flops_per_token(e.flops_per_token);
  out.set_tokens(e.tokens);
  out.set_flops_per_second_per_gpu(e.flops_per_second_per_gpu);
  out.set_seconds(e.seconds);
  out.set_gpu_hours(e.gpu_hours);
  out.set_usd_per_gpu_hour(options_.prices.Price(gpu_type));
  out.set_cost_usd(e.cost_usd);
  return out;
}

void Scheduler::SetJobSeries(const std::string& job, metrics::Family<metrics::Gauge>* family,
                             metrics::Labels labels, double value) {
  family->Add(labels).Set(value);
  job_series_[job].insert({family, std::move(labels)});
}

void Scheduler::OnMoeProgress(ActiveJob& job, const tally::v1::Progress& p) {
  const std::string& name = job.rec.job().name();
  job.max_expert_share = 0;
  for (const auto& l : p.moe()) {
    const std::string layer = std::to_string(l.layer());
    SetJobSeries(name, job_gauges_.moe_load, {{"tally_job", name}, {"layer", layer}},
                 l.max_over_mean_load());
    SetJobSeries(name, job_gauges_.moe_entropy, {{"tally_job", name}, {"layer", layer}},
                 l.router_entropy());
    SetJobSeries(name, job_gauges_.moe_dropped, {{"tally_job", name}, {"layer", layer}},
                 l.dropped_fraction());
    int64_t total = 0;
    for (int64_t n : l.tokens_per_expert()) total += n;
    for (int e = 0; e < l.tokens_per_expert_size(); ++e) {
      SetJobSeries(name, job_gauges_.moe_expert_tokens,
                   {{"tally_job", name}, {"layer", layer}, {"expert", std::to_string(e)}},
                   static_cast<double>(l.tokens_per_expert(e)));
      const double share =
          total > 0 ? static_cast<double>(l.tokens_per_expert(e)) / static_cast<double>(total) : 0;
      if (share > job.max_expert_share) {
        job.max_expert_share = share;
        job.max_expert_where = absl::StrCat("layer ", l.layer(), " expert ", e);
      }
    }
  }
}

void Scheduler::UpdateJobMetrics(const ActiveJob& job) {
  const tally::v1::Job& j = job.rec.job();
  if (j.state() != tally::v1::JOB_STATE_RUNNING) return;
  const metrics::Labels l = JobLabels(j);
  job_gauges_.step->Add(l).Set(static_cast<double>(j.step()));
  job_gauges_.cost->Add(l).Set(j.cost().cost_usd());
  metrics::Labels useful = l, padding = l;
  useful["kind"] = "useful";
  padding["kind"] = "padding";
  job_gauges_.tokens->Add(useful).Set(static_cast<double>(j.tokens()));
  job_gauges_.tokens->Add(padding).Set(static_cast<double>(j.padding_tokens()));
  if (j.train_loss() != 0) job_gauges_.train_loss->Add(l).Set(j.train_loss());
  if (j.val_loss() != 0) job_gauges_.val_loss->Add(l).Set(j.val_loss());
  if (j.early_stopping().has_best()) {
    job_gauges_.best_val_loss->Add(l).Set(j.early_stopping().best_val_loss());
  }
  if (j.spec().early_stopping().patience() > 0) {
    job_gauges_.patience_left->Add(l).Set(
        j.early_stopping().evals() > 0 ? j.early_stopping().patience_left()
                                       : j.spec().early_stopping().patience());
  }
  if (j.spec().budget().max_dollars() > 0) {
    job_gauges_.budget_fraction->Add(l).Set(j.cost().cost_usd() /
                                            j.spec().budget().max_dollars());
  }
}

void Scheduler::RemoveJobMetrics(const tally::v1::Job& j) {
  const metrics::Labels l = JobLabels(j);
  for (auto* f : {job_gauges_.step, job_gauges_.train_loss, job_gauges_.val_loss,
                  job_gauges_.best_val_loss, job_gauges_.useful_tokens_per_second,
                  job_gauges_.padding_fraction, job_gauges_.cost, job_gauges_.checkpoint_cost,
                  job_gauges_.patience_left, job_gauges_.budget_fraction,
                  job_gauges_.fp8_overflows, job_gauges_.fp8_product_fraction}) {
    if (f->Has(l)) f->Remove(&f->Add(l));
  }
  auto series = job_series_.find(j.name());
  if (series != job_series_.end()) {
    for (const auto& [family, labels] : series->second) {
      if (family->Has(labels)) family->Remove(&family->Add(labels));
    }
    job_series_.erase(series);
  }
  for (const char* kind : {"useful", "padding"}) {
    metrics::Labels k = l;
    k["kind"] = kind;
    if (job_gauges_.tokens->Has(k)) job_gauges_.tokens->Remove(&job_gauges_.tokens->Add(k));
  }
}

}  // namespace tally::sched
