#include "worker/agent/trainer_runner.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "worker/agent/path_confinement.h"
#include "worker/agent/train_spec.h"
#include "worker/data/dataset.h"
#include "worker/train/calibrate.h"
#include "worker/train/trainer.h"

namespace tally::worker {
namespace {

class ReportingEvents final : public train::TrainEvents {
 public:
  ReportingEvents(const tally::v1::Assignment& a, Reporter* reporter)
      : a_(a), reporter_(reporter) {}

  void OnStart(const train::RunInfo& i) override {
    spdlog::info(
        "{} attempt {}: {} parameters ({} active), {:.3g} FLOPs/token, {} attention on {}, {} train / {} "
        "val documents, packing efficiency {:.4f}, model state {:.3g} MB{}{}{}{}{}",
        a_.job(), a_.attempt(), i.num_parameters, i.num_active_parameters, i.flops_per_token,
        i.attention, i.device, i.train_docs, i.val_docs, i.packing_efficiency,
        i.state_bytes / 1e6,
        i.teacher_parameters > 0
            ? absl::StrCat(", distilling from a ", i.teacher_parameters,
                           "-parameter teacher (its forward pass counted in FLOPs/token)")
            : "",
        i.start_step > 0 ? absl::StrCat(", resumed at step ", i.start_step) : "",
        i.world_size > 1 ? absl::StrCat(", rank ", a_.rank(), " of ", i.world_size, " over ",
                                        i.backend, " (", a_.rendezvous(), ")")
                         : "",
        i.num_resident_parameters < i.num_parameters
            ? absl::StrCat(", experts sharded: ", i.num_resident_parameters,
                           " parameters held here")
            : "",
        i.eval_coverage.empty() ? "" : absl::StrCat(", evaluating on ", i.eval_coverage));
  }
  void OnStep(const train::StepMetrics& m) override {
    tally::v1::Progress p;
    p.set_job(a_.job());
    p.set_attempt(a_.attempt());
    p.set_step(m.step);
    p.set_tokens(m.tokens);
    p.set_train_loss(m.train_loss);
    p.set_lr(m.lr);
    p.set_grad_norm(m.grad_norm);
    p.set_step_seconds(m.step_seconds);
    p.set_useful_tokens_per_second(m.useful_tokens_per_second);
    p.set_padding_fraction(m.padding_fraction);
    p.set_mfu(m.mfu);
    p.set_mfu_executed(m.mfu_executed);
    p.set_padding_tokens(m.padding_tokens);
    p.set_trained(true);
    fp8_overflows_ += m.fp8_overflows;
    fp8_underflows_ += m.fp8_underflows;
    fp8_values_ += m.fp8_values;
    for (const auto& l : m.moe) {
      auto* out = p.add_moe();
      out->set_layer(static_cast<int32_t>(l.layer));
      for (int64_t n : l.tokens_per_expert) out->add_tokens_per_expert(n);
      out->set_max_over_mean_load(l.max_over_mean_load);
      out->set_router_entropy(l.router_entropy);
      out->set_dropped_fraction(l.dropped_fraction);
    }
    if (m.fp8_product_fraction > 0) {
      p.set_fp8_overflows(fp8_overflows_);
      p.set_fp8_underflows(fp8_underflows_);
      p.set_fp8_values(fp8_values_);
      p.set_fp8_product_fraction(m.fp8_product_fraction);
      p.set_fp8_grouped_off(m.fp8_grouped_off);
      for (const auto& [group, amax] : m.fp8_amax) (*p.mutable_fp8_amax())[group] = amax;
    }
    reporter_->Progress(p);
  }
  void OnEval(const train::EvalMetrics& e) override {
    spdlog::info("{} attempt {}: step {} val_loss {:.4f} ({:.3f} bits/byte; {:.4f} a document, "
                 "over {} documents)",
                 a_.job(), a_.attempt(), e.step, e.val_loss, e.bits_per_byte, e.doc_val_loss,
                 e.docs);
    if (e.quantized_val_loss) {
      spdlog::info("{} attempt {}: step {} quantized_val_loss {:.4f}", a_.job(), a_.attempt(),
                   e.step, *e.quantized_val_loss);
    }
    tally::v1::EvalResult r;
    r.set_job(a_.job());
    r.set_attempt(a_.attempt());
    r.set_step(e.step);
    r.set_tokens(e.tokens);
    r.set_val_loss(e.val_loss);
    r.set_bits_per_byte(e.bits_per_byte);
    r.set_doc_val_loss(e.doc_val_loss);
    if (e.quantized_val_loss) r.set_quantized_val_loss(*e.quantized_val_loss);
    r.set_docs(e.docs);
    reporter_->Eval(r);
  }
  void OnCheckpoint(const train::CheckpointInfo& c) override {
    tally::v1::CheckpointRecord r;
    r.set_job(a_.job());
    r.set_attempt(a_.attempt());
    r.set_step(c.step);
    r.set_tokens(c.tokens);
    r.set_path(c.path);
    r.set_sha256(c.sha256);
    reporter_->Checkpoint(r);
  }

 private:
  const tally::v1::Assignment& a_;
  Reporter* reporter_;
  int64_t fp8_overflows_ = 0, fp8_underflows_ = 0, fp8_values_ = 0;
};

// The files a config reads, against the data roots: its training data,
// the weights it starts from or distills from, and its validation split
// when it evaluates. `field` prefixes each field's name ("spec.").
absl::Status CheckConfigPaths(const DataRoots& roots, const std::string& field,
                              const train::TrainConfig& c) {
  if (absl::Status s = roots.CheckDataset(field + "data.train_path", c.data.train_path); !s.ok()) {
    return s;
  }
  if (absl::Status s = roots.CheckInitFrom(field, c.init_from_hf, c.init_from_checkpoint);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = roots.CheckWeights(field + "training.distill.teacher",
                                          c.distill.teacher_hf, c.distill.teacher_checkpoint);
      !s.ok()) {
    return s;
  }
  if (c.eval_interval_steps > 0) {  // the trainer opens the validation split
    const bool beside = c.data.val_path.empty();
    return roots.CheckDataset(
        beside ? field + "data.val_path (empty: the split beside train_path)"
               : field + "data.val_path",
        beside ? data::ValidationPrefixFor(c.data.train_path) : c.data.val_path);
  }
  return absl::OkStatus();
}

tally::v1::AttemptOutcome OutcomeOf(train::TrainResult::Outcome o) {
  switch (o) {
    case train::TrainResult::Outcome::kSucceeded:
      return tally::v1::ATTEMPT_OUTCOME_SUCCEEDED;
    case train::TrainResult::Outcome::kStopped:
      return tally::v1::ATTEMPT_OUTCOME_STOPPED;
    case train::TrainResult::Outcome::kPreempted:
      return tally::v1::ATTEMPT_OUTCOME_PREEMPTED;
    case train::TrainResult::Outcome::kFailed:
      break;
  }
  return tally::v1::ATTEMPT_OUTCOME_FAILED;
}

}  // namespace

tally::v1::AttemptExit TrainerRunner::Calibrate(const tally::v1::Assignment& assignment,
                                                Reporter* reporter,
                                                const train::StopFlag* stop) {
  tally::v1::AttemptExit exit;
  exit.set_job(assignment.job());
  exit.set_attempt(assignment.attempt());
  const tally::v1::TimingCalibrationSpec& cal = assignment.spec().calibration();
  // Every spec is checked before anything runs: a spec this worker refuses
  // fails the calibration for good.
  DeviceOptions device;
  device.device = options_.device;
  device.peak_flops = options_.peak_flops;
  std::vector<train::CalibrationConfig> configs;
  for (int i = 0; i < cal.variants_size(); ++i) {
    const std::string field = absl::StrCat("spec.calibration.variants[", i, "].spec.");
    absl::StatusOr<train::TrainConfig> config =
        TrainConfigFromSpec(cal.variants(i).spec(), device);
    // A path refusal names its field with `field` already; the spec's own
    // problems are named within it.
    absl::Status s = config.ok() ? CheckConfigPaths(options_.data_roots, field, *config)
                                 : absl::InvalidArgumentError(absl::StrCat(
                                       field.substr(0, field.size() - 1), ": ",
                                       config.status().message()));
    if (!s.ok()) {
      exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
      exit.set_reason(std::string(s.message()));
      return exit;
    }
    config->eval_interval_steps = 0;
    config->model.moe.test_forced_expert = options_.test_moe_forced_expert;
    configs.push_back({cal.variants(i).name(), *std::move(config)});
  }
  spdlog::info("{} attempt {}: timing calibration of {} specs, {} rounds of {} timed steps each",
               assignment.job(), assignment.attempt(), configs.size(), cal.rounds(), cal.steps());
  const train::CalibrationResult r = train::Calibrate(
      configs, cal.rounds(), cal.steps(), stop, [&](int64_t done, int64_t, double loss) {
        tally::v1::Progress p;
        p.set_job(assignment.job());
        p.set_attempt(assignment.attempt());
        p.set_step(done);
        p.set_train_loss(loss);
        p.set_trained(true);
        reporter->Progress(p);
      });
  exit.set_step(r.steps_done);
  exit.set_reason(r.reason);
  exit.set_retryable(r.retryable);
  exit.set_outcome(OutcomeOf(r.outcome));
  if (r.outcome == train::TrainResult::Outcome::kSucceeded) {
    for (const train::CalibratedTime& t : r.times) {
      spdlog::info("{} attempt {}: {} {:.4g} s a step (10th-90th percentile {:.4g}-{:.4g} s, "
                   "{} steps)",
                   assignment.job(), assignment.attempt(), t.name, t.median_seconds,
                   t.p10_seconds, t.p90_seconds, t.samples);
      tally::v1::CalibratedStepTime* out = exit.add_calibration();
      out->set_name(t.name);
      out->set_median_seconds(t.median_seconds);
      out->set_p10_seconds(t.p10_seconds);
      out->set_p90_seconds(t.p90_seconds);
      out->set_samples(t.samples);
    }
  }
  return exit;
}

tally::v1::AttemptExit TrainerRunner::Run(const tally::v1::Assignment& assignment,
                                          Reporter* reporter,
                                          const train::StopFlag* stop) {
  if (assignment.spec().has_calibration()) return Calibrate(assignment, reporter, stop);
  tally::v1::AttemptExit exit;
  exit.set_job(assignment.job());
  exit.set_attempt(assignment.attempt());
  // A spec or a record that names a path this worker must not touch fails
  // the attempt for good: another attempt would be refused the same way.
  auto refuse = [&](const absl::Status& s) {
    exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
    exit.set_reason(std::string(s.message()));
    exit.set_retryable(false);
    return exit;
  };
  std::error_code ec;
  const std::filesystem::path cwd = std::filesystem::current_path(ec);
  if (ec) {  // this worker's trouble, not the job's: another worker may run it
    exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
    exit.set_reason("tally-worker cannot read its working directory: " + ec.message());
    exit.set_retryable(true);
    return exit;
  }
  absl::StatusOr<std::string> job_dir =
      JobCheckpointDir(options_.checkpoint_dir, assignment.job(), cwd);
  if (!job_dir.ok()) return refuse(job_dir.status());
  DeviceOptions device;
  device.device = options_.device;
  device.checkpoint_dir = *job_dir;
  device.peak_flops = options_.peak_flops;
  device.parallel.rank = assignment.rank();
  device.parallel.world_size = std::max(1, assignment.world_size());
  device.parallel.rendezvous = assignment.rendezvous();
  device.parallel.rendezvous_prefix = assignment.rendezvous_prefix();
  device.parallel.rendezvous_local_host = options_.rendezvous_local_host;
  auto config = TrainConfigFromSpec(assignment.spec(), device);
  if (!config.ok()) return refuse(config.status());
  if (absl::Status s = CheckConfigPaths(options_.data_roots, "spec.", *config); !s.ok()) {
    return refuse(s);
  }
  if (const std::string& resume = assignment.resume_from().path(); !resume.empty()) {
    // Workers write checkpoints as regular files and never as links: a link
    // where the recorded checkpoint was is not that checkpoint, whatever it
    // points to. It is not followed; the checkpoint is damaged and tallyd
    // falls back to an earlier one.
    std::error_code link_ec;
    if (std::filesystem::is_symlink(std::filesystem::symlink_status(resume, link_ec))) {
      exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
      exit.set_reason(absl::StrCat("resume: checkpoint ", resume,
                                   " is damaged: a symlink stands where the recorded checkpoint "
                                   "was written (workers write regular files only); not "
                                   "followed"));
      exit.set_retryable(false);
      exit.set_damaged_checkpoint(resume);
      return exit;
    }
    if (absl::Status s = CheckResumePath(resume, *job_dir, options_.checkpoint_dir, cwd);
        !s.ok()) {
      return refuse(s);
    }
    config->resume_path = resume;
    config->resume_sha256 = assignment.resume_from().sha256();
  }
  // Reported checkpoint paths are resolved and confined to the job's folder
  // directly under the root.
  config->checkpoint_root = options_.checkpoint_dir;
  config->parallel.collective_timeout_seconds = options_.collective_timeout_seconds;
  config->fp8_recipe.test_overflow_fraction = options_.test_fp8_overflow_fraction;
  config->test_fp8_grouped_off = options_.test_fp8_grouped_off;
  config->model.moe.test_forced_expert = options_.test_moe_forced_expert;
  config->test_preempt_checkpoint_delay_seconds = options_.test_preempt_checkpoint_delay_seconds;
  ReportingEvents events(assignment, reporter);
  const train::TrainResult result = train::Train(*config, &events, stop);
  exit.set_step(result.step);
  exit.set_reason(result.reason);
  exit.set_retryable(result.retryable);
  // The trainer names the path it was given: resume_from.path, as tallyd
  // expects it back.
  if (!result.damaged_checkpoint.empty()) {
    exit.set_damaged_checkpoint(assignment.resume_from().path());
  }
  exit.set_outcome(OutcomeOf(result.outcome));
  return exit;
}

}  // namespace tally::worker
