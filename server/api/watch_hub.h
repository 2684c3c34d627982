// WatchHub: the per-job fan-out behind Jobs.WatchJob. It observes the
// scheduler's commits (sched::CommitObserver) and hands each committed event
// to the watches of that job only, so an idle watch costs no work and a live
// one sends the events it was given without reading the store. The store is
// read only to catch up: from after_sequence when a watch starts, and after a
// watch fell more than kMaxBufferedEvents behind (its buffer is dropped and it
// re-reads the store from the last event it sent).
//
// JobWatch is one watch's state machine, independent of the transport: a
// subclass sends one event at a time (StartSend, answered by OnSent) and ends
// the stream (End). Its guarantees: events leave in sequence order with no
// gap and no repeat; a job that is (or becomes) terminal ends the watch with
// OK after its last event; Shutdown() ends it with UNAVAILABLE naming the
// after_sequence to resume from.
//
// Thread-safety: every method is thread-safe. OnJobCommitted runs with the
// scheduler's lock held: it takes the hub's lock and each watch's lock, never
// blocks and never reads the store. StartSend and End are called with neither
// the hub's nor the watch's lock held, but from OnJobCommitted they run with
// the scheduler's (core's) lock held: a transport must not complete them
// inline into code that takes that lock (gRPC's callback reactors do not:
// their write and finish reactions are never run inline).
#ifndef TALLY_SERVER_API_WATCH_HUB_H_
#define TALLY_SERVER_API_WATCH_HUB_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/sched/observer.h"
#include "server/store/job_store.h"
#include "tally/v1/jobs.pb.h"

namespace tally::api {

class WatchHub;

class JobWatch : public std::enable_shared_from_this<JobWatch> {
 public:
  // A watch that falls further behind than this re-reads the store.
  static constexpr int kMaxBufferedEvents = 1024;
  // Events read from the store at once while catching up.
  static constexpr int kCatchUpPage = 256;

  JobWatch(WatchHub* hub, int64_t job_id, int64_t after_sequence);
  virtual ~JobWatch() = default;
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  // Registers with the hub, reads the job and catches up from the store; may
  // send or end before returning. The watch must be owned by a shared_ptr.
  // Blocks on the store: call it where a blocking read is acceptable.
  void Start();
  // The event given to StartSend left (ok) or the stream broke (!ok).
  void OnSent(bool ok);
  // The client went away: ends the watch with CANCELLED.
  void Cancel();
  // The caller's credential was revoked or expired (Gate): ends the watch
  // with `why` (not OK) once no send is outstanding; nothing more is sent.
  void Revoke(absl::Status why);

  // From the hub: events committed for this job (in order) and its state.
  void Deliver(const std::shared_ptr<const std::vector<tally::v1::JobEvent>>& events,
               const store::JobRecord& job);
  // From the hub: tallyd is stopping.
  void Shutdown();

  int64_t job_id() const { return job_id_; }

 protected:
  // Send `event` (valid until OnSent). At most one send is outstanding.
  virtual void StartSend(const tally::v1::JobEvent* event) = 0;
  // End the stream; called once, with no send outstanding.
  virtual void End(absl::Status status) = 0;

 private:
  // Starts the next send, read or end, unless one is already in progress.
  // Store reads only happen when `may_read` (never under the scheduler lock).
  void Pump(bool may_read);

  WatchHub* const hub_;
  const int64_t job_id_;
  absl::Mutex mu_;
  int64_t sent_ ABSL_GUARDED_BY(mu_);        // last sequence handed to StartSend
  int64_t delivered_ ABSL_GUARDED_BY(mu_);   // last sequence the client got
  int64_t terminal_sequence_ ABSL_GUARDED_BY(mu_) = -1;  // job's last, once terminal
  bool catching_up_ ABSL_GUARDED_BY(mu_) = true;
  // The buffer missed events (it overflowed or was never armed): clear it
  // before the next store read.
  bool buffer_stale_ ABSL_GUARDED_BY(mu_) = false;
  bool sending_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);
  // Read from the store, not yet sent.
  std::deque<tally::v1::JobEvent> page_ ABSL_GUARDED_BY(mu_);
  // Delivered by commits, not yet sent.
  std::deque<std::shared_ptr<const tally::v1::JobEvent>> buffer_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const tally::v1::JobEvent> current_;  // owned by the send
};

class WatchHub final : public sched::CommitObserver {
 public:
  // `store` must outlive the hub.
  explicit WatchHub(store::JobStore* store) : store_(store) {}

  store::JobStore* store() const { return store_; }

  // sched::CommitObserver: wakes the watches of `job` only.
  void OnJobCommitted(const store::JobRecord& job,
                      const store::Mutation& mutation) override;

  // Ends every watch (UNAVAILABLE) and refuses new ones.
  void Shutdown();

  int64_t num_watches() const;

 private:
  friend class JobWatch;
  // False once shutting down.
  bool Register(const std::shared_ptr<JobWatch>& watch);
  void Unregister(const JobWatch* watch);

  store::JobStore* const store_;
  mutable absl::Mutex mu_;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t num_watches_ ABSL_GUARDED_BY(mu_) = 0;
  std::unordered_map<int64_t,
                     std::unordered_map<const JobWatch*, std::shared_ptr<JobWatch>>>
      watches_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_WATCH_HUB_H_
