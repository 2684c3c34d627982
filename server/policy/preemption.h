// Preemption: which running attempts tallyd stops so that a waiting,
// higher-priority job can start. Pure: values in, decision out, time passed
// as an argument.
//
// A waiting job that placement could not start may preempt running attempts
// of its GPU type when, together with the slots free now, the slots they
// hold on workers whose capacity the job accepts are enough for all its
// ranks. Guard rails:
//   - only attempts of strictly lower priority (never an equal one);
//   - only attempts that have run at least `min_runtime` (an attempt that
//     just started has not paid for its own start yet);
//   - never a job in the waiting job's `preempted_by` (no cycles: a job
//     does not preempt back a job that preempted it);
//   - never an attempt already stopping (a pending stop or preemption);
//   - gangs all or nothing: a victim frees all its slots, and the waiting
//     job is only served when all its ranks fit; else nobody is preempted;
//   - with `only_tenant` set, only attempts of that tenant are considered
//     (others are left out as if not running, so `why` says nothing of
//     them): tallyd sets it to the waiting job's tenant unless its config
//     allows cross-tenant preemption.
// Among the sets of victims that suffice it takes the fewest attempts; among
// those, the lowest priorities; then the most recently checkpointed (the
// least work to redo); then the newest jobs (higher id). Sets of one size are
// compared worst member first: their priorities sorted high to low, compared
// lexicographically (so it spares the most important victim before it
// minimises the rest; not the sum); then their `last_checkpoint`s sorted old
// to new, the later list winning (no checkpoint is the oldest); then their
// job ids sorted, the higher list winning.
//
// A victim frees all its ranks' slots, but only those on workers whose
// capacity the waiting job accepts (CapacityMatches) count toward it: one
// per time the worker appears in its `rank_workers`. The job needs
// max(1, gpu_count) slots: the matching slots of its GPU type free now plus
// the ones freed. Free slots and attempts of other GPU types are ignored.
// Attempts listed with the same job id are one candidate (the job is stopped
// whole): their slots add up, the newest start counts for `min_runtime`, and
// one stopping attempt makes the job no candidate.
//
// With up to 16 candidates (after the guard rails) every set is tried, so the
// choice is exactly the order above. With more, a greedy takes candidates
// with the most usable slots first, ties in the order above, until the job
// fits: still the fewest victims, but among sets of that size not always the
// best by priority.
#ifndef TALLY_SERVER_POLICY_PREEMPTION_H_
#define TALLY_SERVER_POLICY_PREEMPTION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/policy/placement.h"

namespace tally::policy {

struct RunningAttempt {
  int64_t job_id = 0;
  int priority = 0;
  std::string gpu_type;
  std::string tenant;  // the job's tenant
  // One entry per rank (a worker may appear more than once).
  std::vector<std::string> rank_workers;
  absl::Time started;                                 // this attempt's start
  absl::Time last_checkpoint = absl::InfinitePast();  // the job's latest, if any
  bool stopping = false;  // already ordered to stop: not a candidate
};

struct PreemptionOptions {
  absl::Duration min_runtime = absl::Minutes(10);
  // Set: only attempts of this tenant may be preempted.
  std::optional<std::string> only_tenant;
};

struct PreemptionDecision {
  // Empty: preempt nothing (see `why`). Otherwise job ids, ascending.
  std::vector<int64_t> victims;
  // One line: with victims, what they free for the job; without, why none
  // (e.g. "no lower-priority attempt of h200 has run 10m yet"). Exactly
  // "fits without preemption" when the free slots already suffice.
  std::string why;
};

// `waiting` is the job to serve (its capacity as in placement.h);
// `free_slots` the workers' slots free now (after this pass's placements),
// with their capacity and GPU type; `running` every running attempt with its
// workers' capacity known through `worker_capacity` (worker id -> "spot" or
// "on_demand"; a worker not listed is on_demand).
PreemptionDecision ChoosePreemptions(const QueuedJob& waiting,
                                     const std::vector<int64_t>& preempted_by,
                                     const std::vector<WorkerSlots>& free_slots,
                                     const std::vector<RunningAttempt>& running,
                                     const std::vector<std::pair<std::string, std::string>>&
                                         worker_capacity,
                                     absl::Time now, const PreemptionOptions& options);

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_PREEMPTION_H_
