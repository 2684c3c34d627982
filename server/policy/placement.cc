#include "server/policy/placement.h"

#include <algorithm>
#include <map>

namespace tally::policy {

std::vector<Placement> PlaceJobs(std::vector<QueuedJob> jobs,
                                 std::vector<WorkerSlots> workers) {
  std::sort(jobs.begin(), jobs.end(), [](const QueuedJob& a, const QueuedJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.create_time != b.create_time) return a.create_time < b.create_time;
    return a.id < b.id;
  });
  // Free slots by GPU type, in a stable worker order.
  std::map<std::string, std::vector<WorkerSlots*>> by_type;
  std::map<std::string, int> free_by_type;
  std::sort(workers.begin(), workers.end(),
            [](const WorkerSlots& a, const WorkerSlots& b) {
              return a.worker_id < b.worker_id;
            });
  for (auto& w : workers) {
    if (w.free_slots <= 0) continue;
    by_type[w.gpu_type].push_back(&w);
    free_by_type[w.gpu_type] += w.free_slots;
  }

  std::vector<Placement> out;
  for (const QueuedJob& job : jobs) {
    const int need = std::max(1, job.gpu_count);
    auto it = by_type.find(job.gpu_type);
    if (it == by_type.end() || free_by_type[job.gpu_type] < need) continue;
    std::vector<WorkerSlots*>& pool = it->second;

    Placement p{job.id, {}};
    WorkerSlots* best = nullptr;
    for (WorkerSlots* w : pool) {
      if (w->free_slots >= need &&
          (best == nullptr || w->free_slots < best->free_slots)) {
        best = w;
      }
    }
    if (best != nullptr) {
      p.rank_workers.assign(need, best->worker_id);
      best->free_slots -= need;
    } else {
      std::vector<WorkerSlots*> order(pool.begin(), pool.end());
      std::stable_sort(order.begin(), order.end(),
                       [](const WorkerSlots* a, const WorkerSlots* b) {
                         return a->free_slots > b->free_slots;
                       });
      int left = need;
      for (WorkerSlots* w : order) {
        while (left > 0 && w->free_slots > 0) {
          p.rank_workers.push_back(w->worker_id);
          --w->free_slots;
          --left;
        }
      }
    }
    free_by_type[job.gpu_type] -= need;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace tally::policy
