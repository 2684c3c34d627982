#include "server/experiments/manager.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/experiment_spec.h"
#include "common/names.h"
#include "common/proto_time.h"
#include "common/spec_validation.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "server/experiments/calibration.h"

namespace tally::experiments {
namespace {

using tally::v1::Experiment;
using tally::v1::Job;

// The longest experiment name a label will hold, for validating variants
// before the experiment has its id.
constexpr char kLongestName[] = "experiments/9223372036854775807";
constexpr size_t kMaxDisplayNameChars = 200;

bool Transient(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsResourceExhausted(s) || absl::IsInternal(s) ||
         absl::IsAborted(s) || absl::IsDeadlineExceeded(s);
}

}  // namespace

ExperimentManager::ExperimentManager(store::JobStore* store, sched::Scheduler* scheduler,
                                     const Clock* clock, metrics::Registry* registry)
    : store_(store), scheduler_(scheduler), clock_(clock) {
  const metrics::Labels none;
  variant_cost_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_variant_cost_dollars",
      "Dollars an experiment's variant has spent so far.", none);
  variant_val_loss_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_variant_val_loss",
      "The latest validation loss of an experiment's variant.", none);
  variant_quantized_val_loss_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_variant_quantized_val_loss",
      "The latest quantized validation loss of an experiment's variant (the model quantized "
      "as its GGUF export will be; variants evaluated quantized only).",
      none);
  variant_cost_to_target_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_variant_cost_to_target_dollars",
      "Dollars a variant needed to reach the experiment's target validation loss "
      "(interpolated between the evaluations that straddle it); exported once reached.",
      none);
  variant_recipe_cost_to_target_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_variant_recipe_cost_to_target_dollars",
      "A variant's recipe cost to the experiment's target: its steps to the target at its "
      "step time (the experiment's timing calibration, else its own median) and its GPUs' "
      "price (independent of when and where it ran; what the experiment's verdict uses); "
      "exported once reached and timed.",
      none);
  variant_reached_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_variant_reached_target",
      "1 when the variant has reached the experiment's target validation loss, else 0.", none);
  target_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_target_val_loss",
      "The experiment's target loss, once known: a validation loss, or a quantized one with "
      "target.metric quantized_val_loss.",
      none);
  cost_ = &registry->Add<metrics::Gauge>(
      "tally_experiment_cost_dollars", "Dollars all of an experiment's variants have spent.",
      none);
}

absl::Status ExperimentManager::Recover() {
  ASSIGN_OR_RETURN(std::vector<store::ExperimentRecord> running,
                   store_->ListActiveExperiments());
  for (auto& rec : running) {
    const int64_t id = rec.id();
    active_[id] = std::move(rec);
  }
  // An experiment that ended just before a crash may have variants its end
  // had still to cancel or stop: they are found by their label.
  ASSIGN_OR_RETURN(std::vector<store::JobRecord> jobs, store_->ListActiveJobs());
  for (const auto& job : jobs) {
    auto label = job.job().spec().labels().find("experiment");
    if (label == job.job().spec().labels().end()) continue;
    absl::StatusOr<int64_t> id = ParseExperimentName(label->second);
    if (!id.ok() || active_.count(*id)) continue;
    absl::StatusOr<store::ExperimentRecord> rec = store_->GetExperiment(*id);
    if (rec.ok()) active_[*id] = std::move(*rec);  // its next pass acts
  }
  // Every experiment's series as last committed, ended ones included, as a
  // tallyd that had not restarted would export them (running ones are
  // refreshed by their next pass).
  int64_t before_id = 0;
  constexpr int kPage = 500;
  while (true) {
    absl::StatusOr<std::vector<store::ExperimentRecord>> page =
        store_->ListExperiments(before_id, kPage, std::nullopt);
    RETURN_IF_ERROR(page.status());
    for (const auto& rec : *page) Export(rec.experiment());
    if (static_cast<int>(page->size()) < kPage) break;
    before_id = page->back().id();
  }
  return absl::OkStatus();
}

std::optional<Job> ExperimentManager::JobNamed(const std::string& name) {
  if (name.empty()) return std::nullopt;
  absl::StatusOr<int64_t> id = ParseJobName(name);
  if (!id.ok()) return std::nullopt;
  if (auto view = scheduler_->ActiveJobView(*id)) return view;
  auto it = ended_jobs_.find(*id);
  if (it == ended_jobs_.end()) {
    absl::StatusOr<store::JobRecord> stored = store_->GetJob(*id);
    if (!stored.ok()) return std::nullopt;  // read again on the next pass
    it = ended_jobs_.emplace(*id, stored->job()).first;
  }
  return it->second;
}

std::vector<std::optional<Job>> ExperimentManager::JobsOf(const store::ExperimentRecord& rec) {
  std::vector<std::optional<Job>> jobs(rec.experiment().variants_size());
  for (int i = 0; i < rec.experiment().variants_size(); ++i) {
    jobs[i] = JobNamed(rec.experiment().variants(i).job());
  }
  return jobs;
}

std::optional<Job> ExperimentManager::CalibrationJobOf(const store::ExperimentRecord& rec) {
  return JobNamed(rec.experiment().calibration().job());
}

absl::StatusOr<Experiment> ExperimentManager::Create(tally::v1::ExperimentSpec spec,
                                                     const std::string& request_id,
                                                     const sched::Actor& by) {
  RETURN_IF_ERROR(ValidateRequestId(request_id));
  ApplyExperimentDefaults(&spec);
  RETURN_IF_ERROR(ValidateExperimentSpec(spec));
  RETURN_IF_ERROR(scheduler_->CheckTenantQuota(by.tenant));
  store::ExperimentRecord rec;
  Experiment& e = *rec.mutable_experiment();
  for (int i = 0; i < spec.variants_size(); ++i) {
    const std::string& variant = spec.variants(i).name();
    ASSIGN_OR_RETURN(tally::v1::JobSpec resolved, ResolveVariant(spec, i));
    if (resolved.display_name().empty()) {
      std::string name = absl::StrCat(
          spec.display_name().empty() ? "experiment" : spec.display_name(), "/", variant);
      resolved.set_display_name(Utf8Length(name) <= kMaxDisplayNameChars ? name : variant);
    }
    // As it will be submitted, labels included.
    tally::v1::JobSpec check = resolved;
    (*check.mutable_labels())["experiment"] = kLongestName;
    (*check.mutable_labels())["variant"] = variant;
    if (spec.replicates() > 1) (*check.mutable_labels())["replicate"] = "8";
    if (absl::Status s = PrepareJobSpec(&check); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variants[", i, "] (", EscapeUnprintable(variant), "): spec.", s.message(),
          " (each variant's job carries the labels experiment and variant)"));
    }
    // Replicate r trains with the variant's seed + r - 1: one run per seed.
    const int replicates = std::max(1, spec.replicates());
    const uint64_t seed = resolved.training().seed();
    for (int r = 1; r <= replicates; ++r) {
      tally::v1::JobSpec run = resolved;
      run.mutable_training()->set_seed(seed + static_cast<uint64_t>(r - 1));
      if (replicates > 1) {
        (*run.mutable_labels())["replicate"] = absl::StrCat(r);
        std::string name = absl::StrCat(run.display_name(), "#", r);
        if (Utf8Length(name) <= kMaxDisplayNameChars) run.set_display_name(name);
      }
      *rec.add_resolved() = std::move(run);
      tally::v1::VariantStatus* v = e.add_variants();
      v->set_name(variant);
      v->set_replicate(r);
      v->set_seed(seed + static_cast<uint64_t>(r - 1));
    }
  }
  RETURN_IF_ERROR(PlanTiming(spec, &rec));
  *e.mutable_spec() = spec;
  e.set_state(tally::v1::EXPERIMENT_STATE_RUNNING);
  e.set_state_reason("running its variants");
  const absl::Time now = clock_->Now();
  *e.mutable_create_time() = ToProto(now);
  e.set_request_id(request_id);
  e.set_tenant(by.tenant);
  e.set_created_by(by.name);
  e.set_reference_variant(spec.variants(ReferenceIndex(spec)).name());
  if (spec.target().val_loss() > 0) e.set_target_val_loss(spec.target().val_loss());
  tally::v1::ExperimentEvent first;
  first.set_type("created");
  first.set_state(tally::v1::EXPERIMENT_STATE_RUNNING);
  *first.mutable_time() = ToProto(now);
  first.set_reason(absl::StrCat(spec.variants_size(), " variants",
                                spec.replicates() > 1
                                    ? absl::StrCat(" x ", spec.replicates(), " replicates")
                                    : "",
                                ", reference ", e.reference_variant()));
  const std::string metric = policy::LossMetricName(MetricOf(spec));
  first.set_detail(spec.target().has_from_variant()
                       ? absl::StrCat("target: the final ", metric, " of ",
                                      spec.target().from_variant())
                       : absl::StrCat("target: ", metric, " ", spec.target().val_loss()));
  first.set_principal(by.name);
  ASSIGN_OR_RETURN(store::ExperimentCreateResult created,
                   store_->CreateExperiment(std::move(rec), std::move(first)));
  const int64_t id = created.experiment.id();
  if (created.created) {
    if (listener_) listener_(id);
    if (created.experiment.experiment().state() == tally::v1::EXPERIMENT_STATE_RUNNING) {
      active_[id] = created.experiment;
      // Its variants are submitted now; a failure here is retried by the
      // next pass, the experiment is stored either way.
      ReconcileOne(id).IgnoreError();
    }
  }
  return Get(id);
}

absl::StatusOr<Experiment> ExperimentManager::Get(int64_t id) {
  auto it = active_.find(id);
  if (it != active_.end()) return View(it->second);
  ASSIGN_OR_RETURN(store::ExperimentRecord rec, store_->GetExperiment(id));
  return View(rec);
}

absl::StatusOr<std::vector<Experiment>> ExperimentManager::List(
    int64_t before_id, int limit, const std::optional<std::string>& tenant) {
  ASSIGN_OR_RETURN(std::vector<store::ExperimentRecord> recs,
                   store_->ListExperiments(before_id, limit, tenant));
  std::vector<Experiment> out;
  out.reserve(recs.size());
  for (const auto& rec : recs) {
    auto it = active_.find(rec.id());
    out.push_back(View(it != active_.end() ? it->second : rec));
  }
  return out;
}

Experiment ExperimentManager::View(const store::ExperimentRecord& rec) {
  Experiment e = rec.experiment();
  FillFigures(JobsOf(rec), &e, CalibrationJobOf(rec));
  return e;
}

absl::Status ExperimentManager::PlanTiming(const tally::v1::ExperimentSpec& spec,
                                           store::ExperimentRecord* rec) {
  std::vector<tally::v1::JobSpec> firsts;  // each variant's first run
  for (int i = 0; i < rec->experiment().variants_size(); ++i) {
    if (rec->experiment().variants(i).replicate() <= 1) firsts.push_back(rec->resolved(i));
  }
  CalibrationPlan plan = PlanCalibration(
      spec, firsts, spec.display_name().empty() ? "experiment" : spec.display_name());
  tally::v1::TimingCalibrationStatus* status =
      rec->mutable_experiment()->mutable_calibration();
  status->set_enabled(plan.spec.has_value());
  status->set_note(plan.note);
  if (!plan.spec) return absl::OkStatus();
  // As it will be submitted, labels included.
  tally::v1::JobSpec check = *plan.spec;
  (*check.mutable_labels())["experiment"] = kLongestName;
  (*check.mutable_labels())["calibration"] = "timing";
  if (absl::Status s = PrepareJobSpec(&check); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("timing: the calibration job's spec is refused (", s.message(),
                     "); set timing.calibrate: false to run without it"));
  }
  *rec->mutable_calibration_spec() = std::move(*plan.spec);
  return absl::OkStatus();
}

absl::StatusOr<Experiment> ExperimentManager::Cancel(int64_t id, const std::string& reason,
                                                     const std::string& by) {
  auto it = active_.find(id);
  if (it == active_.end()) {
    ASSIGN_OR_RETURN(store::ExperimentRecord rec, store_->GetExperiment(id));
    std::string state(tally::v1::ExperimentState_Name(rec.experiment().state()));
    if (state.rfind("EXPERIMENT_STATE_", 0) == 0) state = state.substr(17);
    return absl::FailedPreconditionError(
        absl::StrCat(rec.experiment().name(), " has already ended (", state,
                     "); only a RUNNING experiment can be cancelled"));
  }
  if (it->second.experiment().state() != tally::v1::EXPERIMENT_STATE_RUNNING) {
    return absl::FailedPreconditionError(absl::StrCat(
        it->second.experiment().name(), " has already ended; its variants are stopping"));
  }
  Plan plan = DecideCancel(it->second, JobsOf(it->second), reason, clock_->Now(),
                           CalibrationJobOf(it->second));
  if (!by.empty()) {
    plan.rec.mutable_experiment()->set_cancelled_by(by);
    for (tally::v1::ExperimentEvent& e : plan.events) e.set_principal(by);
  }
  RETURN_IF_ERROR(CommitPlan(plan));
  RETURN_IF_ERROR(Act(id, plan));
  return View(plan.rec);
}

absl::Status ExperimentManager::CommitPlan(Plan& plan) {
  const int64_t id = plan.rec.id();
  if (plan.commit) {
    RETURN_IF_ERROR(store_->CommitExperiment({plan.rec, plan.events}));
    if (listener_) listener_(id);
  }
  // An ended experiment stays until its acts are done (see ReconcileOne).
  if (plan.commit) active_[id] = plan.rec;
  Export(plan.rec.experiment());
  return absl::OkStatus();
}

absl::Status ExperimentManager::Act(int64_t id, const Plan& plan) {
  absl::Status first = absl::OkStatus();
  auto note = [&](absl::Status s) {
    // A job that ended meanwhile needs nothing more.
    if (!s.ok() && !absl::IsFailedPrecondition(s) && first.ok()) first = std::move(s);
  };
  for (const Action& a : plan.actions) {
    const std::string& job_name = a.variant == kCalibration
                                      ? plan.rec.experiment().calibration().job()
                                      : plan.rec.experiment().variants(a.variant).job();
    switch (a.kind) {
      case Action::kSubmit: {
        // The variant's job belongs to the experiment's tenant and creator.
        const Experiment& owner = plan.rec.experiment();
        absl::StatusOr<Job> job = scheduler_->Submit(
            a.spec, a.request_id, sched::Actor{owner.created_by(), owner.tenant()});
        auto it = active_.find(id);
        if (it == active_.end()) break;  // ended meanwhile
        Plan next = job.ok() ? DecideSubmitted(it->second, a.variant, *job, clock_->Now())
                    : Transient(job.status())
                        ? Plan{}
                        : DecideSubmitRefused(it->second, a.variant,
                                              std::string(job.status().message()),
                                              clock_->Now());
        if (!next.commit) {
          // A tenant past its dollar quota: the variant waits for room,
          // quietly (the refusal is retried each pass).
          if (!absl::IsResourceExhausted(job.status())) note(job.status());
          break;
        }
        note(CommitPlan(next));
        break;
      }
      case Action::kSetTarget:
      case Action::kStop:
      case Action::kCancel:
      case Action::kHold:
      case Action::kRelease: {
        absl::StatusOr<int64_t> job_id = ParseJobName(job_name);
        if (!job_id.ok()) break;
        if (a.kind == Action::kSetTarget) {
          note(scheduler_->SetTarget(*job_id, a.target_val_loss, a.reason).status());
        } else if (a.kind == Action::kHold) {
          note(scheduler_->HoldJob(*job_id, plan.rec.experiment().name(), a.reason).status());
        } else if (a.kind == Action::kRelease) {
          note(scheduler_->ReleaseJob(*job_id, a.reason).status());
        } else if (a.kind == Action::kStop) {
          note(scheduler_->StopJob(*job_id, a.state, a.rule, a.reason).status());
        } else {
          note(scheduler_->Cancel(*job_id, a.reason, plan.rec.experiment().cancelled_by())
                   .status());
        }
        break;
      }
    }
  }
  return first;
}

absl::Status ExperimentManager::ReconcileOne(int64_t id) {
  auto it = active_.find(id);
  if (it == active_.end()) return absl::OkStatus();
  Plan plan = Decide(it->second, JobsOf(it->second), clock_->Now(), CalibrationJobOf(it->second));
  RETURN_IF_ERROR(CommitPlan(plan));
  if (plan.rec.experiment().state() != tally::v1::EXPERIMENT_STATE_RUNNING &&
      plan.actions.empty()) {
    active_.erase(id);  // ended, and none of its jobs is left running
    return absl::OkStatus();
  }
  return Act(id, plan);
}

absl::Status ExperimentManager::Reconcile() {
  absl::Status first = absl::OkStatus();
  std::vector<int64_t> ids;
  for (const auto& [id, rec] : active_) ids.push_back(id);
  for (int64_t id : ids) {
    absl::Status s = ReconcileOne(id);
    if (!s.ok() && first.ok()) first = std::move(s);
  }
  return first;
}

void ExperimentManager::Export(const Experiment& e) {
  const metrics::Labels exp{{"experiment", e.name()}};
  cost_->Add(exp).Set(e.cost_usd());
  if (e.target_val_loss() > 0) target_->Add(exp).Set(e.target_val_loss());
  // One series per variant: with replicates, its first run's loss and
  // whether it reached the target, its runs' dollars together, and the mean
  // cost to the target over its runs (VariantSummary).
  std::map<std::string, double> spent;
  for (const auto& v : e.variants()) spent[v.name()] += v.cost_usd();
  for (const auto& v : e.variants()) {
    if (v.job().empty() || v.replicate() > 1) continue;
    const metrics::Labels l{{"experiment", e.name()}, {"variant", v.name()}};
    variant_cost_->Add(l).Set(spent[v.name()]);
    if (v.val_loss() > 0) variant_val_loss_->Add(l).Set(v.val_loss());
    if (v.has_quantized_val_loss()) {
      variant_quantized_val_loss_->Add(l).Set(v.quantized_val_loss());
    }
    variant_reached_->Add(l).Set(v.reached_target() ? 1 : 0);
    if (v.reached_target()) variant_cost_to_target_->Add(l).Set(v.cost_to_target_usd());
    if (v.recipe_cost_to_target_usd() > 0) {
      variant_recipe_cost_to_target_->Add(l).Set(v.recipe_cost_to_target_usd());
    }
  }
  for (const auto& s : e.summaries()) {
    if (s.replicates() < 2) continue;
    const metrics::Labels l{{"experiment", e.name()}, {"variant", s.name()}};
    if (s.cost_to_target_usd() > 0) variant_cost_to_target_->Add(l).Set(s.cost_to_target_usd());
    if (s.recipe_cost_to_target_usd() > 0) {
      variant_recipe_cost_to_target_->Add(l).Set(s.recipe_cost_to_target_usd());
    }
  }
}

}  // namespace tally::experiments
