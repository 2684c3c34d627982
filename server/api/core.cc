#include "server/api/core.h"

#include <grpcpp/server_context.h>

namespace tally::api {

void WorkerSession::Push(const tally::v1::ControllerMessage& m) {
  absl::MutexLock lock(&mu_);
  if (!closed_) queue_.push_back(m);
}

bool WorkerSession::Pop(tally::v1::ControllerMessage* m) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](WorkerSession* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->closed_ || !s->queue_.empty();
      },
      this));
  if (queue_.empty()) return false;
  *m = std::move(queue_.front());
  queue_.pop_front();
  return true;
}

void WorkerSession::Close() {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    queue_.clear();
  }
  context_->TryCancel();
}

Core::Core(store::JobStore* store, const Clock* clock,
           metrics::Registry* registry, sched::SchedulerOptions options)
    : store_(store), scheduler_(store, this, clock, registry, options) {}

absl::Status Core::Init() {
  absl::MutexLock lock(&mu_);
  return scheduler_.Recover();
}

void Core::AwaitChange(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  changed_.WaitWithTimeout(&mu_, timeout);
}

bool Core::shutting_down() const {
  absl::MutexLock lock(&mu_);
  return shutting_down_;
}

void Core::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    changed_.SignalAll();
  }
  std::map<std::string, std::shared_ptr<WorkerSession>> sessions;
  {
    absl::MutexLock lock(&sessions_mu_);
    sessions.swap(sessions_);
  }
  for (auto& [id, s] : sessions) s->Close();
}

void Core::Attach(const std::string& worker_id,
                  std::shared_ptr<WorkerSession> session) {
  std::shared_ptr<WorkerSession> old;
  {
    absl::MutexLock lock(&sessions_mu_);
    old = std::exchange(sessions_[worker_id], std::move(session));
  }
  // A worker that reconnects replaces its old stream, which may be half dead.
  if (old) old->Close();
}

void Core::Detach(const std::string& worker_id, const WorkerSession* session) {
  absl::MutexLock lock(&sessions_mu_);
  auto it = sessions_.find(worker_id);
  if (it != sessions_.end() && it->second.get() == session) sessions_.erase(it);
}

void Core::Send(const std::string& worker_id,
                const tally::v1::ControllerMessage& message) {
  absl::MutexLock lock(&sessions_mu_);
  auto it = sessions_.find(worker_id);
  if (it != sessions_.end()) it->second->Push(message);
}

}  // namespace tally::api
