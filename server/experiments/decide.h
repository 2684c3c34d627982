// The experiment manager's decisions (pure): given an experiment as stored
// and its variants' jobs as they are now, what changes in the experiment
// (its record and events) and what the manager then asks of the scheduler
// (submit a variant, set a target, stop a job, cancel one).
//
// Decide, commit, act: the manager commits the new record and its events
// first and only then acts. Every action is idempotent and derived again from
// the stored record and the jobs on the next pass, so an act lost to a crash
// between the commit and it is made on the next pass after restart: a submit
// reuses a request_id derived from the experiment and variant (the store
// returns the job the first submit made), a target already in force or a
// job already ended asks for nothing.
//
// Rules:
// - Variants are submitted together, the reference (target.from_variant)
//   first so that it starts first when slots are short.
// - target.val_loss: every variant stops at it (a target stop).
//   target.from_variant: that variant runs without a target; once it has
//   ended, its last evaluation's loss is the target of every other variant
//   still running or queued (a variant that already ended is judged on its
//   curve). A reference that ended without an evaluation leaves the
//   experiment without a target, which every variant's note says.
// - Figures come from each variant's evaluation curve (policy/target.h): the
//   first evaluation at or below the target, dollars/tokens/GPU-seconds to
//   it interpolated between the two evaluations that straddle it. The ratio
//   to the reference needs both to have reached it.
// - budget.max_dollars: when all variants together have spent it, the
//   experiment ends BUDGET_EXHAUSTED and its running variants are stopped
//   (BUDGET_EXHAUSTED, rule "experiment_budget"); variants not yet submitted
//   never are.
// - successive_halving: with n variants there are ceil(log2 n) rungs. A
//   variant reaches rung k's mark when it has spent rung_dollars x 2^k (or,
//   with no rung_dollars and no budget, trained max_steps / 2^(rungs - k)
//   steps). The rung is judged once every variant still in the race has
//   reached it, queued ones included, so that fewer workers than variants
//   still rank them all: a variant at the mark while another waits for a
//   slot is held there (preempted with a checkpoint, and kept out of
//   placement: Scheduler::HoldJob), which gives its slot to the next. Then
//   the worse half, ranked by their forecast final loss (the latest loss
//   when a variant has no forecast yet; the event says which figure each
//   was ranked by), stop EARLY_STOPPED with rule "experiment_halving", and
//   the rest are released. The reference (target.from_variant, else the
//   first variant) is never halved or held, whatever the target: every
//   ratio is to it. Variants that ended on their own are not ranked.
// - The experiment SUCCEEDS once every variant has a job and every job has
//   ended, whatever each job's outcome: a failed variant does not fail it.
// - replicates N > 1: each variant is N runs (Experiment.variants holds one
//   VariantStatus per run, replicate 1..N, training.seed + r - 1), each an
//   ordinary job. A run's ratio is to the reference's run of the same
//   replicate; Experiment.summaries gives each variant's means and 90%
//   intervals (policy/replicates.h) and its verdict, and the experiment's
//   verdict names a variant cheaper only when its ratio's interval is below
//   1. A from_variant target is the highest final loss among the
//   reference's runs, once they have all ended (each of them reached it). Halving ranks a variant by its runs' mean and
//   stops or keeps its runs together.
// - Timing (calibration.h): the calibration job is submitted after the
//   variants; the experiment SUCCEEDS only once it has ended too (a
//   calibration that failed leaves each variant priced at its own step
//   times, which the verdict says); it is stopped with the variants when the
//   budget is spent, cancelled with them, and its dollars are the
//   experiment's.
#ifndef TALLY_SERVER_EXPERIMENTS_DECIDE_H_
#define TALLY_SERVER_EXPERIMENTS_DECIDE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/experiments/figures.h"
#include "tally/store/records.pb.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::experiments {

// Action::variant of an act on the timing calibration's job.
inline constexpr int kCalibration = -1;

struct Action {
  enum Kind { kSubmit, kSetTarget, kStop, kCancel, kHold, kRelease };
  Kind kind = kSubmit;
  int variant = 0;                 // index into the experiment's variants, or kCalibration
  tally::v1::JobSpec spec;         // kSubmit: the spec, labels included
  std::string request_id;          // kSubmit
  double target_val_loss = 0;      // kSetTarget
  tally::v1::JobState state = tally::v1::JOB_STATE_UNSPECIFIED;  // kStop
  std::string rule;                // kStop
  std::string reason;              // kSetTarget, kStop, kCancel, kHold, kRelease
};

struct Plan {
  store::ExperimentRecord rec;     // the record after the change
  std::vector<tally::v1::ExperimentEvent> events;  // sequences assigned
  std::vector<Action> actions;     // once committed
  bool commit = false;             // the record changed in a way worth storing
};

// The request_id a variant's job is submitted with (replicate r > 1 of it:
// with "/replicates/r" after it).
std::string VariantRequestId(const std::string& experiment_name,
                             const std::string& variant, int replicate = 1);

// The request_id of the experiment's timing calibration job.
std::string CalibrationRequestId(const std::string& experiment_name);

// One pass over a RUNNING experiment (and, for an ended one, the acts its
// end still asks for: cancels or stops of jobs that have not ended).
// `calibration` is the timing calibration's job (calibration.h), nullopt
// before it has one.
Plan Decide(const store::ExperimentRecord& rec,
            const std::vector<std::optional<tally::v1::Job>>& jobs, absl::Time now,
            const std::optional<tally::v1::Job>& calibration = std::nullopt);

// Cancelling: the experiment ends CANCELLED, every variant job (and the
// calibration) still queued or running is cancelled, variants not submitted
// never are.
Plan DecideCancel(const store::ExperimentRecord& rec,
                  const std::vector<std::optional<tally::v1::Job>>& jobs,
                  const std::string& reason, absl::Time now,
                  const std::optional<tally::v1::Job>& calibration = std::nullopt);

// After a kSubmit: the variant (or kCalibration) has its job.
Plan DecideSubmitted(const store::ExperimentRecord& rec, int variant,
                     const tally::v1::Job& job, absl::Time now);
// After a kSubmit tallyd refused for good (not a passing store error): the
// variant ends FAILED without a job, with the refusal as its reason (the
// calibration: the variants keep their own step times).
Plan DecideSubmitRefused(const store::ExperimentRecord& rec, int variant,
                         const std::string& error, absl::Time now);

}  // namespace tally::experiments

#endif  // TALLY_SERVER_EXPERIMENTS_DECIDE_H_
