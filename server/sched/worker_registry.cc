#include "server/sched/worker_registry.h"

namespace tally::sched {

int WorkerState::Used() const {
  int n = 0;
  for (const auto& [key, ranks] : held) n += ranks;
  return n;
}

WorkerState* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

const WorkerState* WorkerRegistry::Find(const std::string& id) const {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerState& WorkerRegistry::Add(const std::string& id) {
  WorkerState& w = workers_[id];
  w.rec.set_worker_id(id);
  return w;
}

std::vector<std::string> WorkerRegistry::Ids() const {
  std::vector<std::string> ids;
  ids.reserve(workers_.size());
  for (const auto& [id, w] : workers_) ids.push_back(id);
  return ids;
}

void WorkerRegistry::Hold(const std::string& id, AttemptKey key, int ranks) {
  Add(id).held[key] = ranks;
}

void WorkerRegistry::AddRank(const std::string& id, AttemptKey key) { ++Add(id).held[key]; }

void WorkerRegistry::Release(const std::string& id, AttemptKey key) {
  if (WorkerState* w = Find(id)) w->held.erase(key);
}

void WorkerRegistry::ReleaseOne(const std::string& id, AttemptKey key) {
  WorkerState* w = Find(id);
  if (w == nullptr) return;
  auto h = w->held.find(key);
  if (h != w->held.end() && --h->second <= 0) w->held.erase(h);
}

int WorkerRegistry::Held(const std::string& id, AttemptKey key) const {
  const WorkerState* w = Find(id);
  if (w == nullptr) return 0;
  auto h = w->held.find(key);
  return h == w->held.end() ? 0 : h->second;
}

bool WorkerRegistry::Connected(const std::string& id) const {
  const WorkerState* w = Find(id);
  return w != nullptr && w->connected;
}

bool WorkerRegistry::Live(const std::string& id, absl::Time now) const {
  const WorkerState* w = Find(id);
  return w != nullptr && w->connected && now - w->last_seen < heartbeat_timeout_;
}

bool WorkerRegistry::Placeable(const WorkerState& w, absl::Time now) const {
  return w.connected && now - w.last_seen <= heartbeat_timeout_ && w.draining.empty();
}

std::vector<policy::WorkerSlots> WorkerRegistry::FreeSlots(absl::Time now) const {
  std::vector<policy::WorkerSlots> free;
  for (const auto& [id, w] : workers_) {
    if (!Placeable(w, now)) continue;
    free.push_back(
        {id, w.rec.gpu_type(), w.rec.slots() - w.Used(), w.rec.capacity(), w.rec.slots()});
  }
  return free;
}

std::map<std::string, int64_t> WorkerRegistry::Idle(absl::Time now) const {
  std::map<std::string, int64_t> idle;
  for (const auto& [id, w] : workers_) {
    if (w.rec.gpu_type().empty()) continue;
    int64_t& n = idle[w.rec.gpu_type()];
    if (Placeable(w, now) && w.Used() == 0) ++n;
  }
  return idle;
}

bool WorkerRegistry::CanLead(const std::string& id) const {
  const WorkerState* w = Find(id);
  return w != nullptr && w->rec.rendezvous_port() > 0 && !w->rec.rendezvous_host().empty();
}

std::vector<WorkerView> WorkerRegistry::Views() const {
  std::vector<WorkerView> out;
  out.reserve(workers_.size());
  for (const auto& [id, w] : workers_) {
    out.push_back({w.rec, w.connected, w.last_seen, w.Used(), w.draining});
  }
  return out;
}

}  // namespace tally::sched
