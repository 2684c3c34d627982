// CommitObserver: what the scheduler tells the rest of tallyd after a state
// change has committed. Watchers (server/api) and per-job metrics
// (server/metrics/job_metrics) are observers of commits, not pollers: they
// learn of a change only once the store holds it, and a failed commit tells
// them nothing.
//
// Thread-safety: the scheduler calls observers on its own (serialised) thread
// with its lock held; an observer must not block and must not call back into
// the scheduler. Waking another thread is the expected use.
#ifndef TALLY_SERVER_SCHED_OBSERVER_H_
#define TALLY_SERVER_SCHED_OBSERVER_H_

#include <cstdint>

#include "server/store/job_store.h"
#include "tally/v1/jobs.pb.h"

namespace tally::sched {

class CommitObserver {
 public:
  virtual ~CommitObserver() = default;

  // A job's change committed: `job` is the stored record after it (with its
  // last_event_sequence), `mutation` what the transaction wrote (its events
  // in order; empty events for a change that appended none). Called for job
  // creation too, with the first event.
  virtual void OnJobCommitted(const store::JobRecord& job,
                              const store::Mutation& mutation) = 0;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_OBSERVER_H_
