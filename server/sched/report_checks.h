// What a worker may report, checked before a figure reaches a job record, a
// metric series or the cost arithmetic. Pure: a message (and the job's spec)
// in, OK or INVALID_ARGUMENT naming the field out.
//
// A diverging model legitimately reports NaN or +Inf losses and gradient
// norms (the divergence rule stops the job on them), so those pass; a loss
// below 0 (cross-entropy cannot be), -Inf, a fraction outside [0, 1], a time
// or rate that is negative or not finite, token counts no batch of the job
// could reach, MoE layer ids past the job's layers or more experts than it
// has, are refused. A quantized validation loss is held to val_loss's rules.
#ifndef TALLY_SERVER_SCHED_REPORT_CHECKS_H_
#define TALLY_SERVER_SCHED_REPORT_CHECKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/text.h"
#include "tally/v1/jobs.pb.h"
#include "tally/v1/spec.pb.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

// The figures of a progress, eval, checkpoint or exit report that need no
// job to judge (ranges, finiteness, sizes); OK for other messages.
absl::Status CheckReportFigures(const tally::v1::WorkerMessage& msg);

// The figures of a report about a job with `spec` (defaults applied): tokens
// within (step + 1) x twice the tokens of one optimizer step, MoE layer ids
// below num_layers and at most num_experts per layer, steps within
// max_steps; an evaluation carries quantized_val_loss exactly when the spec
// has training.eval_quantized (which training.qat sets).
absl::Status CheckReportAgainstSpec(const tally::v1::JobSpec& spec,
                                    const tally::v1::WorkerMessage& msg);

// INVALID_ARGUMENT naming the field for counts no worker can report
// (negative steps or tokens): they would poison the job's record and its
// cost arithmetic.
absl::Status CheckReportCounts(const tally::v1::WorkerMessage& msg);

// The job and attempt a report is about; an empty job for other messages.
std::pair<std::string, int32_t> ReportedAttempt(const tally::v1::WorkerMessage& msg);

// OK when a reported checkpoint path is the file a worker writes for `step`
// in `job`'s own checkpoint folder ("jobs/7", step 10:
// ROOT/job-7/step-00000010.ckpt) with no ".", ".." or empty components;
// else INVALID_ARGUMENT saying why. tallyd does not see the
// workers' files: workers resolve symlinks and keep every checkpoint they
// write or resume from inside their checkpoint root
// (worker/agent/path_confinement.h); this is tallyd's check of the text.
// The path must be absolute (workers report resolved paths) and not under
// /proc, /sys or /dev; with `root` (tallyd's config checkpoint_root, the
// folder workers are given as --checkpoint_dir, as they resolve it) it must
// be exactly ROOT/job-N/step-SSSSSSSS.ckpt.
absl::Status CheckCheckpointPath(const std::string& job, const std::string& path, int64_t step,
                                 const std::string& root = "");

// Reports a worker sends again after a stream broke before tallyd's Ack
// arrived: an evaluation of the attempt that made the curve's latest point,
// at or before that step; the job's latest recorded checkpoint (same
// attempt, step and path). Each is taken once.
bool RepeatedEval(const tally::v1::Job& job, const tally::v1::EvalResult& eval);
bool RepeatedCheckpoint(const std::optional<tally::v1::Checkpoint>& latest,
                        const tally::v1::CheckpointRecord& checkpoint);

using ::tally::CheckLabelValue;  // common/text.h

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_REPORT_CHECKS_H_
