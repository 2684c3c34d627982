// Placement: which queued jobs start now, and on which worker slots. Pure:
// values in, decision out.
//
// Order is priority (higher first), then age (older first), then id. A job
// asking for N GPUs gets N slots of its GPU type at once or nothing (gang);
// a job that does not fit is skipped so smaller jobs behind it can start
// (backfill). A job prefers the single worker with the fewest free slots
// that fits it whole; otherwise it spans the workers with the most free
// slots, so fragments stay usable.
//
// Capacity: a worker is "spot" or "on_demand"; a job asks for "spot",
// "on_demand" or "any" (empty means any). A job placed on one kind only uses
// workers of that kind. An "any" job tries spot slots first, then on-demand
// slots, each kind on its own (all ranks of one kind), and spans both kinds
// only when neither alone has room for it.
//
// A job with smaller_counts that does not fit whole tries them in order
// (each as above: all ranks at once) before it is skipped.
//
// Reservations: a job that does not fit now but would fit on the slots its
// GPU type and capacity have in all (free or busy; total_slots) keeps the
// free slots of those workers it needs from every job offered after it
// (lower priority, or equal priority and younger), so a stream of small jobs
// cannot starve a gang: its wait is bounded by the attempts already on the
// other slots it needs. Backfill goes on only on what no waiting job ahead
// could use, and behind a job that no fleet of that type could hold.
#ifndef TALLY_SERVER_POLICY_PLACEMENT_H_
#define TALLY_SERVER_POLICY_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace tally::policy {

struct QueuedJob {
  int64_t id = 0;
  int priority = 0;
  absl::Time create_time;
  std::string gpu_type;
  int gpu_count = 1;
  std::string capacity;  // "spot", "on_demand", "any" or empty (any)
  // World sizes below gpu_count it may start at when gpu_count ranks do not
  // fit now, largest first (a preempted job resuming from its checkpoint);
  // empty: gpu_count ranks or nothing.
  std::vector<int> smaller_counts;
};

// The order jobs are offered to placement: higher priority first, then the
// older, then the lower id.
bool OfferedBefore(const QueuedJob& a, const QueuedJob& b);

struct WorkerSlots {
  std::string worker_id;
  std::string gpu_type;
  int free_slots = 0;
  std::string capacity;  // "spot" or "on_demand"; empty means on_demand
  // All its slots, free or busy; 0 (unknown): free_slots. A waiting job
  // reserves slots only where its type has enough of them in all.
  int total_slots = 0;
};

// Whether a worker of `worker_capacity` may run a job asking for
// `job_capacity` (the empty strings as above). Any other string, on either
// side, matches nothing: spec validation rejects such a job, and a worker
// reporting such a capacity gets no work rather than a guessed kind.
bool CapacityMatches(const std::string& job_capacity, const std::string& worker_capacity);

struct Placement {
  int64_t job_id = 0;
  // One entry per rank; a worker with several slots may appear more than once.
  std::vector<std::string> rank_workers;
};

std::vector<Placement> PlaceJobs(std::vector<QueuedJob> jobs,
                                 std::vector<WorkerSlots> workers);

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_PLACEMENT_H_
