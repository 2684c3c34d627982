#include "server/policy/placement.h"

#include <algorithm>
#include <map>

namespace tally::policy {
namespace {

enum class Kind { kSpot, kOnDemand, kUnknown };

Kind WorkerKind(const std::string& capacity) {
  if (capacity == "spot") return Kind::kSpot;
  if (capacity.empty() || capacity == "on_demand") return Kind::kOnDemand;
  return Kind::kUnknown;
}

// The worker pools a job tries, in order: each entry lists the worker kinds
// one attempt at placing it may draw from together.
std::vector<std::vector<Kind>> PoolsFor(const std::string& job_capacity) {
  if (job_capacity == "spot") return {{Kind::kSpot}};
  if (job_capacity == "on_demand") return {{Kind::kOnDemand}};
  if (job_capacity.empty() || job_capacity == "any") {
    return {{Kind::kSpot}, {Kind::kOnDemand}, {Kind::kSpot, Kind::kOnDemand}};
  }
  return {};
}

// Places `need` ranks on `pool` (workers in id order) if its free slots
// suffice: the single worker with the fewest free slots that fits them all,
// else the workers with the most free slots. Consumes the slots it takes.
bool PlaceOnPool(const std::vector<WorkerSlots*>& pool, int need, Placement* p) {
  int64_t total = 0;
  for (const WorkerSlots* w : pool) total += w->free_slots;
  if (total < need) return false;

  WorkerSlots* best = nullptr;
  for (WorkerSlots* w : pool) {
    if (w->free_slots >= need && (best == nullptr || w->free_slots < best->free_slots)) {
      best = w;
    }
  }
  if (best != nullptr) {
    p->rank_workers.assign(need, best->worker_id);
    best->free_slots -= need;
    return true;
  }
  std::vector<WorkerSlots*> order(pool.begin(), pool.end());
  std::stable_sort(order.begin(), order.end(), [](const WorkerSlots* a, const WorkerSlots* b) {
    return a->free_slots > b->free_slots;
  });
  int left = need;
  for (WorkerSlots* w : order) {
    while (left > 0 && w->free_slots > 0) {
      p->rank_workers.push_back(w->worker_id);
      --w->free_slots;
      --left;
    }
  }
  return true;
}

// For a job that did not fit: the largest of its world sizes that the
// workers it may use could hold with every slot free takes the free slots
// it needs (most free first) from the jobs offered after it.
void Reserve(const QueuedJob& job, const std::vector<int>& counts,
             const std::map<std::pair<std::string, Kind>, int64_t>& total,
             const std::vector<WorkerSlots*>& workers) {
  const std::vector<std::vector<Kind>> pools = PoolsFor(job.capacity);
  if (pools.empty()) return;
  const std::vector<Kind>& kinds = pools.back();  // the widest
  int64_t all = 0;
  for (Kind k : kinds) {
    auto t = total.find({job.gpu_type, k});
    if (t != total.end()) all += t->second;
  }
  int need = 0;
  for (int n : counts) {
    if (n <= all) {
      need = n;
      break;
    }
  }
  if (need == 0) return;  // no fleet of its type holds it: backfill goes on
  std::vector<WorkerSlots*> order;
  for (WorkerSlots* w : workers) {
    if (std::find(kinds.begin(), kinds.end(), WorkerKind(w->capacity)) != kinds.end()) {
      order.push_back(w);
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const WorkerSlots* a, const WorkerSlots* b) {
    return a->free_slots > b->free_slots;
  });
  for (WorkerSlots* w : order) {
    const int take = std::min(need, w->free_slots);
    w->free_slots -= take;
    need -= take;
    if (need == 0) break;
  }
}

}  // namespace

bool CapacityMatches(const std::string& job_capacity, const std::string& worker_capacity) {
  const Kind worker = WorkerKind(worker_capacity);
  if (worker == Kind::kUnknown) return false;
  if (job_capacity.empty() || job_capacity == "any") return true;
  if (job_capacity == "spot") return worker == Kind::kSpot;
  if (job_capacity == "on_demand") return worker == Kind::kOnDemand;
  return false;
}

bool OfferedBefore(const QueuedJob& a, const QueuedJob& b) {
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.create_time != b.create_time) return a.create_time < b.create_time;
  return a.id < b.id;
}

std::vector<Placement> PlaceJobs(std::vector<QueuedJob> jobs, std::vector<WorkerSlots> workers) {
  std::sort(jobs.begin(), jobs.end(), OfferedBefore);
  // Workers with free slots by GPU type, in a stable worker order.
  std::sort(workers.begin(), workers.end(),
            [](const WorkerSlots& a, const WorkerSlots& b) { return a.worker_id < b.worker_id; });
  std::map<std::string, std::vector<WorkerSlots*>> by_type;
  // Every slot, free or busy, by GPU type and worker kind.
  std::map<std::pair<std::string, Kind>, int64_t> total;
  for (auto& w : workers) {
    if (WorkerKind(w.capacity) == Kind::kUnknown) continue;
    total[{w.gpu_type, WorkerKind(w.capacity)}] += std::max(w.total_slots, w.free_slots);
    if (w.free_slots <= 0) continue;
    by_type[w.gpu_type].push_back(&w);
  }

  std::vector<Placement> out;
  for (const QueuedJob& job : jobs) {
    auto it = by_type.find(job.gpu_type);
    if (it == by_type.end()) continue;
    std::vector<int> counts = {std::max(1, job.gpu_count)};
    for (int n : job.smaller_counts) {
      if (n >= 1 && n < counts.front()) counts.push_back(n);
    }
    bool placed = false;
    for (size_t c = 0; c < counts.size() && !placed; ++c) {
      for (const std::vector<Kind>& kinds : PoolsFor(job.capacity)) {
        std::vector<WorkerSlots*> pool;
        for (WorkerSlots* w : it->second) {
          if (w->free_slots > 0 &&
              std::find(kinds.begin(), kinds.end(), WorkerKind(w->capacity)) != kinds.end()) {
            pool.push_back(w);
          }
        }
        Placement p{job.id, {}};
        if (PlaceOnPool(pool, counts[c], &p)) {
          out.push_back(std::move(p));
          placed = true;
          break;
        }
      }
    }
    if (!placed) Reserve(job, counts, total, it->second);
  }
  return out;
}

}  // namespace tally::policy
