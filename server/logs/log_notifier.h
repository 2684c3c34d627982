// LogNotifier: how WatchJobLogs streams learn that log lines were stored. A
// counter moves after every append has committed; a watcher reads the
// counter, then the store, and waits for the counter to move past what it
// read. Thread-safe.
#ifndef TALLY_SERVER_LOGS_LOG_NOTIFIER_H_
#define TALLY_SERVER_LOGS_LOG_NOTIFIER_H_

#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tally::logs {

class LogNotifier {
 public:
  // Lines were committed.
  void Notify();
  int64_t version() const;
  // Returns once the counter has moved past `seen` or after `timeout`
  // (true), or once Close() was called (false).
  bool Wait(int64_t seen, absl::Duration timeout) const;
  // Shutdown: every wait returns false from now on.
  void Close();

 private:
  mutable absl::Mutex mu_;
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tally::logs

#endif  // TALLY_SERVER_LOGS_LOG_NOTIFIER_H_
