#include "server/experiments/calibration.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/spec_validation.h"
#include "common/text.h"
#include "server/experiments/figures.h"
#include "server/store/job_store.h"

namespace tally::experiments {

using tally::v1::Experiment;
using tally::v1::Job;
using tally::v1::JobSpec;

namespace {

// A variant's spec as the calibration times it: what trains, nothing that
// judges, stops or bills a run.
JobSpec TimedSpec(JobSpec s) {
  s.clear_display_name();
  s.clear_labels();
  s.clear_early_stopping();
  s.clear_budget();
  s.mutable_training()->set_eval_interval_steps(0);
  s.mutable_training()->set_checkpoint_interval_steps(0);
  return s;
}

}  // namespace

CalibrationPlan PlanCalibration(const tally::v1::ExperimentSpec& spec,
                                const std::vector<JobSpec>& variants,
                                const std::string& display_name) {
  CalibrationPlan out;
  const tally::v1::ExperimentTiming& timing = spec.timing();
  if (timing.has_calibrate() && !timing.calibrate()) return out;
  const int ref = ReferenceIndex(spec);
  if (ref >= static_cast<int>(variants.size())) return out;
  const std::string& gpu_type = variants[ref].resources().gpu_type();
  tally::v1::TimingCalibrationSpec cal;
  cal.set_rounds(timing.rounds() > 0 ? timing.rounds() : kDefaultCalibrationRounds);
  cal.set_steps(timing.steps() > 0 ? timing.steps() : kDefaultCalibrationSteps);
  std::vector<std::string> left_out;
  for (int i = 0; i < static_cast<int>(variants.size()) && i < spec.variants_size(); ++i) {
    const JobSpec& v = variants[i];
    const std::string& name = spec.variants(i).name();
    if (std::max(1, v.resources().gpu_count()) > 1) {
      left_out.push_back(absl::StrCat(name, " (", v.resources().gpu_count(), " GPUs)"));
      continue;
    }
    if (v.resources().gpu_type() != gpu_type) {
      left_out.push_back(absl::StrCat(name, " (GPU type ", v.resources().gpu_type(),
                                      ", the reference's is ", gpu_type, ")"));
      continue;
    }
    tally::v1::CalibrationVariant* cv = cal.add_variants();
    cv->set_name(name);
    *cv->mutable_spec() = TimedSpec(v);
  }
  if (cal.variants_size() < 2) {
    out.note = absl::StrCat(
        "no timing calibration: it needs two variants on one GPU of the reference's type (",
        gpu_type, ")",
        left_out.empty() ? "" : absl::StrCat("; not such: ", absl::StrJoin(left_out, ", ")),
        "; each variant is timed by its own steps");
    return out;
  }
  if (!left_out.empty()) {
    out.note = absl::StrCat("timed by their own steps (one worker cannot run them): ",
                            absl::StrJoin(left_out, ", "));
  }
  // The calibration job itself: the reference's spec on one GPU, training
  // the calibration's steps in all, with nothing that judges or stops it.
  JobSpec job = TimedSpec(variants[ref]);
  job.set_display_name(Utf8Length(display_name) <= 190 ? absl::StrCat(display_name, "/timing")
                                                       : "timing");
  job.mutable_resources()->set_gpu_count(1);
  job.mutable_training()->set_max_steps(CalibrationTotalSteps(cal));
  // The job's own schedule is never trained; it only has to be valid.
  job.mutable_optimizer()->set_warmup_steps(
      std::min(job.optimizer().warmup_steps(), job.training().max_steps()));
  if (job.training().global_batch_tokens() >
      int64_t{job.data().seq_len()} * std::max(1, job.training().micro_batch_rows())) {
    // One micro-batch a step is enough for the outer spec: it does not train.
    job.mutable_training()->clear_global_batch_tokens();
  }
  *job.mutable_calibration() = std::move(cal);
  out.spec = std::move(job);
  return out;
}

void FillCalibration(const std::optional<Job>& job, Experiment* e) {
  if (!job) return;  // as last filled
  tally::v1::TimingCalibrationStatus* c = e->mutable_calibration();
  c->clear_times();
  c->set_job(job->name());
  c->set_state(job->state());
  c->set_state_reason(job->state_reason());
  c->set_cost_usd(job->cost().cost_usd());
  if (job->state() == tally::v1::JOB_STATE_SUCCEEDED) *c->mutable_times() = job->calibration();
}

const tally::v1::CalibratedStepTime* CalibratedTimeOf(const Experiment& e,
                                                      const std::string& variant) {
  for (const auto& t : e.calibration().times()) {
    if (t.name() == variant && t.median_seconds() > 0) return &t;
  }
  return nullptr;
}

std::string TimingSentence(const Experiment& e) {
  const tally::v1::TimingCalibrationStatus& c = e.calibration();
  if (!c.enabled()) {
    if (!c.note().empty()) return c.note();
    const tally::v1::ExperimentTiming& t = e.spec().timing();
    return absl::StrCat("timing not calibrated",
                        t.has_calibrate() && !t.calibrate() ? " (timing.calibrate: false)" : "",
                        ": each variant is priced at its own step times, which depend on what "
                        "ran beside it");
  }
  if (c.state() == tally::v1::JOB_STATE_SUCCEEDED && c.times_size() == 0) {
    return absl::StrCat("timing not calibrated: the calibration ", c.job(),
                        " succeeded without times (a worker older than tallyd?); each variant "
                        "is priced at its own step times");
  }
  if (c.times_size() > 0) {
    std::string s = absl::StrCat("timing calibrated by ", c.job(), " (", c.times_size(),
                                 " variants' steps back to back on one worker, ",
                                 FormatDollars(c.cost_usd()), ")");
    if (!c.note().empty()) absl::StrAppend(&s, "; ", c.note());
    return s;
  }
  std::string state(tally::v1::JobState_Name(c.state()));
  if (state.rfind("JOB_STATE_", 0) == 0) state = state.substr(10);
  return absl::StrCat("timing not calibrated: the calibration ",
                      c.job().empty() ? "never ran" : absl::StrCat(c.job(), " ended ", state),
                      c.state_reason().empty() ? "" : absl::StrCat(" (", c.state_reason(), ")"),
                      "; each variant is priced at its own step times");
}

}  // namespace tally::experiments
