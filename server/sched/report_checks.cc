#include "server/sched/report_checks.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/text.h"

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

absl::Status StepWithin(absl::string_view field, const tally::v1::JobSpec& spec, int64_t step) {
  if (step <= spec.training().max_steps()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": past max_steps (",
                                                 spec.training().max_steps(), "), got ", step));
}

}  // namespace

absl::Status CheckReportFigures(const tally::v1::WorkerMessage& msg) {
  switch (msg.msg_case()) {
    case tally::v1::WorkerMessage::kProgress:
      return ProgressFigures(msg.progress());
    case tally::v1::WorkerMessage::kEval: {
      const tally::v1::EvalResult& e = msg.eval();
      if (absl::Status s = LossLike("eval.val_loss", e.val_loss()); !s.ok()) return s;
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
      return TokensWithin("eval.tokens", spec, e.step(), e.tokens());
    }
    case tally::v1::WorkerMessage::kCheckpoint: {
      const tally::v1::CheckpointRecord& c = msg.checkpoint();
      if (absl::Status s = StepWithin("checkpoint.step", spec, c.step()); !s.ok()) return s;
      return TokensWithin("checkpoint.tokens", spec, c.step(), c.tokens());
    }
    case tally::v1::WorkerMessage::kExit:
      return StepWithin("exit.step", spec, msg.exit().step());
    default:
      return absl::OkStatus();
  }
}

absl::Status CheckLabelValue(absl::string_view field, absl::string_view value) {
  const bool ok = !value.empty() && value.size() <= 64 &&
                  std::all_of(value.begin(), value.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
                           c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be 1-64 characters of letters, digits and _ . : -, got ",
      QuoteForMessage(value, 64), " (", value.size(), " bytes)"));
}

}  // namespace tally::sched
