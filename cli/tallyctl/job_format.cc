#include "cli/tallyctl/job_format.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/text.h"

namespace tally::cli {
namespace {

// At most this many of the jobs that preempted a job are named.
constexpr int kMaxPreemptersShown = 5;

std::string Safe(absl::string_view text) { return EscapeUnprintable(text); }

std::string StateText(tally::v1::JobState s) {
  absl::string_view name = tally::v1::JobState_Name(s);
  if (name.empty()) return absl::StrCat("state ", static_cast<int>(s));
  absl::ConsumePrefix(&name, "JOB_STATE_");
  return std::string(name);
}

std::string LossOrDash(double l) {
  return l > 0 ? absl::StrFormat("%.4f", l) : std::string("-");
}

// A count to read at a glance: 32.5k, 1.08M.
std::string Count(double x) {
  if (x >= 1e9) return absl::StrFormat("%.2fG", x / 1e9);
  if (x >= 1e6) return absl::StrFormat("%.2fM", x / 1e6);
  if (x >= 1e4) return absl::StrFormat("%.1fk", x / 1e3);
  return absl::StrFormat("%.0f", x);
}

std::string Plural(int64_t n, absl::string_view one, absl::string_view many) {
  return absl::StrCat(n, " ", n == 1 ? one : many);
}

}  // namespace

std::string FormatTimestamp(const google::protobuf::Timestamp& t, absl::TimeZone tz) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixSeconds(t.seconds()), tz);
}

std::string ResourcesLine(const tally::v1::JobSpec& spec) {
  std::string line = absl::StrCat("  resources: ", spec.resources().gpu_count(), " x ",
                                  Safe(spec.resources().gpu_type()), ", priority ",
                                  spec.priority());
  const std::string& capacity = spec.resources().capacity();
  if (capacity == "spot") {
    absl::StrAppend(&line, ", spot capacity");
  } else if (capacity == "on_demand") {
    absl::StrAppend(&line, ", on-demand capacity");
  } else if (!capacity.empty() && capacity != "any") {
    absl::StrAppend(&line, ", capacity ", Safe(capacity));
  }
  absl::StrAppend(&line, "\n");
  return line;
}

std::string ProgressLine(const tally::v1::Job& job) {
  const auto& spec = job.spec();
  std::string line = absl::StrCat("  progress:  step ", job.step(), " / ",
                                  spec.training().max_steps(), ", attempt ", job.attempt());
  const int preempted = job.preemption().count();
  if (preempted > 0 && preempted < job.attempt()) {
    // Preempted attempts do not count against max_attempts.
    absl::StrAppend(&line, " (", job.attempt() - preempted, " of ", spec.max_attempts(),
                    " counted, ", Plural(preempted, "preempted", "preempted"), ")");
  } else {
    absl::StrAppend(&line, " of ", spec.max_attempts());
  }
  if (spec.max_preemptions() > 0) {
    absl::StrAppend(&line, ", at most ",
                    Plural(spec.max_preemptions(), "preemption", "preemptions"));
  }
  absl::StrAppend(&line, "\n");
  return line;
}

std::string LossLines(const tally::v1::Job& j) {
  const auto& spec = j.spec();
  const auto& es = j.early_stopping();
  const bool by_quantized = spec.early_stopping().metric() == "quantized_val_loss";
  const std::string format = spec.training().eval_quantized();
  auto quantized = [](bool has, double v) {
    return has ? std::optional<double>(v) : std::nullopt;
  };
  std::string out;
  if (es.has_best()) {
    absl::StrAppend(&out, "  val loss:  ",
                    LossWithQuantized("latest", j.val_loss(),
                                      quantized(j.has_quantized_val_loss(),
                                                j.quantized_val_loss()),
                                      format));
    absl::StrAppendFormat(&out, ", best %s%.4f at step %d",
                          by_quantized ? "quantized_val_loss " : "", es.best_val_loss(),
                          es.best_step());
    if (spec.early_stopping().patience() > 0) {
      absl::StrAppendFormat(&out, ", patience left %d of %d", es.patience_left(),
                            spec.early_stopping().patience());
    }
    absl::StrAppend(&out, "\n");
  }
  if (j.target_val_loss() > 0) {
    absl::StrAppendFormat(&out, "  target:    %s %.4f",
                          by_quantized ? "quantized_val_loss" : "val loss", j.target_val_loss());
    if (j.has_target_reached()) {
      const auto& t = j.target_reached();
      absl::StrAppendFormat(
          &out,
          ", reached at step %d (%s, $%.4f); to the target itself $%.4f, %.0f tokens, "
          "%.1f GPU-seconds",
          t.step(),
          LossWithQuantized("val", t.val_loss(),
                            quantized(t.has_quantized_val_loss(), t.quantized_val_loss()), format),
          t.cost_usd(), t.cost_to_target_usd(), t.tokens_to_target(), t.gpu_seconds_to_target());
    } else {
      absl::StrAppend(&out, ", not reached");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string SpotUsageLine(const tally::v1::Job& job) {
  const auto& cost = job.cost();
  if (cost.spot_gpus() <= 0 && !(cost.spot_gpu_seconds() > 0)) return "";
  std::string line = "  spot:      ";
  if (cost.spot_gpus() > 0) {
    const int gpus = std::max(1, job.spec().resources().gpu_count());
    absl::StrAppendFormat(&line, "%d of %s on spot capacity now, ", cost.spot_gpus(),
                          Plural(gpus, "GPU", "GPUs"));
  }
  absl::StrAppendFormat(&line, "%.1f spot GPU-seconds in all\n", cost.spot_gpu_seconds());
  return line;
}

std::string PreemptionLines(const tally::v1::Job& job, absl::TimeZone tz) {
  const auto& p = job.preemption();
  const bool pending = !p.pending_for().empty();
  const double redone = job.cost().redone_usd();
  std::string out;
  if (!job.hold().empty()) {
    absl::StrAppend(&out, "  held: ", Safe(job.hold()), " (not placed until released)\n");
  }
  if (p.count() <= 0 && !pending && !(redone > 0) && p.preempted_by_size() == 0) return out;
  absl::StrAppendFormat(&out, "  preemptions: %d (notice %d, priority %d", p.count(),
                        p.by_notice(), p.by_priority());
  if (p.by_experiment() > 0) absl::StrAppendFormat(&out, ", experiment %d", p.by_experiment());
  absl::StrAppendFormat(&out, "), redone $%.4f\n", redone);
  if (p.preempted_by_size() > 0) {
    const int shown = std::min(p.preempted_by_size(), kMaxPreemptersShown);
    std::vector<std::string> names;
    for (int i = 0; i < shown; ++i) names.push_back(Safe(p.preempted_by(i)));
    absl::StrAppend(&out, "  preempted by: ", absl::StrJoin(names, ", "));
    if (p.preempted_by_size() > shown) {
      absl::StrAppend(&out, " and ", p.preempted_by_size() - shown, " more");
    }
    absl::StrAppend(&out, "\n");
  }
  if (pending) {
    absl::StrAppend(&out, "  preempting for ", Safe(p.pending_for()));
    if (!p.pending_reason().empty()) absl::StrAppend(&out, ": ", Safe(p.pending_reason()));
    if (p.has_pending_deadline()) {
      absl::StrAppend(&out, " (deadline ", FormatTimestamp(p.pending_deadline(), tz),
                      "; waiting for the workers' checkpoint)");
    } else {
      absl::StrAppend(&out, " (waiting for the workers' checkpoint)");
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string RedoneLine(const tally::v1::Job& job) {
  const auto& p = job.preemption();
  const double redone = job.cost().redone_usd();
  if (p.count() <= 0 && !(redone > 0)) return "";
  return absl::StrFormat("  redone after preemptions: $%.4f (%s: notice %d, priority %d)\n",
                         redone, Plural(p.count(), "preemption", "preemptions"), p.by_notice(),
                         p.by_priority());
}

std::string ModelOriginLines(const tally::v1::JobSpec& spec) {
  std::string out;
  const auto& init = spec.model().init_from();
  const std::string& from = init.hf().empty() ? init.checkpoint() : init.hf();
  if (!from.empty()) {
    out = init.has_upcycle()
              ? absl::StrFormat("  from:      upcycled from %s (noise_std %g)\n", Safe(from),
                                init.upcycle().noise_std())
              : absl::StrFormat("  from:      weights of %s\n", Safe(from));
  }
  if (spec.training().has_distill()) {
    const auto& d = spec.training().distill();
    const std::string& teacher =
        d.teacher().hf().empty() ? d.teacher().checkpoint() : d.teacher().hf();
    absl::StrAppendFormat(&out, "  teacher:   %s, alpha %g, temperature %g\n", Safe(teacher),
                          d.alpha(), d.temperature());
  }
  return out;
}

std::string EstimateText(const tally::v1::CostEstimate& e, absl::string_view indent) {
  std::string out = absl::StrFormat(
      "$%.4f: %.3g training FLOPs/token x %d tokens at %.3g FLOP/s per GPU (%s) = %.1f s, "
      "%.4f GPU-hours at $%.4f/GPU-hour\n",
      e.cost_usd(), e.flops_per_token(), e.tokens(), e.flops_per_second_per_gpu(),
      Safe(e.throughput_source()), e.seconds(), e.gpu_hours(), e.usd_per_gpu_hour());
  if (!e.teacher_source().empty()) {
    absl::StrAppendFormat(&out, "%sdistillation teacher: %.3g forward FLOPs/token (%s)\n", indent,
                          e.teacher_flops_per_token(), Safe(e.teacher_source()));
  }
  if (!(e.spot_usd_per_gpu_hour() > 0)) return out;
  absl::StrAppendFormat(&out, "%sspot:      $%.4f at $%.4f/GPU-hour, %.2f preemptions expected",
                        indent, e.spot_cost_usd(), e.spot_usd_per_gpu_hour(),
                        e.spot_expected_preemptions());
  absl::StrAppendFormat(&out, " (%.3g per GPU-hour", e.preemptions_per_gpu_hour());
  if (!e.preemption_rate_source().empty()) {
    absl::StrAppend(&out, ", ", Safe(e.preemption_rate_source()));
  }
  absl::StrAppendFormat(&out, ") redoing $%.4f\n", e.spot_redone_usd());
  const double saving = e.spot_savings_usd();
  const std::string share =
      e.cost_usd() > 0 && std::isfinite(saving)
          ? absl::StrFormat(" (%.0f%%)", 100 * std::fabs(saving) / e.cost_usd())
          : std::string();
  absl::StrAppend(&out, indent, "           ");
  if (saving > 0) {
    absl::StrAppendFormat(&out, "spot saves $%.4f%s over on-demand, net of the redone work\n",
                          saving, share);
  } else if (saving < 0) {
    absl::StrAppendFormat(&out, "spot costs $%.4f%s more than on-demand, with the redone work\n",
                          -saving, share);
  } else if (saving == 0) {
    absl::StrAppend(&out, "spot costs the same as on-demand, with the redone work\n");
  } else {
    absl::StrAppend(&out, "spot's saving over on-demand is unknown\n");
  }
  return out;
}

PreemptionTally::PreemptionTally(int known, int64_t known_through, int64_t after)
    : base_(after > 0 ? std::max(0, known) : 0), through_(after > 0 ? known_through : 0) {}

void PreemptionTally::Observe(const tally::v1::JobEvent& e) {
  if (e.type() == "preempted" && e.sequence() > through_) ++seen_;
}

std::string LossWithQuantized(const char* label, double val_loss,
                              const std::optional<double>& quantized,
                              const std::string& quantized_format) {
  std::string out = absl::StrFormat("%s %.4f", label, val_loss);
  if (quantized) {
    absl::StrAppendFormat(&out, " (%s: %.4f)",
                          quantized_format.empty() ? std::string("quantized")
                                                   : Safe(quantized_format),
                          *quantized);
  }
  return out;
}

std::string EventLine(const tally::v1::JobEvent& e, absl::TimeZone tz, int preemptions,
                      const std::string& quantized_format) {
  std::string line =
      absl::StrFormat("#%-4d %s %-10s %-9s step %-7d", e.sequence(), FormatTimestamp(e.time(), tz),
                      Safe(e.type()), StateText(e.state()), e.step());
  if (e.val_loss() != 0) {
    absl::StrAppend(&line, " ",
                    LossWithQuantized("val_loss", e.val_loss(),
                                      e.has_quantized_val_loss()
                                          ? std::optional<double>(e.quantized_val_loss())
                                          : std::nullopt,
                                      quantized_format));
  }
  if (e.train_loss() != 0) absl::StrAppendFormat(&line, " loss %.4f", e.train_loss());
  if (e.cost_usd() != 0) absl::StrAppendFormat(&line, " $%.4f", e.cost_usd());
  if (e.patience_left() >= 0 && (e.type() == "eval" || e.type() == "progress")) {
    absl::StrAppendFormat(&line, " patience %d", e.patience_left());
  }
  if (preemptions > 0 && (e.type() == "progress" || e.type() == "preempted")) {
    absl::StrAppendFormat(&line, " preemptions %d", preemptions);
  }
  if (!e.principal().empty()) absl::StrAppend(&line, " by ", Safe(e.principal()));
  if (!e.reason().empty()) absl::StrAppend(&line, " ", Safe(e.reason()));
  if (!e.detail().empty()) absl::StrAppend(&line, " (", Safe(e.detail()), ")");
  return line;
}

std::string ProgressBar(const tally::v1::JobEvent& e, int64_t max_steps, int preemptions) {
  constexpr int kWidth = 30;
  const int64_t step = std::max<int64_t>(0, e.step());
  const int filled =
      max_steps > 0 ? static_cast<int>(kWidth * std::min(step, max_steps) / max_steps) : 0;
  std::string out = absl::StrCat("[", std::string(filled, '#'), std::string(kWidth - filled, '.'),
                                 "] step ", e.step(), "/", max_steps);
  if (e.train_loss() != 0) absl::StrAppendFormat(&out, "  loss %.4f", e.train_loss());
  absl::StrAppendFormat(&out, "  $%.4f", e.cost_usd());
  if (e.patience_left() >= 0) absl::StrAppend(&out, "  patience ", e.patience_left());
  if (preemptions > 0) absl::StrAppend(&out, "  preemptions ", preemptions);
  return out;
}

// The variants' table: one line each. The recipe cost (steps to the target
// at the variant's own median step time, with the 10th-90th percentile
// interval) is what the verdict uses; billed is what tallyd's clock billed.
std::string TimingLine(const tally::v1::Experiment& e) {
  const tally::v1::TimingCalibrationStatus& c = e.calibration();
  if (!c.enabled()) {
    if (!c.note().empty()) return Safe(c.note());
    return "each variant's own step times (timing.calibrate: false): they depend on what ran "
           "beside it";
  }
  std::string line;
  if (c.job().empty()) {
    line = "calibration not submitted yet";
  } else if (c.times_size() > 0) {
    std::vector<std::string> times;
    for (const auto& t : c.times()) {
      times.push_back(absl::StrFormat("%s %.4gs", Safe(t.name()), t.median_seconds()));
    }
    line = absl::StrCat("calibrated by ", c.job(), " (", FormatDollars(c.cost_usd()),
                        "): ", absl::StrJoin(times, ", "), " a step");
  } else {
    const bool running = c.state() == tally::v1::JOB_STATE_QUEUED ||
                         c.state() == tally::v1::JOB_STATE_RUNNING ||
                         c.state() == tally::v1::JOB_STATE_UNSPECIFIED;
    line = absl::StrCat("calibration ", c.job(), " ", StateText(c.state()),
                        c.state_reason().empty() || running
                            ? ""
                            : absl::StrCat(" (", Safe(c.state_reason()), ")"),
                        running ? "; until it ends, each variant's own step times"
                                : "; each variant's own step times");
  }
  if (!c.note().empty()) absl::StrAppend(&line, "; ", Safe(c.note()));
  return line;
}

std::string VariantTable(const tally::v1::Experiment& e) {
  std::string out;
  const char* kRow =
      "  %-20s %-15s %-7s %-*s %-*s %-10s %-11s %-28s %-7s %-13s %-7s %-10s %s\n";
  // Judged by the quantized loss: the best is its best, and each latest
  // val_loss has its quantized one beside it.
  const bool by_quantized = e.spec().target().metric() == "quantized_val_loss";
  const bool any_quantized =
      by_quantized || std::any_of(e.variants().begin(), e.variants().end(),
                                  [](const auto& v) { return v.has_quantized_val_loss(); });
  const int loss_width = any_quantized ? 17 : 8;
  const int best_width = by_quantized ? 10 : 8;
  absl::StrAppendFormat(&out, kRow, "VARIANT", "STATE", "STEP", loss_width,
                        any_quantized ? "VAL_LOSS (QUANT)" : "VAL_LOSS", best_width,
                        by_quantized ? "BEST QUANT" : "BEST", "STEPS TO T", "TOKENS TO T",
                        "RECIPE $ TO T (P10-P90)", "x REF", "BILLED $ TO T", "x REF", "$ SO FAR",
                        "NOTE");
  for (const auto& v : e.variants()) {
    const std::string state =
        v.job().empty() && v.state() == tally::v1::JOB_STATE_UNSPECIFIED
            ? std::string("-")
            : StateText(v.state());
    std::vector<std::string> notes;
    if (v.name() == e.reference_variant()) notes.push_back("reference");
    if (v.halted()) notes.push_back("stopped by successive halving");
    if (v.held_at_rung() > 0) notes.push_back(absl::StrCat("held at rung ", v.held_at_rung()));
    if (!v.note().empty()) notes.push_back(v.note());
    if (v.step_time_varied()) {
      notes.push_back(absl::StrFormat("step time varied %.0f%% (p10-p90): recipe cost less "
                                      "certain",
                                      100 * v.step_seconds_spread()));
    }
    if (v.recipe_cost_to_target_usd() > 0 && v.cost_to_target_usd() > 0) {
      const double r = v.cost_to_target_usd() / v.recipe_cost_to_target_usd();
      if (r > 1.25 || r < 0.8) notes.push_back(absl::StrFormat("billed %.2fx its recipe cost", r));
    }
    const bool recipe = v.recipe_cost_to_target_usd() > 0;
    const std::string name = v.replicate() > 0 && e.spec().replicates() > 1
                                 ? absl::StrCat(v.name(), "#", v.replicate())
                                 : v.name();
    std::string loss = LossOrDash(v.val_loss());
    if (v.has_quantized_val_loss()) {
      absl::StrAppend(&loss, " (", LossOrDash(v.quantized_val_loss()), ")");
    }
    absl::StrAppendFormat(
        &out, kRow, Safe(name), state, absl::StrCat(v.step()), loss_width, loss, best_width,
        LossOrDash(by_quantized ? v.best_quantized_val_loss() : v.best_val_loss()),
        v.reached_target() ? absl::StrFormat("%.1f", v.steps_to_target()) : std::string("-"),
        v.reached_target() ? Count(v.tokens_to_target()) : std::string("-"),
        recipe ? absl::StrCat(FormatDollars(v.recipe_cost_to_target_usd()), " (",
                              FormatDollars(v.recipe_cost_low_usd()).substr(1), "-",
                              FormatDollars(v.recipe_cost_high_usd()).substr(1), ")")
               : std::string("-"),
        v.recipe_ratio_to_reference() > 0
            ? absl::StrFormat("%.2fx", v.recipe_ratio_to_reference())
            : std::string("-"),
        v.reached_target() ? FormatDollars(v.cost_to_target_usd()) : std::string("-"),
        v.ratio_to_reference() > 0 ? absl::StrFormat("%.2fx", v.ratio_to_reference())
                                   : std::string("-"),
        FormatDollars(v.cost_usd()), Safe(absl::StrJoin(notes, "; ")));
  }
  absl::StrAppend(&out,
                  "  recipe $: steps to the target x a step's time (the timing calibration's "
                  "median, else the variant's own) x its GPUs' price (the recipe's cost, wherever "
                  "and whenever it ran); billed $: tallyd's clock (start-up, evaluations and a "
                  "busy machine included)\n");
  if (e.spec().replicates() > 1) absl::StrAppend(&out, SummaryTable(e));
  return out;
}

namespace {

// "12.3 (10.1-14.5)": a mean and its interval, or "-".
std::string WithInterval(double mean, double low, double high, int reached,
                         const std::function<std::string(double)>& f) {
  if (reached == 0) return "-";
  return absl::StrCat(f(mean), " (", f(low), "-", f(high), ")");
}

}  // namespace

std::string SummaryTable(const tally::v1::Experiment& e) {
  std::string out = absl::StrFormat("  over %d replicates (mean and 90%% interval):\n",
                                    e.spec().replicates());
  const char* kRow = "  %-20s %-7s %-22s %-22s %-32s %-22s %s\n";
  absl::StrAppendFormat(&out, kRow, "VARIANT", "REACHED", "STEPS TO T", "TOKENS TO T",
                        "RECIPE $ TO T", "x REF", "VERDICT");
  auto steps = [](double x) { return absl::StrFormat("%.1f", x); };
  auto dollars = [](double x) { return FormatDollars(x); };
  auto ratio = [](double x) { return absl::StrFormat("%.2fx", x); };
  for (const auto& s : e.summaries()) {
    absl::StrAppendFormat(
        &out, kRow, Safe(s.name()), absl::StrCat(s.reached_target(), "/", s.replicates()),
        WithInterval(s.steps_to_target(), s.steps_ci90_low(), s.steps_ci90_high(),
                     s.reached_target(), steps),
        WithInterval(s.tokens_to_target(), s.tokens_ci90_low(), s.tokens_ci90_high(),
                     s.reached_target(), Count),
        WithInterval(s.recipe_cost_to_target_usd(), s.recipe_cost_ci90_low_usd(),
                     s.recipe_cost_ci90_high_usd(), s.recipe_cost_to_target_usd() > 0, dollars),
        WithInterval(s.recipe_ratio_to_reference(), s.recipe_ratio_ci90_low(),
                     s.recipe_ratio_ci90_high(), s.ratio_pairs(), ratio),
        Safe(s.verdict()));
  }
  absl::StrAppend(&out,
                  "  x REF pairs each run with the reference's run of the same seed; \"cheaper\" "
                  "only when the whole interval is below 1\n");
  return out;
}

}  // namespace tally::cli
