#include "server/experiments/decide.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/proto_time.h"
#include "common/text.h"
#include "server/experiments/calibration.h"
#include "server/experiments/verdict.h"
#include "server/policy/stop_rules.h"
#include "server/policy/target.h"
#include "server/store/job_store.h"

namespace tally::experiments {
namespace {

using tally::v1::Experiment;
using tally::v1::ExperimentState;
using tally::v1::Job;
using tally::v1::JobState;
using tally::v1::VariantStatus;

std::string ShortState(JobState s) {
  std::string name = tally::v1::JobState_Name(s);
  if (name.rfind("JOB_STATE_", 0) == 0) name = name.substr(10);
  return name;
}


void AddEvent(Plan& p, const std::string& type, const std::string& variant,
              const std::string& reason, const std::string& detail, absl::Time now) {
  Experiment& e = *p.rec.mutable_experiment();
  tally::v1::ExperimentEvent ev;
  ev.set_experiment(e.name());
  ev.set_sequence(e.last_event_sequence() + 1);
  *ev.mutable_time() = ToProto(now);
  ev.set_type(type);
  ev.set_state(e.state());
  ev.set_variant(variant);
  ev.set_reason(reason);
  ev.set_detail(detail);
  e.set_last_event_sequence(ev.sequence());
  p.events.push_back(std::move(ev));
  p.commit = true;
}

void End(Plan& p, ExperimentState state, const std::string& type, const std::string& reason,
         absl::Time now) {
  Experiment& e = *p.rec.mutable_experiment();
  e.set_state(state);
  e.set_state_reason(reason);
  *e.mutable_end_time() = ToProto(now);
  AddEvent(p, type, "", reason, "", now);
}

bool Active(const std::optional<Job>& job) {
  return job && !store::IsTerminal(job->state());
}

// Successive halving's yardstick for rung `k`, and where a variant stands
// against it.
struct Rung {
  bool dollars = true;
  double d0 = 0;  // dollars: the first rung
  int rungs = 0;
};

Rung RungOf(const Experiment& e) {
  Rung r;
  const int n = e.spec().variants_size();
  while ((1 << r.rungs) < n) ++r.rungs;
  if (e.spec().rung_dollars() > 0) {
    r.d0 = e.spec().rung_dollars();
  } else if (e.spec().budget().max_dollars() > 0) {
    r.d0 = e.spec().budget().max_dollars() / (n * (r.rungs + 1.0));
  } else {
    r.dollars = false;
  }
  return r;
}

bool PassedRung(const Rung& r, int k, const Job& job) {
  if (r.dollars) return job.cost().cost_usd() >= r.d0 * std::ldexp(1.0, k);
  const double max_steps = std::max<int64_t>(1, job.spec().training().max_steps());
  return static_cast<double>(job.step()) >= max_steps * std::ldexp(1.0, k - r.rungs);
}

std::string RungLabel(const Rung& r, int k, int64_t max_steps) {
  if (r.dollars) return FormatDollars(r.d0 * std::ldexp(1.0, k)) + " each";
  return absl::StrCat(static_cast<int64_t>(max_steps * std::ldexp(1.0, k - r.rungs)),
                      " steps (1/", 1 << (r.rungs - k), " of max_steps) each");
}

// What successive halving ranks a variant by, and the figure's name.
struct Score {
  double value = std::numeric_limits<double>::infinity();
  std::string figure;
};

// By the experiment's metric: the variant's forecast is of it (its
// early_stopping.metric is the target's).
Score ScoreOf(policy::LossMetric metric, const VariantStatus& v) {
  const std::string name = policy::LossMetricName(metric);
  if (v.forecast().valid() && std::isfinite(v.forecast().final_val_loss())) {
    return {v.forecast().final_val_loss(), "forecast final " + name};
  }
  const double latest = LatestLoss(metric, v);
  if (std::isfinite(latest) && latest > 0) return {latest, "latest " + name};
  return {std::numeric_limits<double>::infinity(), "no evaluation"};
}

}  // namespace

std::string VariantRequestId(const std::string& experiment_name, const std::string& variant,
                             int replicate) {
  std::string id = absl::StrCat(experiment_name, "/variants/", variant);
  if (replicate > 1) absl::StrAppend(&id, "/replicates/", replicate);
  return id;
}

std::string CalibrationRequestId(const std::string& experiment_name) {
  return absl::StrCat(experiment_name, "/timing");
}

Plan DecideCancel(const store::ExperimentRecord& rec,
                  const std::vector<std::optional<Job>>& jobs, const std::string& reason,
                  absl::Time now, const std::optional<Job>& calibration) {
  Plan p;
  p.rec = rec;
  FillFigures(jobs, p.rec.mutable_experiment(), calibration);
  const std::string why = reason.empty() ? "cancelled by request" : "cancelled: " + reason;
  End(p, tally::v1::EXPERIMENT_STATE_CANCELLED, "cancelled", why, now);
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (Active(jobs[i])) {
      Action a;
      a.kind = Action::kCancel;
      a.variant = static_cast<int>(i);
      a.reason = absl::StrCat("experiment ", rec.experiment().name(), " ", why);
      p.actions.push_back(std::move(a));
    }
  }
  if (Active(calibration)) {
    Action a;
    a.kind = Action::kCancel;
    a.variant = kCalibration;
    a.reason = absl::StrCat("experiment ", rec.experiment().name(), " ", why);
    p.actions.push_back(std::move(a));
  }
  return p;
}

namespace {

const std::optional<Job>& JobOf(const std::vector<std::optional<Job>>& jobs, int i) {
  static const std::optional<Job> kNone;
  return i < static_cast<int>(jobs.size()) ? jobs[i] : kNone;
}

Action HoldOrRelease(bool hold, int variant, const std::string& reason) {
  Action a;
  a.kind = hold ? Action::kHold : Action::kRelease;
  a.variant = variant;
  a.reason = reason;
  return a;
}

// Rung k judged, every contender having reached its mark: the worse half of
// the variants by ScoreOf (a variant's runs by their mean) stop, the held
// among the rest are released. A variant's runs are kept or stopped
// together.
void JudgeRung(const std::vector<int>& contenders, const Rung& r, const std::string& mark,
               absl::Time now, Plan* plan) {
  Plan& p = *plan;
  Experiment& e = *p.rec.mutable_experiment();
  const int k = e.rung();
  const policy::LossMetric metric = MetricOf(e.spec());
  // The variants in the race, in the file's order, each with its runs.
  struct Group {
    std::string name;
    std::vector<int> runs;
    Score score;
  };
  std::vector<Group> groups;
  for (int i : contenders) {
    const std::string& name = e.variants(i).name();
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const Group& g) { return g.name == name; });
    if (it == groups.end()) {
      groups.push_back({name, {}, {}});
      it = groups.end() - 1;
    }
    it->runs.push_back(i);
  }
  for (Group& g : groups) {
    if (g.runs.size() == 1) {
      g.score = ScoreOf(metric, e.variants(g.runs[0]));
      continue;
    }
    double sum = 0;
    int n = 0;
    std::string figure;
    for (int i : g.runs) {
      const Score s = ScoreOf(metric, e.variants(i));
      if (!std::isfinite(s.value)) continue;
      sum += s.value;
      ++n;
      figure = figure.empty() || figure == s.figure ? s.figure : "figure";
    }
    if (n > 0) {
      g.score = {sum / n, absl::StrCat("mean over ", n, " runs of its ", figure)};
    }
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.score.value < b.score.value; });
  const size_t keep = groups.size() - groups.size() / 2;
  std::vector<std::string> kept, halted;
  for (size_t j = 0; j < groups.size(); ++j) {
    const Group& g = groups[j];
    const std::string line =
        absl::StrFormat("%s (%s %.4f)", g.name, g.score.figure, g.score.value);
    (j < keep ? kept : halted).push_back(line);
    for (int i : g.runs) {
      VariantStatus* v = e.mutable_variants(i);
      const bool was_held = v->held_at_rung() > 0;
      v->set_held_at_rung(0);
      if (j < keep) {
        if (was_held) {
          p.actions.push_back(HoldOrRelease(
              false, i,
              absl::StrCat("experiment ", e.name(), ": rung ", k + 1, " judged, ", v->name(),
                           " goes on")));
        }
        continue;
      }
      v->set_halted(true);
      Action a;
      a.kind = Action::kStop;
      a.variant = i;
      a.state = tally::v1::JOB_STATE_EARLY_STOPPED;
      a.rule = policy::rules::kExperimentHalving;
      a.reason = absl::StrFormat(
          "successive halving, rung %d of %d: %s %.4f is in the worse half of %d "
          "variants (experiment %s)",
          k + 1, r.rungs, g.score.figure, g.score.value, groups.size(), e.name());
      p.actions.push_back(std::move(a));
    }
  }
  e.set_rung(k + 1);
  AddEvent(p, "halving", "",
           absl::StrCat("rung ", k + 1, " of ", r.rungs, " done at ", mark,
                        ": stopping ", absl::StrJoin(halted, ", ")),
           absl::StrCat("kept ", absl::StrJoin(kept, ", "), "; each ranked by its forecast final ",
                        policy::LossMetricName(metric), ", or its latest ",
                        policy::LossMetricName(metric), " before it has a forecast"),
           now);
}

// An ended experiment's acts, again (a crash may have come between the
// commit and them).
void ActAgainOnEnded(const std::vector<std::optional<Job>>& jobs,
                     const std::optional<Job>& calibration, Plan* plan) {
  Plan& p = *plan;
  Experiment& e = *p.rec.mutable_experiment();
  const int n = e.variants_size();
  auto job_of = [&](int i) -> const std::optional<Job>& {
    return i == kCalibration ? calibration : JobOf(jobs, i);
  };
  for (int i = kCalibration; i < n; ++i) {
    if (!Active(job_of(i))) continue;
    Action a;
    a.variant = i;
    if (e.state() == tally::v1::EXPERIMENT_STATE_BUDGET_EXHAUSTED) {
      a.kind = Action::kStop;
      a.state = tally::v1::JOB_STATE_BUDGET_EXHAUSTED;
      a.rule = policy::rules::kExperimentBudget;
      a.reason = e.state_reason();
    } else {
      a.kind = Action::kCancel;
      a.reason = absl::StrCat("experiment ", e.name(), " ", e.state_reason());
    }
    p.actions.push_back(std::move(a));
  }
  FillFigures(jobs, &e, calibration);
}

// A from_variant target: the reference's final loss, once it has ended (or
// none, if it ended without one or never ran; every variant then says so).
// With replicates, the highest final loss among the reference's runs, once
// every one of them has ended (those that ended without a loss left out):
// each of them reached it, so every replicate has a pair to be judged by.
void TakeTargetFromReference(const std::vector<std::optional<Job>>& jobs, int ref,
                             absl::Time now, Plan* plan) {
  Plan& p = *plan;
  Experiment& e = *p.rec.mutable_experiment();
  const int n = e.variants_size();
  const bool from_variant = e.spec().target().has_from_variant();
  const policy::LossMetric metric = MetricOf(e.spec());
  auto job_of = [&](int i) -> const std::optional<Job>& { return JobOf(jobs, i); };
  std::vector<int> runs;
  for (int i = 0; i < n; ++i) {
    if (IsReference(e, i)) runs.push_back(i);
  }
  if (!from_variant || e.target_val_loss() > 0 || p.rec.target_unavailable() ||
      runs.empty()) {
    runs.clear();
  }
  bool all_ended = !runs.empty(), any_job = false;
  double worst = 0;
  int with_loss = 0;
  std::vector<std::string> names;
  for (int i : runs) {
    const std::optional<Job>& job = job_of(i);
    if (job) {
      any_job = true;
      all_ended = all_ended && store::IsTerminal(job->state());
      if (store::IsTerminal(job->state()) && FinalLoss(*job, metric) > 0) {
        worst = std::max(worst, FinalLoss(*job, metric));
        ++with_loss;
        names.push_back(job->name());
      }
    } else {
      all_ended = all_ended && store::IsTerminal(e.variants(i).state());
    }
  }
  const std::string ref_name =
      ref < n ? e.variants(ref).name() : std::string();  // n == 0: nothing ends
  if (all_ended && with_loss > 0) {
    const double target = worst;
    e.set_target_val_loss(target);
    FillFigures(jobs, &e);
    const std::string name = policy::LossMetricName(metric);
    const std::string loss =
        metric == policy::LossMetric::kValLoss ? std::string("validation loss") : name;
    AddEvent(p, "target", ref_name,
             runs.size() == 1
                 ? absl::StrFormat("target %s %.4f: the final %s of %s (%s)", name, target, loss,
                                   ref_name, names[0])
                 : absl::StrFormat(
                       "target %s %.4f: the highest final %s of %s's %d "
                       "runs (%s), so that each of them reached it",
                       name, target, loss, ref_name, with_loss, absl::StrJoin(names, ", ")),
             "", now);
  } else if (all_ended && any_job) {
    p.rec.set_target_unavailable(true);
    const std::optional<Job>& job = job_of(runs[0]);
    AddEvent(p, "target", ref_name,
             absl::StrCat("no target: the reference variant ", ref_name, " ended ",
                          job ? ShortState(job->state()) : "FAILED", " without a ",
                          metric == policy::LossMetric::kValLoss ? "validation loss"
                                                                 : "quantized_val_loss"),
             "", now);
  } else if (all_ended) {
    p.rec.set_target_unavailable(true);
    AddEvent(p, "target", ref_name,
             absl::StrCat("no target: the reference variant ", ref_name, " never ran"), "",
             now);
  }
  if (p.rec.target_unavailable()) {
    for (int i = 0; i < n; ++i) {
      if (job_of(i)) {
        e.mutable_variants(i)->set_note(absl::StrCat(
            "no target: the reference variant ended without a ",
            metric == policy::LossMetric::kValLoss ? "validation loss" : "quantized_val_loss"));
      }
    }
  }
}

// calibration_ended once the calibration's job has ended, with its times.
void AddCalibrationEvents(JobState before, absl::Time now, Plan* plan) {
  const tally::v1::TimingCalibrationStatus& c = plan->rec.experiment().calibration();
  if (c.job().empty() || !store::IsTerminal(c.state()) || store::IsTerminal(before)) return;
  std::vector<std::string> times;
  for (const auto& t : c.times()) {
    times.push_back(absl::StrFormat("%s %.4g s a step", t.name(), t.median_seconds()));
  }
  AddEvent(*plan, "calibration_ended", "",
           absl::StrCat("timing calibration ", c.job(), " ended ", ShortState(c.state()),
                        c.state_reason().empty() ? "" : ": " + c.state_reason()),
           times.empty() ? std::string("each variant is priced at its own step times")
                         : absl::StrCat(absl::StrJoin(times, ", "), "; ",
                                        FormatDollars(c.cost_usd())),
           now);
}

// variant_ended for each variant whose job ended since the last pass.
void AddEndedEvents(const std::vector<std::optional<Job>>& jobs,
                    const std::vector<JobState>& before, absl::Time now, Plan* plan) {
  Plan& p = *plan;
  const Experiment& e = p.rec.experiment();
  for (int i = 0; i < e.variants_size(); ++i) {
    const std::optional<Job>& job = JobOf(jobs, i);
    if (!job || !store::IsTerminal(job->state()) || store::IsTerminal(before[i])) continue;
    const VariantStatus& v = e.variants(i);
    std::string detail = absl::StrFormat("%d steps, %s", v.step(), FormatDollars(v.cost_usd()));
    if (v.final_val_loss() > 0) {
      absl::StrAppendFormat(&detail, ", final val_loss %.4f", v.final_val_loss());
    }
    if (v.has_final_quantized_val_loss()) {
      absl::StrAppendFormat(&detail, ", final quantized_val_loss %.4f",
                            v.final_quantized_val_loss());
    }
    if (v.reached_target()) {
      absl::StrAppendFormat(&detail, "; %s to the target (step %d)",
                            FormatDollars(v.cost_to_target_usd()), v.target_step());
    } else if (!v.note().empty()) {
      absl::StrAppend(&detail, "; ", v.note());
    }
    AddEvent(p, "variant_ended", v.name(),
             absl::StrCat(v.name(), " ended ", ShortState(job->state()), ": ",
                          job->state_reason()),
             detail, now);
  }
}

// Successive halving's pass: holds at the rung's mark, the rung judged once
// every variant in the race has reached it, and releases.
void DecideHalving(const std::vector<std::optional<Job>>& jobs, absl::Time now, Plan* plan) {
  Plan& p = *plan;
  Experiment& e = *p.rec.mutable_experiment();
  const int n = e.variants_size();
  auto job_of = [&](int i) -> const std::optional<Job>& { return JobOf(jobs, i); };
  const Rung r = RungOf(e);
  const int k = e.rung();
  // In the race at this rung: not ended, not halted, not stopping, not the
  // reference (every ratio is to it, so it runs to its end whatever the
  // target). A variant without a job yet (it is submitted this pass) is in
  // it, waiting.
  std::vector<int> contenders;
  for (int i = 0; i < n; ++i) {
    if (IsReference(e, i) || e.variants(i).halted()) continue;
    const std::optional<Job>& job = job_of(i);
    if (job ? (Active(job) && !job->has_pending_stop())
            : !store::IsTerminal(e.variants(i).state())) {
      contenders.push_back(i);
    }
  }
  // A mark left on a variant that ended, was halted or is out of the
  // race, or by a race that is over (fewer than two left, or the last
  // rung judged): nothing holds it any more (released below).
  std::vector<std::string> racing_names;
  for (int i : contenders) {
    if (std::find(racing_names.begin(), racing_names.end(), e.variants(i).name()) ==
        racing_names.end()) {
      racing_names.push_back(e.variants(i).name());
    }
  }
  const bool racing = k < r.rungs && racing_names.size() >= 2;
  for (int i = 0; i < n; ++i) {
    VariantStatus* v = e.mutable_variants(i);
    if (v->held_at_rung() == 0) continue;
    const bool in_race =
        std::find(contenders.begin(), contenders.end(), i) != contenders.end();
    if (!racing || !in_race) v->set_held_at_rung(0);
  }
  auto hold = [&](int i, const std::string& why) {
    p.actions.push_back(HoldOrRelease(true, i, why));
  };
  auto release = [&](int i, const std::string& why) {
    p.actions.push_back(HoldOrRelease(false, i, why));
  };
  if (racing) {
    const int64_t max_steps =
        job_of(contenders[0]) ? job_of(contenders[0])->spec().training().max_steps() : 0;
    const std::string mark = RungLabel(r, k, max_steps);
    std::vector<bool> passed(n, false);
    std::vector<int> waiting;  // contenders below the mark with no slot
    for (int i : contenders) {
      const std::optional<Job>& job = job_of(i);
      passed[i] = job && PassedRung(r, k, *job);
      if (!job || (!passed[i] && job->state() == tally::v1::JOB_STATE_QUEUED &&
                   job->hold().empty())) {
        waiting.push_back(i);
      }
    }
    // The slots variant i would free: of its GPU type, its GPU count.
    auto resources = [&](int i) -> const tally::v1::ResourceSpec* {
      if (job_of(i)) return &job_of(i)->spec().resources();
      return i < p.rec.resolved_size() ? &p.rec.resolved(i).resources() : nullptr;
    };
    // Holding i helps only a waiting variant that its slots can run.
    auto frees_a_slot_for_a_waiting_one = [&](int i) {
      const tally::v1::ResourceSpec* mine = resources(i);
      return mine && std::any_of(waiting.begin(), waiting.end(), [&](int j) {
               const tally::v1::ResourceSpec* theirs = resources(j);
               return theirs && theirs->gpu_type() == mine->gpu_type() &&
                      std::max(1, theirs->gpu_count()) <= std::max(1, mine->gpu_count());
             });
    };
    for (int i : contenders) {
      VariantStatus* v = e.mutable_variants(i);
      const std::optional<Job>& job = job_of(i);
      if (!job) continue;
      const std::string why =
          absl::StrCat("experiment ", e.name(), ": successive halving holds ", v->name(),
                       " at rung ", k + 1, " (", mark, ") until every variant has reached it");
      if (v->held_at_rung() == k + 1) {
        if (job->hold().empty()) hold(i, why);  // a hold decided, not yet in force
        continue;
      }
      if (passed[i] && frees_a_slot_for_a_waiting_one(i)) {
        // Its slot goes to a variant that has not started this rung.
        v->set_held_at_rung(k + 1);
        hold(i, why);
        AddEvent(p, "held", v->name(),
                 absl::StrCat(v->name(), " reached rung ", k + 1, " (", mark,
                              ") while other variants wait for a slot: held there"),
                 "", now);
      }
    }
    if (std::all_of(contenders.begin(), contenders.end(), [&](int i) { return passed[i]; })) {
      JudgeRung(contenders, r, mark, now, &p);
    }
  }
  // A release decided, not yet in force (or a hold left by a rung that
  // is over): the variant is free again.
  for (int i = 0; i < n; ++i) {
    const std::optional<Job>& job = job_of(i);
    const bool decided = std::any_of(p.actions.begin(), p.actions.end(), [&](const Action& a) {
      return a.variant == i && (a.kind == Action::kRelease || a.kind == Action::kStop);
    });
    if (Active(job) && !job->hold().empty() && e.variants(i).held_at_rung() == 0 && !decided) {
      release(i, absl::StrCat("experiment ", e.name(), ": no longer held"));
    }
  }
}

// A calibration that still has no job when every variant has ended (its
// submit refused all along, e.g. by the tenant's quota, or no variant ever
// ran) never will: it ends FAILED so that the experiment can end.
void GiveUpCalibration(const std::vector<std::optional<Job>>& jobs,
                       const std::optional<Job>& calibration, absl::Time now, Plan* plan) {
  Plan& p = *plan;
  Experiment& e = *p.rec.mutable_experiment();
  tally::v1::TimingCalibrationStatus* c = e.mutable_calibration();
  if (!p.rec.has_calibration_spec() || calibration || !c->job().empty() ||
      store::IsTerminal(c->state())) {
    return;
  }
  for (int i = 0; i < e.variants_size(); ++i) {
    const std::optional<Job>& job = JobOf(jobs, i);
    if (job ? !store::IsTerminal(job->state()) : !store::IsTerminal(e.variants(i).state())) {
      return;
    }
  }
  c->set_state(tally::v1::JOB_STATE_FAILED);
  c->set_state_reason("never submitted: every variant ended before tallyd accepted its job");
  AddEvent(p, "calibration_ended", "",
           absl::StrCat("timing calibration ended FAILED: ", c->state_reason()),
           "each variant is priced at its own step times", now);
}

// Submits what has no job yet: the variants, the reference first, then
// the timing calibration.
void SubmitMissing(const std::vector<std::optional<Job>>& jobs,
                   const std::optional<Job>& calibration, Plan* plan) {
  Plan& p = *plan;
  Experiment& e = *p.rec.mutable_experiment();
  const int n = e.variants_size();
  auto job_of = [&](int i) -> const std::optional<Job>& { return JobOf(jobs, i); };
  std::vector<int> order;
  for (int i = 0; i < n; ++i) {
    if (IsReference(e, i)) order.push_back(i);
  }
  for (int i = 0; i < n; ++i) {
    if (!IsReference(e, i)) order.push_back(i);
  }
  for (int i : order) {
    if (job_of(i) || store::IsTerminal(e.variants(i).state()) || i >= p.rec.resolved_size()) {
      continue;
    }
    Action a;
    a.kind = Action::kSubmit;
    a.variant = i;
    a.spec = p.rec.resolved(i);
    (*a.spec.mutable_labels())["experiment"] = e.name();
    (*a.spec.mutable_labels())["variant"] = e.variants(i).name();
    a.request_id =
        VariantRequestId(e.name(), e.variants(i).name(), e.variants(i).replicate());
    p.actions.push_back(std::move(a));
  }
  // Then the timing calibration, after them.
  if (p.rec.has_calibration_spec() && !calibration && e.calibration().job().empty() &&
      !store::IsTerminal(e.calibration().state())) {
    Action a;
    a.kind = Action::kSubmit;
    a.variant = kCalibration;
    a.spec = p.rec.calibration_spec();
    (*a.spec.mutable_labels())["experiment"] = e.name();
    (*a.spec.mutable_labels())["calibration"] = "timing";
    a.request_id = CalibrationRequestId(e.name());
    p.actions.push_back(std::move(a));
  }
}

}  // namespace

Plan Decide(const store::ExperimentRecord& rec, const std::vector<std::optional<Job>>& jobs,
            absl::Time now, const std::optional<Job>& calibration) {
  Plan p;
  p.rec = rec;
  Experiment& e = *p.rec.mutable_experiment();
  const tally::v1::ExperimentSpec& spec = e.spec();
  const int n = e.variants_size();
  auto job_of = [&](int i) -> const std::optional<Job>& { return JobOf(jobs, i); };

  if (e.state() != tally::v1::EXPERIMENT_STATE_RUNNING) {
    ActAgainOnEnded(jobs, calibration, &p);
    return p;
  }

  const int ref = std::max(0, ReferenceRun(e, 1));  // the reference's first run
  const bool from_variant = spec.target().has_from_variant();
  if (!from_variant && e.target_val_loss() <= 0 && spec.target().val_loss() > 0) {
    e.set_target_val_loss(spec.target().val_loss());
  }

  // Variants that ended since the last pass.
  std::vector<JobState> before(n);
  for (int i = 0; i < n; ++i) before[i] = e.variants(i).state();
  const JobState calibration_before = e.calibration().state();
  FillFigures(jobs, &e, calibration);
  AddCalibrationEvents(calibration_before, now, &p);

  TakeTargetFromReference(jobs, ref, now, &p);

  AddEndedEvents(jobs, before, now, &p);

  // The budget, for all variants together.
  const double max_dollars = spec.budget().max_dollars();
  if (max_dollars > 0 && e.cost_usd() >= max_dollars) {
    End(p, tally::v1::EXPERIMENT_STATE_BUDGET_EXHAUSTED, "budget_exhausted",
        absl::StrFormat("budget spent: %s of %s", FormatDollars(e.cost_usd()), FormatDollars(max_dollars)),
        now);
    for (int i = kCalibration; i < n; ++i) {
      if (!Active(i == kCalibration ? calibration : job_of(i))) continue;
      Action a;
      a.kind = Action::kStop;
      a.variant = i;
      a.state = tally::v1::JOB_STATE_BUDGET_EXHAUSTED;
      a.rule = policy::rules::kExperimentBudget;
      a.reason = absl::StrCat("experiment ", e.name(), " ", e.state_reason());
      p.actions.push_back(std::move(a));
    }
    return p;
  }

  GiveUpCalibration(jobs, calibration, now, &p);
  SubmitMissing(jobs, calibration, &p);

  // The target in force on every variant still to finish.
  if (e.target_val_loss() > 0) {
    for (int i = 0; i < n; ++i) {
      if (from_variant && IsReference(e, i)) continue;
      const std::optional<Job>& job = job_of(i);
      if (!Active(job) || job->target_val_loss() == e.target_val_loss() ||
          job->has_pending_stop()) {
        continue;
      }
      Action a;
      a.kind = Action::kSetTarget;
      a.variant = i;
      a.target_val_loss = e.target_val_loss();
      a.reason = from_variant
                     ? absl::StrCat("experiment ", e.name(), ": the final loss of ",
                                    e.variants(ref).name())
                     : absl::StrCat("experiment ", e.name(), "'s target");
      p.actions.push_back(std::move(a));
    }
  }

  if (spec.strategy() == tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING) {
    DecideHalving(jobs, now, &p);
  }

  // Done when every variant has a job and every job has ended, the
  // calibration's included.
  // (FillFigures has copied the calibration job's state into its status.)
  bool done = n > 0 && (!p.rec.has_calibration_spec() ||
                        store::IsTerminal(e.calibration().state()));
  for (int i = 0; i < n; ++i) {
    const std::optional<Job>& job = job_of(i);
    done = done && (job ? store::IsTerminal(job->state())
                        : store::IsTerminal(e.variants(i).state()));  // refused
  }
  if (done) {
    End(p, tally::v1::EXPERIMENT_STATE_SUCCEEDED, "succeeded",
        absl::StrCat(spec.replicates() > 1 ? ReplicatesVerdict(e) : Verdict(e, ref), "; ",
                     TimingSentence(e)),
        now);
  }
  return p;
}

Plan DecideSubmitted(const store::ExperimentRecord& rec, int variant, const Job& job,
                     absl::Time now) {
  Plan p;
  p.rec = rec;
  if (variant == kCalibration) {
    FillCalibration(job, p.rec.mutable_experiment());
    AddEvent(p, "calibration_submitted", "", absl::StrCat("timing calibration: ", job.name()),
             absl::StrCat(job.spec().calibration().variants_size(), " variants, ",
                          job.spec().calibration().rounds(), " rounds of ",
                          job.spec().calibration().steps(), " timed steps each"),
             now);
    return p;
  }
  VariantStatus* v = p.rec.mutable_experiment()->mutable_variants(variant);
  FillVariantFigures(job, p.rec.experiment().target_val_loss(),
                     MetricOf(p.rec.experiment().spec()), v);
  AddEvent(p, "variant_submitted", v->name(), absl::StrCat(v->name(), ": ", job.name()),
           job.spec().display_name(), now);
  return p;
}

Plan DecideSubmitRefused(const store::ExperimentRecord& rec, int variant,
                         const std::string& error, absl::Time now) {
  Plan p;
  p.rec = rec;
  if (variant == kCalibration) {
    tally::v1::TimingCalibrationStatus* c = p.rec.mutable_experiment()->mutable_calibration();
    c->set_state(tally::v1::JOB_STATE_FAILED);
    c->set_state_reason(absl::StrCat("tallyd refused its job: ", error));
    AddEvent(p, "calibration_ended", "", absl::StrCat("timing calibration ended FAILED: ",
                                                      c->state_reason()),
             "each variant is priced at its own step times", now);
    return p;
  }
  VariantStatus* v = p.rec.mutable_experiment()->mutable_variants(variant);
  v->set_state(tally::v1::JOB_STATE_FAILED);
  v->set_state_reason(absl::StrCat("tallyd refused its job: ", error));
  v->set_note("never ran");
  AddEvent(p, "variant_ended", v->name(),
           absl::StrCat(v->name(), " ended FAILED: ", v->state_reason()), "", now);
  return p;
}

}  // namespace tally::experiments
