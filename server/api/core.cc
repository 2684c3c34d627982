#include "server/api/core.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/text.h"

namespace tally::api {

Core::Core(store::JobStore* store, const Clock* clock,
           metrics::Registry* registry, sched::SchedulerOptions options)
    : store_(store),
      group_commit_(options.group_commit),
      watch_hub_(store),
      scheduler_(store, this, clock, registry, options),
      manager_(store, &scheduler_, clock, registry) {
  scheduler_.AddObserver(&watch_hub_);
  manager_.SetCommitListener([this](int64_t) {
    absl::MutexLock lock(&experiment_mu_);
    ++experiment_version_;
  });
}

absl::Status Core::Init() {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = scheduler_.Recover(); !s.ok()) return s;
  return manager_.Recover();
}

absl::StatusOr<tally::v1::Job> Core::Submit(const tally::v1::JobSpec& spec,
                                            const std::string& request_id,
                                            const sched::Actor& by) {
  if (!group_commit_) {
    absl::MutexLock lock(&mu_);
    return scheduler_.Submit(spec, request_id, by);
  }
  absl::StatusOr<sched::Scheduler::PreparedSubmit> prepared;
  {
    absl::MutexLock lock(&mu_);
    prepared = scheduler_.PrepareSubmit(spec, request_id, by);
  }
  if (!prepared.ok()) return prepared.status();
  // Outside the lock: the store batches this with other submits' writes
  // (and the scheduler's own commits) into one transaction.
  ASSIGN_OR_RETURN(store::CreateResult created,
                   store_->CreateJob(prepared->rec, prepared->first));
  absl::MutexLock lock(&mu_);
  return scheduler_.ActOnSubmit(*prepared, created);
}

absl::Status Core::Tick() {
  absl::MutexLock lock(&mu_);
  absl::Status s = scheduler_.Tick();
  absl::Status e = manager_.Reconcile();
  return s.ok() ? e : s;
}

int64_t Core::experiment_version() const {
  absl::MutexLock lock(&experiment_mu_);
  return experiment_version_;
}

bool Core::WaitExperiments(int64_t seen, absl::Duration timeout) const {
  absl::MutexLock lock(&experiment_mu_);
  auto moved = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(experiment_mu_) {
    return experiment_version_ != seen || experiments_closed_;
  };
  experiment_mu_.AwaitWithTimeout(absl::Condition(&moved), timeout);
  return !experiments_closed_;
}

void Core::Shutdown() {
  std::map<std::string, std::shared_ptr<WorkerSession>> sessions;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    sessions.swap(sessions_);
    scheduler_.log_notifier()->Close();  // ends every WatchJobLogs (UNAVAILABLE)
  }
  watch_hub_.Shutdown();
  {
    absl::MutexLock lock(&experiment_mu_);
    experiments_closed_ = true;
  }
  for (auto& [id, s] : sessions) s->Close();
}

absl::StatusOr<int64_t> Core::Hello(const tally::v1::Hello& hello,
                                    std::shared_ptr<WorkerSession> session,
                                    const WorkerIdentity& identity) {
  std::shared_ptr<WorkerSession> replaced;
  absl::StatusOr<int64_t> generation;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("tallyd is shutting down");
    RETURN_IF_ERROR(sched::Scheduler::ValidateHello(hello));
    if (sessions_.count(hello.worker_id()) > 0 && scheduler_.WorkerLive(hello.worker_id())) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker ", EscapeUnprintable(hello.worker_id()),
          " is connected on another stream and heard from recently; a worker id holds one "
          "stream (this one, ", identity.Describe(), ", may reconnect once that stream ends "
          "or falls silent)"));
    }
    // Until OnHello succeeds, what it sends this worker is held back here:
    // the worker's current stream (if any) is not this one's yet.
    hello_worker_ = hello.worker_id();
    generation = scheduler_.OnHello(hello);
    hello_worker_.reset();
    std::vector<tally::v1::ControllerMessage> sent = std::exchange(hello_sent_, {});
    if (!generation.ok()) return generation.status();
    // A worker that reconnects replaces its old, silent stream.
    replaced = std::exchange(sessions_[hello.worker_id()], session);
    for (const auto& m : sent) session->Push(m);
  }
  if (replaced) replaced->Close();
  return generation;
}

void Core::Goodbye(const std::string& worker_id, const WorkerSession* session,
                   int64_t generation) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(worker_id);
  if (it != sessions_.end() && it->second.get() == session) sessions_.erase(it);
  scheduler_.OnDisconnect(worker_id, generation);
}

void Core::Send(const std::string& worker_id,
                const tally::v1::ControllerMessage& message) {
  mu_.AssertHeld();
  if (hello_worker_ && *hello_worker_ == worker_id) {
    hello_sent_.push_back(message);
    return;
  }
  auto it = sessions_.find(worker_id);
  if (it != sessions_.end()) it->second->Push(message);
}

}  // namespace tally::api
