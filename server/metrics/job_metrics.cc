#include "server/metrics/job_metrics.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace tally::metrics {
namespace {

bool Terminal(tally::v1::JobState s) {
  return s == tally::v1::JOB_STATE_SUCCEEDED || s == tally::v1::JOB_STATE_EARLY_STOPPED ||
         s == tally::v1::JOB_STATE_BUDGET_EXHAUSTED || s == tally::v1::JOB_STATE_CANCELLED ||
         s == tally::v1::JOB_STATE_FAILED;
}

std::string StateLabel(tally::v1::JobState s) {
  absl::string_view name = tally::v1::JobState_Name(s);
  if (absl::StartsWith(name, "JOB_STATE_")) name.remove_prefix(10);
  return absl::AsciiStrToLower(name);
}

bool ValidLabelName(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (!(std::isalpha(c) || c == '_' || (i > 0 && std::isdigit(c)))) return false;
  }
  return true;
}

// A label value cut to at most `max` bytes without splitting a UTF-8
// sequence.
std::string Truncated(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

absl::Time FromTimestamp(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

}  // namespace

absl::Status ValidateJobMetricsOptions(const JobMetricsOptions& o) {
  if (o.retention < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job_metrics_retention: must not be negative (0 removes a job's series when it ends), "
        "got ", absl::FormatDuration(o.retention)));
  }
  if (o.info_labels.size() > static_cast<size_t>(kMaxInfoLabels)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job_info_labels: at most ", kMaxInfoLabels, " spec label keys (each is a label on "
        "every job's tally_job_info), got ", o.info_labels.size()));
  }
  std::set<std::string> seen;
  for (const auto& k : o.info_labels) {
    if (!ValidLabelName(k)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job_info_labels: \"", k, "\" is not usable as a Prometheus label name; use letters, "
          "digits and _ (not starting with a digit), e.g. team"));
    }
    if (!seen.insert(k).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_info_labels: \"", k, "\" is listed twice"));
    }
  }
  if (o.max_expert_series < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--moe_expert_series_max: must not be negative (0 publishes only the per-layer "
        "summary), got ", o.max_expert_series));
  }
  return absl::OkStatus();
}

MoeLayerHealth AssessMoeLayer(const tally::v1::MoeLayerLoad& load, int top_k) {
  MoeLayerHealth h;
  h.layer = load.layer();
  const int e = load.tokens_per_expert_size();
  h.num_experts = e;
  if (e == 0) return h;
  const int k = std::clamp(top_k, 1, e);
  h.fair_share = static_cast<double>(k) / e;
  double assignments = 0;
  for (int64_t n : load.tokens_per_expert()) assignments += static_cast<double>(std::max<int64_t>(n, 0));
  if (assignments <= 0) return h;
  // Each token is routed to k distinct experts: tokens = assignments / k.
  const double tokens = assignments / k;
  std::vector<double> shares;
  shares.reserve(e);
  for (int i = 0; i < e; ++i) {
    const double share =
        static_cast<double>(std::max<int64_t>(load.tokens_per_expert(i), 0)) / tokens;
    shares.push_back(share);
    if (share > h.busiest_share) {
      h.busiest_share = share;
      h.busiest_expert = i;
    }
    if (share < kIdleFractionOfFair * h.fair_share) ++h.idle_experts;
  }
  std::vector<double> sorted = shares;
  std::sort(sorted.begin(), sorted.end());
  h.min_share = sorted.front();
  h.median_share = e % 2 == 1 ? sorted[e / 2] : (sorted[e / 2 - 1] + sorted[e / 2]) / 2;
  const double busiest_limit =
      std::min(kBusiestOverFair * h.fair_share, (1 + h.fair_share) / 2);
  // With k == E every expert takes every token: nothing can collapse.
  h.collapsed = k < e && (h.idle_experts > 0 || h.busiest_share > busiest_limit);
  return h;
}

JobMetrics::JobMetrics(Registry* registry, JobMetricsOptions options)
    : options_(std::move(options)) {
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(*registry);
  };
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(*registry);
  };
  info_ = gauge("tally_job_info",
                "1 for each job with series: its display name, state (lower case), GPU type and "
                "chosen spec labels (label_<key>), to join per-job series on tally_job.");
  step_ = gauge("tally_job_step", "Latest step of a job (its last, once it has ended).");
  train_loss_ = gauge("tally_job_train_loss", "Latest training loss of a job.");
  val_loss_ = gauge("tally_job_val_loss", "Latest validation loss of a job.");
  quantized_val_loss_ = gauge(
      "tally_job_quantized_val_loss",
      "Latest quantized validation loss of a job: the same evaluation with its chosen linears "
      "quantized as its GGUF export will be (training.qat or training.eval_quantized; only jobs "
      "that have one).");
  best_val_loss_ = gauge("tally_job_best_val_loss",
                         "Best loss of a job so far, of the metric its early stopping judges "
                         "(the validation loss, or the quantized one with early_stopping.metric "
                         "quantized_val_loss).");
  tokens_ = counter("tally_job_tokens_total",
                    "Tokens a job's attempts have computed, by kind (useful or padding); redone "
                    "work after a resume counts again.");
  useful_tokens_per_second_ = gauge("tally_job_useful_tokens_per_second",
                                    "Document tokens per second of a job's latest step (0 once "
                                    "it has ended).");
  padding_fraction_ = gauge("tally_job_padding_fraction",
                            "Fraction of a job's latest step's tokens that are padding.");
  cost_ = gauge("tally_job_cost_dollars", "Dollars a job has cost so far (final once ended).");
  checkpoint_cost_ = gauge("tally_job_checkpoint_cost_dollars",
                           "Dollars between a job's two latest checkpoints.");
  patience_left_ = gauge("tally_job_patience_left",
                         "Evaluations a job may go without improving before it is stopped.");
  budget_fraction_ = gauge("tally_job_budget_used_ratio",
                           "Dollars a job has spent over its budget.max_dollars (1 or more once "
                           "it exhausted it).");
  attempts_ended_ = counter("tally_job_attempts_ended_total",
                            "A job's attempts that ended, by outcome (succeeded, failed, lost, "
                            "stopped, preempted: not a failure, the job resumes).");
  fp8_overflows_ = counter("tally_job_fp8_overflows_total",
                           "Values an FP8 job clamped to the format's range, all attempts.");
  fp8_values_ = counter("tally_job_fp8_values_total",
                        "Values an FP8 job cast to FP8, all attempts (the overflows among them).");
  fp8_product_fraction_ = gauge("tally_job_fp8_product_fraction",
                                "Fraction of an FP8 job's matrix products computed in FP8.");
  fp8_amax_ = gauge("tally_job_fp8_amax", "Latest amax of an FP8 job's tensors, by group.");
  moe_load_ = gauge("tally_job_moe_max_over_mean_load",
                    "MoE jobs: the busiest expert's tokens over the mean, per MoE layer (1 is "
                    "balanced; at most E/k).");
  moe_entropy_ = gauge("tally_job_moe_router_entropy", "MoE jobs: mean router entropy per layer, nats.");
  moe_dropped_ = gauge("tally_job_moe_dropped_fraction",
                       "MoE jobs: token assignments over capacity, per layer.");
  moe_expert_tokens_ = gauge("tally_job_moe_expert_tokens",
                             "MoE jobs: tokens each expert took at the latest step (only while "
                             "layers x experts is within --moe_expert_series_max).");
  moe_expert_share_ = gauge("tally_job_moe_expert_share",
                            "MoE jobs: fraction of a layer's tokens routed to its least loaded "
                            "(stat=min), median (p50), busiest (max) expert and the fair share k/E "
                            "(fair), at the latest step.");
  moe_idle_experts_ = gauge("tally_job_moe_idle_experts",
                            "MoE jobs: experts below a tenth of their fair share, per layer.");
  moe_collapsed_ = gauge("tally_job_moe_collapsed",
                         "MoE jobs: 1 when a layer has an idle expert or one far above its fair "
                         "share at the latest step.");
  moe_collapsed_evals_ = gauge("tally_job_moe_collapsed_evals",
                               "MoE jobs: evaluations in a row at which routing had collapsed "
                               "(the routing warning is recorded at 3).");
  forecast_ = gauge("tally_job_forecast_val_loss",
                    "Loss a job's fitted loss curve predicts at max_steps, by bound "
                    "(predicted, low, high), of the metric its early stopping judges.");
  target_ = gauge("tally_job_target_val_loss",
                  "The target loss in force for a job, of the metric its early stopping judges "
                  "(val_loss, or quantized_val_loss).");
  fleet_tokens_ = counter("tally_tokens_total",
                          "Tokens computed by all attempts, by kind (useful or padding) and GPU "
                          "type.");
  fleet_fp8_overflows_ = counter("tally_fp8_overflows_total",
                                 "Values FP8 attempts clamped to the format's range, by GPU type.");
  fleet_fp8_values_ = counter("tally_fp8_values_total",
                              "Values FP8 attempts cast to FP8 (the overflows among them), by GPU "
                              "type.");
}

void JobMetrics::AddGpuType(const std::string& gpu_type) {
  for (const char* kind : {"useful", "padding"}) {
    fleet_tokens_->Add({{"kind", kind}, {"gpu_type", gpu_type}});
  }
  fleet_fp8_overflows_->Add({{"gpu_type", gpu_type}});
  fleet_fp8_values_->Add({{"gpu_type", gpu_type}});
}

void JobMetrics::Set(const std::string& job, GaugeFamily* family, Labels labels, double value) {
  family->Add(labels).Set(value);
  jobs_[job].gauges.insert({family, std::move(labels)});
}

void JobMetrics::SetSimple(JobSeries& s, const std::string& job, GaugeFamily* family,
                           double value) {
  Gauge*& g = s.simple[family];
  if (g == nullptr) {
    Labels l = {{"tally_job", job}};
    g = &family->Add(l);
    s.gauges.insert({family, std::move(l)});
  }
  g->Set(value);
}

Counter& JobMetrics::Count(const std::string& job, CounterFamily* family, Labels labels) {
  Counter& c = family->Add(labels);
  jobs_[job].counters.insert({family, std::move(labels)});
  return c;
}

void JobMetrics::Remove(const std::string& job) {
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return;
  for (const auto& [family, labels] : it->second.gauges) family->Remove(labels);
  for (const auto& [family, labels] : it->second.counters) family->Remove(labels);
  if (!it->second.info.empty()) info_->Remove(it->second.info);
  jobs_.erase(it);
}

void JobMetrics::SetInfo(const tally::v1::Job& j) {
  JobSeries& s = jobs_[j.name()];
  if (!s.info.empty() && s.info_state == j.state() &&
      s.info_stop_rule == j.early_stopping().stop_rule()) {
    return;
  }
  s.info_state = j.state();
  s.info_stop_rule = j.early_stopping().stop_rule();
  Labels l = {{"tally_job", j.name()},
              {"display_name", Truncated(j.spec().display_name(), kMaxInfoLabelValueBytes)},
              {"state", StateLabel(j.state())},
              {"gpu_type", j.spec().resources().gpu_type()}};
  // The rule that stopped it, once one has (divergence, patience, ...).
  if (!j.early_stopping().stop_rule().empty()) {
    l["stop_rule"] = Truncated(j.early_stopping().stop_rule(), kMaxInfoLabelValueBytes);
  }
  for (const auto& key : options_.info_labels) {
    auto it = j.spec().labels().find(key);
    l[absl::StrCat("label_", key)] =
        it == j.spec().labels().end() ? "" : Truncated(it->second, kMaxInfoLabelValueBytes);
  }
  if (s.info == l) return;
  if (!s.info.empty()) info_->Remove(s.info);
  info_->Add(l).Set(1);
  s.info = std::move(l);
}

void JobMetrics::SetRecordGauges(const tally::v1::Job& j, const tally::v1::CostStatus& cost) {
  const std::string& n = j.name();
  JobSeries& s = jobs_[n];
  SetSimple(s, n, step_, static_cast<double>(j.step()));
  SetSimple(s, n, cost_, cost.cost_usd());
  if (!s.running_counters_created) {
    for (const char* kind : {"useful", "padding"}) {
      Count(n, tokens_, {{"tally_job", n}, {"kind", kind}});
    }
    for (const char* outcome : {"succeeded", "failed", "lost", "stopped", "preempted"}) {
      Count(n, attempts_ended_, {{"tally_job", n}, {"outcome", outcome}});
    }
    if (j.spec().precision().compute() == tally::v1::PRECISION_FP8) {
      Count(n, fp8_overflows_, {{"tally_job", n}});
      Count(n, fp8_values_, {{"tally_job", n}});
    }
    s.running_counters_created = true;
  }
  if (j.train_loss() != 0) SetSimple(s, n, train_loss_, j.train_loss());
  if (j.val_loss() != 0) SetSimple(s, n, val_loss_, j.val_loss());
  if (j.has_quantized_val_loss()) SetSimple(s, n, quantized_val_loss_, j.quantized_val_loss());
  if (j.early_stopping().has_best()) {
    SetSimple(s, n, best_val_loss_, j.early_stopping().best_val_loss());
  }
  if (j.spec().early_stopping().patience() > 0) {
    SetSimple(s, n, patience_left_,
              j.early_stopping().evals() > 0 ? j.early_stopping().patience_left()
                                             : j.spec().early_stopping().patience());
  }
  if (j.spec().budget().max_dollars() > 0) {
    SetSimple(s, n, budget_fraction_, cost.cost_usd() / j.spec().budget().max_dollars());
  }
  if (j.forecast().valid()) {
    Set(n, forecast_, {{"tally_job", n}, {"bound", "predicted"}}, j.forecast().final_val_loss());
    Set(n, forecast_, {{"tally_job", n}, {"bound", "low"}}, j.forecast().low());
    Set(n, forecast_, {{"tally_job", n}, {"bound", "high"}}, j.forecast().high());
  }
  if (j.target_val_loss() > 0) SetSimple(s, n, target_, j.target_val_loss());
  if (j.spec().model().moe().num_experts() > 0) {
    SetSimple(s, n, moe_collapsed_evals_, j.routing().collapsed_evals());
  }
}

void JobMetrics::Update(const tally::v1::Job& j, const tally::v1::CostStatus& cost) {
  const std::string& n = j.name();
  if (Terminal(j.state())) {
    if (options_.retention <= absl::ZeroDuration()) {
      Remove(n);
      return;
    }
    JobSeries& s = jobs_[n];
    if (s.ended) return;  // final values are already set
    // A job that never ran has nothing but its info (and its attempt
    // counters at 0); one that did keeps its final values, and computes
    // nothing any more.
    if (j.attempt() > 0) {
      SetRecordGauges(j, cost);
      if (useful_tokens_per_second_->Has({{"tally_job", n}})) {
        Set(n, useful_tokens_per_second_, {{"tally_job", n}}, 0);
      }
    }
    SetInfo(j);
    jobs_[n].ended = j.has_end_time() ? FromTimestamp(j.end_time()) : absl::InfinitePast();
    return;
  }
  SetInfo(j);
  // From submission on, at 0: an attempt that fails as it starts is still an
  // increase() that Prometheus can see (it scraped the 0 while the job
  // waited).
  JobSeries& s = jobs_[n];
  if (!s.counters_created) {
    for (const char* outcome : {"succeeded", "failed", "lost", "stopped", "preempted"}) {
      Count(n, attempts_ended_, {{"tally_job", n}, {"outcome", outcome}});
    }
    s.counters_created = true;
  }
  if (j.state() != tally::v1::JOB_STATE_RUNNING) return;
  SetRecordGauges(j, cost);
}

void JobMetrics::Expire(absl::Time now) {
  std::vector<std::string> expired;
  for (const auto& [name, s] : jobs_) {
    if (s.ended && now - *s.ended >= options_.retention) expired.push_back(name);
  }
  for (const auto& name : expired) Remove(name);
}

bool JobMetrics::WithinRetention(const tally::v1::Job& j, absl::Time now) const {
  if (!Terminal(j.state()) || !j.has_end_time() || options_.retention <= absl::ZeroDuration()) {
    return false;
  }
  return now - FromTimestamp(j.end_time()) < options_.retention;
}

void JobMetrics::RestoreEnded(const tally::v1::Job& j,
                              const std::map<std::string, int64_t>& ended_by_outcome,
                              absl::Time now) {
  if (!WithinRetention(j, now) || jobs_.count(j.name())) return;
  Update(j);
  const std::string& n = j.name();
  for (const auto& [outcome, count] : ended_by_outcome) {
    if (count > 0) {
      Count(n, attempts_ended_, {{"tally_job", n}, {"outcome", outcome}})
          .Increment(static_cast<double>(count));
    }
  }
  if (j.attempt() > 0) {
    Count(n, tokens_, {{"tally_job", n}, {"kind", "useful"}})
        .Increment(static_cast<double>(std::max<int64_t>(0, j.tokens())));
    Count(n, tokens_, {{"tally_job", n}, {"kind", "padding"}})
        .Increment(static_cast<double>(std::max<int64_t>(0, j.padding_tokens())));
  }
}

void JobMetrics::OnAttemptStarted(const tally::v1::Job& j) {
  JobSeries& s = jobs_[j.name()];
  s.attempt = Attempt{};
  s.attempt.attempt = j.attempt();
  s.attempt.from_zero = true;
}

void JobMetrics::OnAttemptEnded(const tally::v1::Job& j, const std::string& outcome) {
  Count(j.name(), attempts_ended_, {{"tally_job", j.name()}, {"outcome", outcome}}).Increment();
}

void JobMetrics::OnCheckpoint(const tally::v1::Job& j, const tally::v1::Checkpoint& ck) {
  if (j.state() != tally::v1::JOB_STATE_RUNNING) return;
  Set(j.name(), checkpoint_cost_, {{"tally_job", j.name()}}, ck.cost_since_previous_usd());
}

void JobMetrics::OnProgress(const tally::v1::Job& j, const tally::v1::Progress& p,
                            const std::vector<MoeLayerHealth>& moe) {
  if (j.state() != tally::v1::JOB_STATE_RUNNING) return;
  const std::string& n = j.name();
  const std::string& gpu_type = j.spec().resources().gpu_type();
  // Work computed since the attempt's previous report. An attempt whose
  // start was seen here counts from 0 (the first attempt's tokens) or, for
  // its FP8 counts (reported per attempt), always; any other counts from its
  // first report.
  Attempt& a = jobs_[n].attempt;
  if (a.attempt != p.attempt()) {
    a = Attempt{};
    a.attempt = p.attempt();
  }
  const bool tokens_from_zero = a.from_zero && p.attempt() == 1;
  const int64_t base_tokens = a.seen ? a.tokens : (tokens_from_zero ? 0 : p.tokens());
  const int64_t base_padding =
      a.seen ? a.padding_tokens : (tokens_from_zero ? 0 : p.padding_tokens());
  const int64_t base_overflows = a.seen ? a.fp8_overflows : (a.from_zero ? 0 : p.fp8_overflows());
  const int64_t base_values = a.seen ? a.fp8_values : (a.from_zero ? 0 : p.fp8_values());
  a.seen = true;
  // A report that goes backwards (a new process of the same attempt) is a
  // new starting point, not negative work.
  const int64_t d_tokens = std::max<int64_t>(0, p.tokens() - base_tokens);
  const int64_t d_padding = std::max<int64_t>(0, p.padding_tokens() - base_padding);
  const int64_t d_overflows = std::max<int64_t>(0, p.fp8_overflows() - base_overflows);
  const int64_t d_values = std::max<int64_t>(0, p.fp8_values() - base_values);
  a.tokens = p.tokens();
  a.padding_tokens = p.padding_tokens();
  a.fp8_overflows = p.fp8_overflows();
  a.fp8_values = p.fp8_values();
  // Document tokens: the worker's `tokens` counts them (padding apart).
  Count(n, tokens_, {{"tally_job", n}, {"kind", "useful"}}).Increment(static_cast<double>(d_tokens));
  Count(n, tokens_, {{"tally_job", n}, {"kind", "padding"}})
      .Increment(static_cast<double>(d_padding));
  fleet_tokens_->Add({{"kind", "useful"}, {"gpu_type", gpu_type}})
      .Increment(static_cast<double>(d_tokens));
  fleet_tokens_->Add({{"kind", "padding"}, {"gpu_type", gpu_type}})
      .Increment(static_cast<double>(d_padding));
  if (!p.trained()) return;
  const Labels l = {{"tally_job", n}};
  Set(n, useful_tokens_per_second_, l, p.useful_tokens_per_second());
  Set(n, padding_fraction_, l, p.padding_fraction());
  if (p.fp8_product_fraction() > 0 || p.fp8_overflows() > 0 || p.fp8_values() > 0) {
    Count(n, fp8_overflows_, l).Increment(static_cast<double>(d_overflows));
    Count(n, fp8_values_, l).Increment(static_cast<double>(d_values));
    fleet_fp8_overflows_->Add({{"gpu_type", gpu_type}}).Increment(static_cast<double>(d_overflows));
    fleet_fp8_values_->Add({{"gpu_type", gpu_type}}).Increment(static_cast<double>(d_values));
    Set(n, fp8_product_fraction_, l, p.fp8_product_fraction());
    for (const auto& [group, amax] : p.fp8_amax()) {
      Set(n, fp8_amax_, {{"tally_job", n}, {"group", group}}, amax);
    }
  }
  int expert_series = 0;
  for (const auto& layer : p.moe()) expert_series += layer.tokens_per_expert_size();
  const bool per_expert = expert_series <= options_.max_expert_series;
  for (const auto& layer : p.moe()) {
    const std::string at = std::to_string(layer.layer());
    Set(n, moe_load_, {{"tally_job", n}, {"layer", at}}, layer.max_over_mean_load());
    Set(n, moe_entropy_, {{"tally_job", n}, {"layer", at}}, layer.router_entropy());
    Set(n, moe_dropped_, {{"tally_job", n}, {"layer", at}}, layer.dropped_fraction());
    if (!per_expert) continue;
    for (int e = 0; e < layer.tokens_per_expert_size(); ++e) {
      Set(n, moe_expert_tokens_,
          {{"tally_job", n}, {"layer", at}, {"expert", std::to_string(e)}},
          static_cast<double>(layer.tokens_per_expert(e)));
    }
  }
  for (const MoeLayerHealth& h : moe) {
    const std::string at = std::to_string(h.layer);
    auto share = [&](const char* stat, double v) {
      Set(n, moe_expert_share_, {{"tally_job", n}, {"layer", at}, {"stat", stat}}, v);
    };
    share("min", h.min_share);
    share("p50", h.median_share);
    share("max", h.busiest_share);
    share("fair", h.fair_share);
    Set(n, moe_idle_experts_, {{"tally_job", n}, {"layer", at}}, h.idle_experts);
    Set(n, moe_collapsed_, {{"tally_job", n}, {"layer", at}}, h.collapsed ? 1 : 0);
  }
}

}  // namespace tally::metrics
