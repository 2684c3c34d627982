#include "worker/config/worker_options.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/controller_list.h"

namespace tally::worker {
namespace {

absl::Status Refuse(const std::string& message) { return absl::InvalidArgumentError(message); }

bool FiniteNonNegative(absl::Duration d) {
  return d >= absl::ZeroDuration() && d != absl::InfiniteDuration();
}

// The flags of how the worker joins tallyd and leaves it.
absl::Status ValidateFleetFlags(const WorkerOptions& o) {
  if (o.device != "cpu" && o.device.rfind("cuda:", 0) != 0) {
    return Refuse(absl::StrCat("--device: must be cpu or cuda:N, got \"", o.device, "\""));
  }
  if (o.slots < 1 || o.slots > 1024) {
    return Refuse(absl::StrCat("--slots: must be between 1 and 1024, got ", o.slots));
  }
  if (o.capacity != "spot" && o.capacity != "on_demand") {
    return Refuse(absl::StrCat("--capacity: must be spot or on_demand, got \"", o.capacity, "\""));
  }
  if (o.preemption_deadline <= absl::ZeroDuration() ||
      o.preemption_deadline == absl::InfiniteDuration()) {
    return Refuse(absl::StrCat("--preemption_deadline: must be > 0 (and below the pod's "
                               "terminationGracePeriodSeconds), got ",
                               absl::FormatDuration(o.preemption_deadline)));
  }
  absl::Duration idle;
  if (!absl::ParseDuration(o.exit_when_idle, &idle) || !FiniteNonNegative(idle)) {
    return Refuse(absl::StrCat("--exit_when_idle: must be a duration of 0 or more with its unit, "
                               "such as 90s, 5m or 1h (0: never), got \"",
                               o.exit_when_idle.substr(0, 64), "\""));
  }
  return absl::OkStatus();
}

// The flags of how it trains.
absl::Status ValidateTrainingFlags(const WorkerOptions& o) {
  if (o.rendezvous_port < 0 || o.rendezvous_port + o.slots > 65536) {
    return Refuse(absl::StrCat("--rendezvous_port: must be 0 or a port with room for --slots "
                               "ports below 65536, got ",
                               o.rendezvous_port));
  }
  if (o.collective_timeout_seconds <= 0) {
    return Refuse("--collective_timeout: must be > 0 seconds");
  }
  if (!(o.test_fp8_overflow_fraction >= 0 && o.test_fp8_overflow_fraction <= 1)) {
    return Refuse(absl::StrFormat("--testonly_fp8_overflow_fraction: must be between 0 and 1, "
                                  "got %g",
                                  o.test_fp8_overflow_fraction));
  }
  if (o.test_moe_collapse_expert < -1) {
    return Refuse(absl::StrCat("--testonly_moe_collapse_expert: must be -1 (off) or an expert "
                               "index, got ",
                               o.test_moe_collapse_expert));
  }
  if (!FiniteNonNegative(o.test_preempt_checkpoint_delay)) {
    return Refuse(absl::StrCat("--testonly_preempt_checkpoint_delay: must be a finite duration "
                               ">= 0, got ",
                               absl::FormatDuration(o.test_preempt_checkpoint_delay)));
  }
  if (o.threads < 0) return Refuse(absl::StrCat("--threads: must be >= 0, got ", o.threads));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WorkerOptions::Controllers() const {
  absl::StatusOr<std::vector<std::string>> list =
      ParseControllerList(controller, controller_source);
  if (!list.ok()) return list.status();
  return absl::StrJoin(*list, ",");
}

absl::Duration WorkerOptions::ExitWhenIdle() const {
  absl::Duration d = absl::ZeroDuration();
  if (!absl::ParseDuration(exit_when_idle, &d)) return absl::ZeroDuration();
  return d;
}

absl::Status WorkerOptions::Validate() const {
  if (absl::StatusOr<std::string> c = Controllers(); !c.ok()) return c.status();
  if (absl::Status s = ValidateFleetFlags(*this); !s.ok()) return s;
  return ValidateTrainingFlags(*this);
}

}  // namespace tally::worker
