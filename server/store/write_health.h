// WriteHealth: whether a store's writes are being refused (a full disk, an
// I/O error, a database that cannot commit), for tallyd's /readyz. The
// store records the outcome of each write it commits (or fails to); the
// latest outcome wins, so one write that succeeds clears a failure.
//
// A store that nothing writes to for a while would stay failing; tallyd
// calls JobStore::ProbeWrite while it is failing to find out when writes
// succeed again.
//
// Thread-safe.
#ifndef TALLY_SERVER_STORE_WRITE_HEALTH_H_
#define TALLY_SERVER_STORE_WRITE_HEALTH_H_

#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tally::store {

class WriteHealth {
 public:
  // Whether `s` says the store itself refused the write (as opposed to the
  // caller's mistake): RESOURCE_EXHAUSTED (no space, an I/O error),
  // INTERNAL, DATA_LOSS and UNAVAILABLE.
  static bool IsStoreFailure(const absl::Status& s);

  // The outcome of one write: OK clears a failure; a store failure sets it;
  // other codes (a caller's conflict, a missing row) change nothing.
  void Record(const absl::Status& s);

  // The reason writes fail ("the last write failed: ..."), or nullopt while
  // they succeed.
  std::optional<std::string> Failing() const;

 private:
  mutable absl::Mutex mu_;
  std::optional<std::string> failing_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::store

#endif  // TALLY_SERVER_STORE_WRITE_HEALTH_H_
