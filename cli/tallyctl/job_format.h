// Text that tallyctl prints about a job, its events and its estimate: the
// parts with something to get right (preemptions, spot capacity), pure so
// that they are tested without a tallyd. Every string from tallyd is shown
// with its unprintable characters escaped.
#ifndef TALLY_CLI_TALLYCTL_JOB_FORMAT_H_
#define TALLY_CLI_TALLYCTL_JOB_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/spec.pb.h"

namespace tally::cli {

// "2025-01-31 12:00:00" in `tz`; "-" for an unset timestamp.
std::string FormatTimestamp(const google::protobuf::Timestamp& t, absl::TimeZone tz);

// "  resources: 2 x h200, priority 5\n", with ", spot capacity" or
// ", on-demand capacity" when resources.capacity restricts it (nothing for
// "any", the default).
std::string ResourcesLine(const tally::v1::JobSpec& spec);

// Where the model's weights start and what it learns from besides the data:
// "  from:      upcycled from PATH (noise_std X)\n" (or "weights of PATH"
// for model.init_from without upcycle) and "  teacher:   PATH, alpha A,
// temperature T\n" for training.distill; empty when neither is set.
std::string ModelOriginLines(const tally::v1::JobSpec& spec);

// "  progress:  step 10 / 100, attempt 1 of 3\n", with ", at most N
// preemptions" when max_preemptions is set.
std::string ProgressLine(const tally::v1::Job& job);

// The job's losses as `tallyctl get` prints them, once it has an evaluation:
// "  val loss:  latest 2.3100 (q4_0: 2.3800), best 2.3000 at step 40,
// patience left 2 of 3\n" (the quantized loss only when the job has one; the
// best is of the metric its early stopping judges, named when that is
// quantized_val_loss), then its target: "  target:    val loss 2.2000,
// reached at step 60 (...)" or "  target:    quantized_val_loss 2.4000, ...".
std::string LossLines(const tally::v1::Job& job);

// "  spot:      2 of 4 GPUs on spot capacity now, 123.4 spot GPU-seconds in
// all\n"; empty when the job never ran on spot capacity.
std::string SpotUsageLine(const tally::v1::Job& job);

// The job's preemptions: "  preemptions: N (notice M, priority K), redone
// $X.XXXX", the jobs that preempted it, and a preemption ordered and not yet
// confirmed: "  preempting for jobs/N: REASON (deadline T)". Empty for a
// job never preempted with none pending.
std::string PreemptionLines(const tally::v1::Job& job, absl::TimeZone tz);

// `tallyctl cost`'s line for preempted attempts: "  redone after
// preemptions: $X (N preemptions)\n"; empty for a job never preempted.
std::string RedoneLine(const tally::v1::Job& job);

// The estimate: the on-demand line, then, when tallyd knows a spot price for
// the GPU type, the same run on spot capacity (its price, the preemptions
// expected at the observed rate and its source, the dollars they redo) and
// what it saves over on-demand, or costs more. Lines after the first start
// with `indent`; every line ends with a newline.
std::string EstimateText(const tally::v1::CostEstimate& e, absl::string_view indent = "");

// The preemptions of a watched job, counted from its events. `known` and
// `known_through` are the job's preemption count and last event sequence as
// read before watching; `after` is the sequence the watch starts after. From
// the start (after 0) every event is seen and the count is exact at each one;
// otherwise the count starts from `known` and grows with "preempted" events
// past `known_through`.
class PreemptionTally {
 public:
  PreemptionTally(int known, int64_t known_through, int64_t after);
  void Observe(const tally::v1::JobEvent& e);
  int count() const { return base_ + seen_; }

 private:
  int base_ = 0;
  int64_t through_ = 0;
  int seen_ = 0;
};

// One event as `tallyctl watch` prints it off a terminal:
// "#12   2025-01-31 12:00:00 preempted  QUEUED    step 40      $0.0100
// notice_file (redone $0.0020)", with " preemptions N" on progress and
// preempted events once `preemptions` is above 0. An evaluation's quantized
// loss, when it has one, follows its val_loss as "val_loss 2.3100 (q4_0:
// 2.3800)": `quantized_format` is the job's training.eval_quantized
// ("quantized" when empty).
std::string EventLine(const tally::v1::JobEvent& e, absl::TimeZone tz, int preemptions,
                      const std::string& quantized_format = "");

// "val_loss 2.3100", with " (q4_0: 2.3800)" when there is a quantized loss:
// how `tallyctl get` and `watch` show a loss beside its quantized one.
std::string LossWithQuantized(const char* label, double val_loss,
                              const std::optional<double>& quantized,
                              const std::string& quantized_format);

// The progress bar `tallyctl watch` redraws on a terminal (no "\r"):
// "[###...] step 10/100  loss 2.3456  $0.0100  patience 3  preemptions 1".
std::string ProgressBar(const tally::v1::JobEvent& e, int64_t max_steps, int preemptions);

// An experiment's variants as `tallyctl experiment get` and `watch` print
// them: one line each (state, step, losses, steps and tokens to the target,
// the recipe cost with its p10-p90 interval and ratio, the billed dollars
// and ratio, dollars so far, notes), then a line saying what the two dollar
// figures are.
// With replicates, one line per run ("packed#2"), then SummaryTable.
// How the experiment's variants are timed: its calibration's state and
// times, or why there is none.
std::string TimingLine(const tally::v1::Experiment& e);
std::string VariantTable(const tally::v1::Experiment& e);

// Each variant over its replicates: how many reached the target, the mean
// and 90% interval of steps, tokens and recipe dollars to it and of the
// ratio to the reference, and the verdict ("cheaper" only when the ratio's
// interval is below 1).
std::string SummaryTable(const tally::v1::Experiment& e);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_JOB_FORMAT_H_
