// WorkerRegistry: the workers tallyd knows, each with its stream's state
// (connected, generation, last heard from), the slots its attempts hold and
// whether it is going away; and the placement questions asked of them
// (placeable, free slots, idle, can lead a gang). The scheduler owns one and
// changes it only after a commit (Execute) or for what a worker says of
// itself (a Hello, a heartbeat, a notice, a disconnect).
//
// Not thread-safe: the scheduler's lock covers it.
#ifndef TALLY_SERVER_SCHED_WORKER_REGISTRY_H_
#define TALLY_SERVER_SCHED_WORKER_REGISTRY_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "server/policy/placement.h"
#include "server/store/job_store.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

using AttemptKey = std::pair<int64_t, int32_t>;  // (job id, attempt)

struct WorkerView {
  store::WorkerRecord record;
  bool connected = false;
  absl::Time last_seen;
  int used_slots = 0;
  std::string draining;  // the cause of its preemption notice, if it sent one
};

struct WorkerState {
  store::WorkerRecord rec;
  bool connected = false;
  int64_t generation = 0;
  absl::Time last_seen;
  // Ranks held per attempt. A stopped attempt holds its slots until the
  // worker reports its exit or goes silent.
  std::map<AttemptKey, int> held;
  // Exits it reported whose commit failed, retried until they commit.
  std::vector<tally::v1::AttemptExit> unconfirmed_exits;
  // Its departure is counted for its current session: in
  // tally_workers_lost_total (silent) or tally_worker_exits_total (left
  // cleanly after a notice).
  bool counted_lost = false;
  // The cause of the preemption notice it sent (it is going away): nothing
  // new is placed on it. Cleared by its next Hello.
  std::string draining;
  // Slots its attempts hold.
  int Used() const;
};

class WorkerRegistry {
 public:
  using Map = std::map<std::string, WorkerState>;

  // A worker not heard from for longer than `heartbeat_timeout` is neither
  // live nor placeable.
  explicit WorkerRegistry(absl::Duration heartbeat_timeout)
      : heartbeat_timeout_(heartbeat_timeout) {}

  // Null when unknown.
  WorkerState* Find(const std::string& id);
  const WorkerState* Find(const std::string& id) const;
  // The worker, known from now on if it was not (its record names it).
  WorkerState& Add(const std::string& id);
  // Forgets a worker (silent, and nothing of it left to settle).
  void Forget(const std::string& id) { workers_.erase(id); }
  const Map& all() const { return workers_; }
  // Worker ids, in order: for passes that may forget some as they go.
  std::vector<std::string> Ids() const;

  // Slots. Hold sets the ranks `id` holds of an attempt (adding the worker
  // if needed); AddRank adds one; Release frees all of them; ReleaseOne one
  // rank (an exit); Held says how many are held.
  void Hold(const std::string& id, AttemptKey key, int ranks);
  void AddRank(const std::string& id, AttemptKey key);
  void Release(const std::string& id, AttemptKey key);
  void ReleaseOne(const std::string& id, AttemptKey key);
  int Held(const std::string& id, AttemptKey key) const;

  // Connected on a stream (messages reach it).
  bool Connected(const std::string& id) const;
  // Connected and heard from within the heartbeat timeout.
  bool Live(const std::string& id, absl::Time now) const;
  // Work may be placed on it: live, and not going away.
  bool Placeable(const WorkerState& w, absl::Time now) const;
  // The free slots of each placeable worker.
  std::vector<policy::WorkerSlots> FreeSlots(absl::Time now) const;
  // Placeable workers running nothing, by GPU type (every known type
  // listed, at 0 when none is idle).
  std::map<std::string, int64_t> Idle(absl::Time now) const;
  // It announced a rendezvous host and port: it can lead a gang (rank 0).
  bool CanLead(const std::string& id) const;
  std::vector<WorkerView> Views() const;

  // A session's generation: each Hello gets a new one, greater than every
  // earlier one, so a stale stream's disconnect (an older generation) is
  // told apart from the current one's.
  int64_t NewGeneration() { return next_generation_++; }

 private:
  const absl::Duration heartbeat_timeout_;
  Map workers_;
  int64_t next_generation_ = 1;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_WORKER_REGISTRY_H_
