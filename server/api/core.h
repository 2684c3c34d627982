// Core: the thread-safe shell around the single-threaded Scheduler. Every
// gRPC handler and the tick loop go through it; it serialises calls with one
// mutex, wakes watchers after each change, and routes the scheduler's
// messages to the workers' open streams.
#ifndef TALLY_SERVER_API_CORE_H_
#define TALLY_SERVER_API_CORE_H_

#include <deque>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/sched/scheduler.h"
#include "server/store/job_store.h"

namespace grpc {
class ServerContext;
}

namespace tally::api {

// One open Workers.Connect stream: an outbound queue its writer drains.
class WorkerSession {
 public:
  explicit WorkerSession(grpc::ServerContext* context) : context_(context) {}
  void Push(const tally::v1::ControllerMessage& m);
  // Blocks until a message is ready or the session is closed (false).
  bool Pop(tally::v1::ControllerMessage* m);
  // Ends the session; its stream is cancelled so its reader returns.
  void Close();

 private:
  grpc::ServerContext* const context_;
  absl::Mutex mu_;
  std::deque<tally::v1::ControllerMessage> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

class Core final : public sched::WorkerChannel {
 public:
  // `store` must outlive the core. Call Init() before serving.
  Core(store::JobStore* store, const Clock* clock, metrics::Registry* registry,
       sched::SchedulerOptions options);

  absl::Status Init();  // recovers state from the store

  // Runs `f(scheduler)` under the lock, then wakes watchers.
  template <typename F>
  auto Run(F&& f) {
    absl::MutexLock lock(&mu_);
    changed_.SignalAll();
    return f(scheduler_);
  }

  store::JobStore* store() const { return store_; }

  // Waits up to `timeout` for any change (or shutdown).
  void AwaitChange(absl::Duration timeout);
  bool shutting_down() const;
  // Wakes every watcher and closes every worker stream.
  void Shutdown();

  // Worker streams.
  void Attach(const std::string& worker_id, std::shared_ptr<WorkerSession> s);
  void Detach(const std::string& worker_id, const WorkerSession* s);

  // sched::WorkerChannel; called with the lock held.
  void Send(const std::string& worker_id,
            const tally::v1::ControllerMessage& message) override;

 private:
  store::JobStore* const store_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;
  sched::Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Mutex sessions_mu_;
  std::map<std::string, std::shared_ptr<WorkerSession>> sessions_
      ABSL_GUARDED_BY(sessions_mu_);
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_CORE_H_
