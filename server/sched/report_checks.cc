#include "server/sched/report_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/text.h"
#include "server/sched/log_report_checks.h"
#include "server/sched/plan.h"

namespace tally::sched {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view rule, double got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", rule, ", got ", got));
}

// A loss or gradient norm: >= 0, or NaN/+Inf (divergence).
absl::Status LossLike(absl::string_view field, double v) {
  if (std::isnan(v) || v == std::numeric_limits<double>::infinity()) return absl::OkStatus();
  if (v >= 0 && std::isfinite(v)) return absl::OkStatus();
  return Bad(field, "must be >= 0 (NaN or +Inf when diverging)", v);
}

absl::Status InRange(absl::string_view field, double v, double lo, double hi) {
  if (std::isfinite(v) && v >= lo && v <= hi) return absl::OkStatus();
  return Bad(field, absl::StrCat("must be a finite number in [", lo, ", ", hi, "]"), v);
}

constexpr double kMaxSeconds = 86400;           // one step, one day at most
constexpr double kMinLoss = 1e-6;               // nats a token: no model is this sure
constexpr double kMaxTokensPerSecond = 1e12;    // far past any fleet
constexpr double kMaxMfu = 100;                 // a wrong peak, not a lie
constexpr int64_t kSha256Hex = 64;

absl::Status ProgressFigures(const tally::v1::Progress& p) {
  if (absl::Status s = LossLike("progress.train_loss", p.train_loss()); !s.ok()) return s;
  if (absl::Status s = LossLike("progress.grad_norm", p.grad_norm()); !s.ok()) return s;
  if (absl::Status s = InRange("progress.lr", p.lr(), 0, 1e3); !s.ok()) return s;
  if (absl::Status s = InRange("progress.step_seconds", p.step_seconds(), 0, kMaxSeconds);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = InRange("progress.useful_tokens_per_second",
                               p.useful_tokens_per_second(), 0, kMaxTokensPerSecond);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = InRange("progress.padding_fraction", p.padding_fraction(), 0, 1);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = InRange("progress.mfu", p.mfu(), 0, kMaxMfu); !s.ok()) return s;
  if (absl::Status s = InRange("progress.mfu_executed", p.mfu_executed(), 0, kMaxMfu);
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          InRange("progress.fp8_product_fraction", p.fp8_product_fraction(), 0, 1);
      !s.ok()) {
    return s;
  }
  if (p.fp8_underflows() < 0) {
    return Bad("progress.fp8_underflows", "must not be negative", p.fp8_underflows());
  }
  for (const auto& [group, amax] : p.fp8_amax()) {
    // An overflowed tensor's amax is +Inf; nothing is below 0.
    if (!(amax >= 0)) {
      return Bad(absl::StrCat("progress.fp8_amax[", QuoteForMessage(group), "]"),
                 "must be >= 0", amax);
    }
  }
  for (const auto& l : p.moe()) {
    if (absl::Status s = InRange("progress.moe.max_over_mean_load", l.max_over_mean_load(), 0,
                                 std::max(1, l.tokens_per_expert_size()));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = InRange("progress.moe.router_entropy", l.router_entropy(), 0, 64);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = InRange("progress.moe.dropped_fraction", l.dropped_fraction(), 0, 1);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// Tokens no batch of the job reaches by `step`: (step + 1) optimizer steps
// of twice the larger of global_batch_tokens and one micro-batch per rank.
absl::Status TokensWithin(absl::string_view field, const tally::v1::JobSpec& spec, int64_t step,
                          int64_t tokens) {
  const int64_t rows = std::max<int64_t>(1, spec.training().micro_batch_rows());
  const int64_t ranks = std::max<int64_t>(1, spec.resources().gpu_count());
  const int64_t per_step = std::max<int64_t>(spec.training().global_batch_tokens(),
                                             rows * std::max<int64_t>(1, spec.data().seq_len()) *
                                                 ranks);
  // In double: a hostile step times a batch must not overflow.
  const double most = (static_cast<double>(step) + 1) * 2 * static_cast<double>(per_step);
  if (static_cast<double>(tokens) <= most) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": more than any batch of this job reaches by step ", step, " (at most ",
      static_cast<int64_t>(std::min(most, 9.2e18)), "), got ", tokens));
}

// eval.quantized_val_loss exactly when the spec asks for a quantized
// evaluation (training.eval_quantized; training.qat sets it).
absl::Status QuantizedAsSpecified(const tally::v1::JobSpec& spec,
                                  const tally::v1::EvalResult& e) {
  const std::string& format = spec.training().eval_quantized();
  if (e.has_quantized_val_loss() && format.empty()) {
    return absl::InvalidArgumentError(
        "eval.quantized_val_loss: the job evaluates no quantized model (neither "
        "training.qat nor training.eval_quantized is set); a worker sends it only for such "
        "jobs");
  }
  if (!e.has_quantized_val_loss() && !format.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval.quantized_val_loss: missing; the job's spec asks for a quantized evaluation "
        "(training.eval_quantized ", format, ", layers ", spec.training().eval_quantized_layers(),
        ") at every evaluation: the worker must compute it (upgrade tally-worker)"));
  }
  return absl::OkStatus();
}

absl::Status StepWithin(absl::string_view field, const tally::v1::JobSpec& spec, int64_t step) {
  if (step <= spec.training().max_steps()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": past max_steps (",
                                                 spec.training().max_steps(), "), got ", step));
}

// A calibration's times: only on a calibration's successful exit, one per
// spec it lists, in its order, each a finite positive time of at most a day
// with its percentiles around it.
absl::Status CalibrationWithin(const tally::v1::JobSpec& spec, const tally::v1::AttemptExit& x) {
  if (x.calibration_size() == 0) return absl::OkStatus();
  if (!spec.has_calibration()) {
    return absl::InvalidArgumentError(
        "exit.calibration: the job is not a timing calibration (spec.calibration is not set)");
  }
  if (x.outcome() != tally::v1::ATTEMPT_OUTCOME_SUCCEEDED) {
    return absl::InvalidArgumentError(
        "exit.calibration: only a SUCCEEDED exit carries a calibration's times");
  }
  const tally::v1::TimingCalibrationSpec& cal = spec.calibration();
  if (x.calibration_size() != cal.variants_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("exit.calibration: one time per spec in spec.calibration.variants (",
                     cal.variants_size(), "), got ", x.calibration_size()));
  }
  for (int i = 0; i < x.calibration_size(); ++i) {
    const tally::v1::CalibratedStepTime& t = x.calibration(i);
    const std::string field = absl::StrCat("exit.calibration[", i, "]");
    if (t.name() != cal.variants(i).name()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".name: must be spec.calibration.variants[", i, "].name \"",
          cal.variants(i).name(), "\", got ", QuoteForMessage(t.name(), 80)));
    }
    if (absl::Status s = InRange(field + ".median_seconds", t.median_seconds(), 1e-9, kMaxSeconds);
        !s.ok()) {
      return s;
    }
    if (!(t.p10_seconds() > 0 && t.p10_seconds() <= t.median_seconds() &&
          t.median_seconds() <= t.p90_seconds() && t.p90_seconds() <= kMaxSeconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": must have 0 < p10_seconds <= median_seconds <= p90_seconds <= ", kMaxSeconds,
          ", got ", t.p10_seconds(), ", ", t.median_seconds(), ", ", t.p90_seconds()));
    }
    const int64_t most = int64_t{cal.rounds()} * cal.steps();
    if (t.samples() < 1 || t.samples() > most) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".samples: must be 1 to ", most,
                       " (spec.calibration rounds x steps), got ", t.samples()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckReportFigures(const tally::v1::WorkerMessage& msg) {
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kProgress:
      return ProgressFigures(msg.progress());
    case tally::v1::WorkerMessage::kEval: {
      const tally::v1::EvalResult& e = msg.eval();
      if (absl::Status s = LossLike("eval.val_loss", e.val_loss()); !s.ok()) return s;
      if (absl::Status s = LossLike("eval.doc_val_loss", e.doc_val_loss()); !s.ok()) return s;
      // No model scores text at next to nothing per token: such a value is
      // a broken or lying worker, and would become the job's best.
      if (e.val_loss() < kMinLoss) {
        return Bad("eval.val_loss", absl::StrCat("must be at least ", kMinLoss, " nats a token"),
                   e.val_loss());
      }
      if (e.has_quantized_val_loss()) {
        // The same tokens' loss, quantized: judged like val_loss (NaN or
        // +Inf when diverging, never below kMinLoss).
        if (absl::Status s = LossLike("eval.quantized_val_loss", e.quantized_val_loss());
            !s.ok()) {
          return s;
        }
        if (e.quantized_val_loss() < kMinLoss) {
          return Bad("eval.quantized_val_loss",
                     absl::StrCat("must be at least ", kMinLoss, " nats a token"),
                     e.quantized_val_loss());
        }
      }
      if (e.doc_val_loss() != 0 && e.doc_val_loss() < kMinLoss) {
        return Bad("eval.doc_val_loss",
                   absl::StrCat("must be 0 (not reported) or at least ", kMinLoss, " nats a token"),
                   e.doc_val_loss());
      }
      if (e.docs() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("eval.docs: must be >= 0, got ", e.docs()));
      }
      return LossLike("eval.bits_per_byte", e.bits_per_byte());
    }
    case tally::v1::WorkerMessage::kCheckpoint: {
      const tally::v1::CheckpointRecord& c = msg.checkpoint();
      if (c.path().empty() || c.path().size() > 4096) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint.path: must be 1-4096 bytes, got ", c.path().size()));
      }
      // Empty: a record with nothing to verify a resume against (older
      // workers); anything else is a SHA-256 in hex.
      if (!c.sha256().empty() &&
          (static_cast<int64_t>(c.sha256().size()) != kSha256Hex ||
           !std::all_of(c.sha256().begin(), c.sha256().end(), [](char ch) {
            return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f');
          }))) {
        return absl::InvalidArgumentError(absl::StrCat(
            "checkpoint.sha256: must be 64 lowercase hex digits, got ",
            QuoteForMessage(c.sha256(), 80)));
      }
      return absl::OkStatus();
    }
    case tally::v1::WorkerMessage::kExit: {
      const tally::v1::AttemptExit& x = msg.exit();
      if (x.reason().size() > 64 * 1024) {
        return absl::InvalidArgumentError(absl::StrCat(
            "exit.reason: at most 65536 bytes, got ", x.reason().size()));
      }
      if (x.damaged_checkpoint().size() > 4096) {
        return absl::InvalidArgumentError(absl::StrCat(
            "exit.damaged_checkpoint: at most 4096 bytes, got ", x.damaged_checkpoint().size()));
      }
      return absl::OkStatus();
    }
    case tally::v1::WorkerMessage::kLogs:
      return CheckLogBatch(msg.logs());
    default:
      return absl::OkStatus();
  }
}

absl::Status CheckReportAgainstSpec(const tally::v1::JobSpec& spec,
                                    const tally::v1::WorkerMessage& msg) {
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kProgress: {
      const tally::v1::Progress& p = msg.progress();
      if (absl::Status s = TokensWithin("progress.tokens", spec, p.step(), p.tokens()); !s.ok()) {
        return s;
      }
      if (absl::Status s =
              TokensWithin("progress.padding_tokens", spec, p.step(), p.padding_tokens());
          !s.ok()) {
        return s;
      }
      const int32_t layers = spec.model().num_layers();
      const int32_t experts = spec.model().moe().num_experts();
      if (p.moe_size() > 0 && experts <= 0) {
        return absl::InvalidArgumentError(
            "progress.moe: the job has no MoE layers (spec.model.moe.num_experts is 0)");
      }
      for (const auto& l : p.moe()) {
        if (l.layer() < 0 || l.layer() >= layers) {
          return absl::InvalidArgumentError(
              absl::StrCat("progress.moe.layer: must be in [0, ", layers,
                           ") (spec.model.num_layers), got ", l.layer()));
        }
        if (l.tokens_per_expert_size() > experts) {
          return absl::InvalidArgumentError(absl::StrCat(
              "progress.moe.tokens_per_expert: at most ", experts,
              " experts (spec.model.moe.num_experts), got ", l.tokens_per_expert_size()));
        }
      }
      return absl::OkStatus();
    }
    case tally::v1::WorkerMessage::kEval: {
      const tally::v1::EvalResult& e = msg.eval();
      if (absl::Status s = StepWithin("eval.step", spec, e.step()); !s.ok()) return s;
      if (absl::Status s = QuantizedAsSpecified(spec, e); !s.ok()) return s;
      return TokensWithin("eval.tokens", spec, e.step(), e.tokens());
    }
    case tally::v1::WorkerMessage::kCheckpoint: {
      const tally::v1::CheckpointRecord& c = msg.checkpoint();
      if (absl::Status s = StepWithin("checkpoint.step", spec, c.step()); !s.ok()) return s;
      return TokensWithin("checkpoint.tokens", spec, c.step(), c.tokens());
    }
    case tally::v1::WorkerMessage::kExit: {
      const tally::v1::AttemptExit& x = msg.exit();
      if (absl::Status s = StepWithin("exit.step", spec, x.step()); !s.ok()) return s;
      return CalibrationWithin(spec, x);
    }
    default:
      return absl::OkStatus();
  }
}

absl::Status CheckCheckpointPath(const std::string& job, const std::string& path,
                                 int64_t step, const std::string& root) {
  // The folder workers write a job's checkpoints in, under their checkpoint
  // root: "jobs/7" -> "job-7" (worker/agent/path_confinement.h).
  const std::string folder = absl::StrReplaceAll(job, {{"s/", "-"}});
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint.path ", QuoteForMessage(path, 200), " ", why,
        "; a worker writes a job's checkpoints as CHECKPOINT_ROOT/", folder, "/FILE"));
  };
  if (path.empty() || path.size() > 4096) return refuse("must be 1-4096 bytes");
  if (UnprintableReason(path)) return refuse("is not printable text");
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  for (size_t i = 0; i < parts.size(); ++i) {
    if ((parts[i].empty() && i > 0) || parts[i] == "." || parts[i] == "..") {
      return refuse("must not contain empty, \".\" or \"..\" components");
    }
  }
  if (parts.size() < 2 || parts[parts.size() - 2] != folder) {
    return refuse(absl::StrCat("is not in the job's checkpoint folder \"", folder, "\""));
  }
  if (path[0] != '/') return refuse("must be absolute (workers report resolved paths)");
  for (const char* system : {"/proc/", "/sys/", "/dev/"}) {
    if (absl::StartsWith(path, system)) return refuse(absl::StrCat("must not be under ", system));
  }
  if (!root.empty() &&
      absl::string_view(path).substr(0, path.size() - parts.back().size() - 1) !=
          absl::StrCat(root, "/", folder)) {
    return refuse(absl::StrCat("is not in ", root, "/", folder,
                               " (tallyd's checkpoint_root, where workers write)"));
  }
  // The file is the worker's own name for the step it reports
  // (step-00000010.ckpt), not any file that folder could hold.
  const absl::string_view file = parts.back();
  int64_t named = -1;
  if (!absl::ConsumePrefix(&parts.back(), "step-") || !absl::ConsumeSuffix(&parts.back(), ".ckpt") ||
      parts.back().empty() ||
      !std::all_of(parts.back().begin(), parts.back().end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(parts.back(), &named) || named != step) {
    return refuse(absl::StrCat("is not the checkpoint file of step ", step, " (",
                               absl::StrFormat("step-%08d.ckpt", step), "), got ",
                               QuoteForMessage(file, 80)));
  }
  return absl::OkStatus();
}

std::pair<std::string, int32_t> ReportedAttempt(const tally::v1::WorkerMessage& msg) {
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kProgress:
      return {msg.progress().job(), msg.progress().attempt()};
    case tally::v1::WorkerMessage::kEval:
      return {msg.eval().job(), msg.eval().attempt()};
    case tally::v1::WorkerMessage::kCheckpoint:
      return {msg.checkpoint().job(), msg.checkpoint().attempt()};
    case tally::v1::WorkerMessage::kExit:
      return {msg.exit().job(), msg.exit().attempt()};
    case tally::v1::WorkerMessage::kLogs:
      return {msg.logs().job(), msg.logs().attempt()};
    default:
      return {"", 0};
  }
}

absl::Status CheckReportCounts(const tally::v1::WorkerMessage& msg) {
  auto counts = [](const char* what, int64_t step, int64_t tokens) -> absl::Status {
    if (step < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".step: must not be negative, got ", step));
    }
    if (tokens < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ".tokens: must not be negative, got ", tokens));
    }
    return absl::OkStatus();
  };
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kProgress: {
      const tally::v1::Progress& p = msg.progress();
      if (p.padding_tokens() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "progress.padding_tokens: must not be negative, got ", p.padding_tokens()));
      }
      if (p.fp8_grouped_off().size() > 4096) {
        return absl::InvalidArgumentError(
            absl::StrCat("progress.fp8_grouped_off: at most 4096 bytes, got ",
                         p.fp8_grouped_off().size()));
      }
      if (p.fp8_values() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("progress.fp8_values: must not be negative, got ", p.fp8_values()));
      }
      if (p.fp8_overflows() < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "progress.fp8_overflows: must not be negative, got ", p.fp8_overflows()));
      }
      // Bounds on what becomes metric series: no model has more.
      constexpr int kMaxMoeLayers = 1024, kMaxExperts = 4096, kMaxAmaxGroups = 256;
      if (p.moe_size() > kMaxMoeLayers) {
        return absl::InvalidArgumentError(absl::StrCat("progress.moe: at most ", kMaxMoeLayers,
                                                       " layers, got ", p.moe_size()));
      }
      for (const auto& l : p.moe()) {
        if (l.tokens_per_expert_size() > kMaxExperts) {
          return absl::InvalidArgumentError(absl::StrCat("progress.moe.tokens_per_expert: at most ",
                                                         kMaxExperts, " experts, got ",
                                                         l.tokens_per_expert_size()));
        }
        for (int64_t n : l.tokens_per_expert()) {
          if (n < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "progress.moe.tokens_per_expert: must not be negative, got ", n));
          }
        }
      }
      if (p.fp8_amax_size() > kMaxAmaxGroups) {
        return absl::InvalidArgumentError(absl::StrCat("progress.fp8_amax: at most ",
                                                       kMaxAmaxGroups, " groups, got ",
                                                       p.fp8_amax_size()));
      }
      // Each group becomes a series: only the trainer's own tensor groups.
      for (const auto& [group, amax] : p.fp8_amax()) {
        static const auto* const kGroups = new absl::flat_hash_set<std::string>{
            "attention.input", "attention.weight", "attention.grad",
            "ffn.input",       "ffn.weight",       "ffn.grad"};
        if (!kGroups->contains(group)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "progress.fp8_amax: unknown tensor group ", QuoteForMessage(group),
              " (known: {attention,ffn}.{input,weight,grad})"));
        }
      }
      return counts("progress", p.step(), p.tokens());
    }
    case tally::v1::WorkerMessage::kEval:
      return counts("eval", msg.eval().step(), msg.eval().tokens());
    case tally::v1::WorkerMessage::kCheckpoint:
      return counts("checkpoint", msg.checkpoint().step(), msg.checkpoint().tokens());
    case tally::v1::WorkerMessage::kExit:
      if (!msg.exit().preemption_cause().empty() &&
          !KnownPreemptionCause(msg.exit().preemption_cause())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "exit.preemption_cause: must be sigterm, sigint, notice_file, idle or priority, got ",
            QuoteForMessage(msg.exit().preemption_cause(), 64)));
      }
      return counts("exit", msg.exit().step(), 0);
    case tally::v1::WorkerMessage::kNotice: {
      const tally::v1::Notice& n = msg.notice();
      if (n.cause() != "sigterm" && n.cause() != "sigint" && n.cause() != "notice_file" &&
          n.cause() != "idle") {
        return absl::InvalidArgumentError(
            absl::StrCat("notice.cause: must be sigterm, sigint, notice_file or idle, got ",
                         QuoteForMessage(n.cause(), 64)));
      }
      if (!(n.deadline_seconds() >= 0 && n.deadline_seconds() <= 86400)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "notice.deadline_seconds: must be between 0 and 86400, got ", n.deadline_seconds()));
      }
      return absl::OkStatus();
    }
    default:
      return absl::OkStatus();
  }
}

bool RepeatedEval(const tally::v1::Job& j, const tally::v1::EvalResult& ev) {
  // The curve keeps its latest point; within an attempt steps only go
  // forward, so one of the latest point's attempt at or before its step was
  // taken already. (Another attempt evaluating earlier steps is a resumed
  // one, and is taken.)
  if (j.curve_size() == 0) return false;
  const tally::v1::EvalPoint& last = j.curve(j.curve_size() - 1);
  return last.attempt() != 0 && last.attempt() == ev.attempt() && ev.step() <= last.step();
}

bool RepeatedCheckpoint(const std::optional<tally::v1::Checkpoint>& latest,
                        const tally::v1::CheckpointRecord& c) {
  return latest.has_value() && latest->attempt() == c.attempt() && latest->step() == c.step() &&
         latest->path() == c.path();
}

}  // namespace tally::sched
