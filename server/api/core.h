// Core: the thread-safe shell around the single-threaded Scheduler. Every
// gRPC handler and the tick loop go through it; it serialises calls with one
// mutex, routes the scheduler's messages to the workers' open streams, and
// feeds committed job changes to the WatchHub (which wakes only the watchers
// of the job that changed).
#ifndef TALLY_SERVER_API_CORE_H_
#define TALLY_SERVER_API_CORE_H_

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/api/gate.h"
#include "server/api/watch_hub.h"
#include "server/experiments/manager.h"
#include "server/sched/scheduler.h"
#include "server/store/job_store.h"

namespace tally::api {

// One open Workers.Connect stream, as the core sees it.
//
// Thread-safety: implementations are thread-safe. Push is called with the
// core's lock held, so it must not block and must not call into the core.
class WorkerSession {
 public:
  virtual ~WorkerSession() = default;
  // Queues `m` after the messages pushed before it. Ignored once closed.
  virtual void Push(const tally::v1::ControllerMessage& m) = 0;
  // Ends the stream (its reader sees the stream end and says goodbye).
  virtual void Close() = 0;
};

class Core final : public sched::WorkerChannel {
 public:
  // `store` must outlive the core. Call Init() before serving.
  Core(store::JobStore* store, const Clock* clock, metrics::Registry* registry,
       sched::SchedulerOptions options);

  absl::Status Init();  // recovers jobs, then experiments, from the store

  // Runs `f(scheduler)` under the lock.
  template <typename F>
  auto Run(F&& f) {
    absl::MutexLock lock(&mu_);
    return f(scheduler_);
  }
  // Runs `f(experiment manager)` under the same lock.
  template <typename F>
  auto RunExperiments(F&& f) {
    absl::MutexLock lock(&mu_);
    return f(manager_);
  }

  // Jobs.Submit. With options.group_commit (the default), decide, commit,
  // act: the scheduler decides under the lock (Scheduler::PrepareSubmit),
  // the store's CreateJob runs without it, so that concurrent submits share
  // the store's batched commits, and the job joins the scheduler under the
  // lock again (ActOnSubmit). The caller hears of the job only after its
  // commit; a failed commit changes nothing in memory or metrics. Without
  // group_commit, Scheduler::Submit runs whole under the lock.
  absl::StatusOr<tally::v1::Job> Submit(const tally::v1::JobSpec& spec,
                                        const std::string& request_id,
                                        const sched::Actor& by);

  // One pass of the scheduler, then of the experiments; the first error.
  absl::Status Tick();

  // Experiment watchers: a counter of experiment commits. WaitExperiments
  // returns once it has moved past `seen`, after `timeout`, or at shutdown
  // (false then).
  int64_t experiment_version() const;
  bool WaitExperiments(int64_t seen, absl::Duration timeout) const;

  store::JobStore* store() const { return store_; }
  WatchHub* watch_hub() { return &watch_hub_; }

  // Ends every watch (UNAVAILABLE) and closes every worker stream.
  void Shutdown();

  // A worker stream's Hello, from a stream whose credential is `identity`
  // (already checked to name the Hello's worker_id). Scheduler::OnHello
  // validates it; only when it succeeds does `session` become the worker's
  // stream and receive what the scheduler sent during OnHello, Welcome
  // first. A rejected Hello touches no other stream. A worker id has one
  // stream: while its stream is live (heard from within the heartbeat
  // timeout) a second is refused with ALREADY_EXISTS and the live one keeps
  // running; a silent one is replaced (a reconnect after a half-dead
  // connection). Returns the session's generation for Goodbye.
  absl::StatusOr<int64_t> Hello(const tally::v1::Hello& hello,
                                std::shared_ptr<WorkerSession> session,
                                const WorkerIdentity& identity = {});
  // The stream of a successful Hello ended.
  void Goodbye(const std::string& worker_id, const WorkerSession* session,
               int64_t generation);

  // sched::WorkerChannel; called with the lock held.
  void Send(const std::string& worker_id,
            const tally::v1::ControllerMessage& message) override;

 private:
  store::JobStore* const store_;
  const bool group_commit_;
  WatchHub watch_hub_;
  mutable absl::Mutex mu_;
  sched::Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  experiments::ExperimentManager manager_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex experiment_mu_;
  int64_t experiment_version_ ABSL_GUARDED_BY(experiment_mu_) = 0;
  bool experiments_closed_ ABSL_GUARDED_BY(experiment_mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::shared_ptr<WorkerSession>> sessions_ ABSL_GUARDED_BY(mu_);
  // While OnHello runs: its worker, and what the scheduler sent it.
  std::optional<std::string> hello_worker_ ABSL_GUARDED_BY(mu_);
  std::vector<tally::v1::ControllerMessage> hello_sent_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_CORE_H_
