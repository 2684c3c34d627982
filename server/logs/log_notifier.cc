#include "server/logs/log_notifier.h"

namespace tally::logs {

void LogNotifier::Notify() {
  absl::MutexLock lock(&mu_);
  ++version_;
}

int64_t LogNotifier::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

bool LogNotifier::Wait(int64_t seen, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto moved = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_ || version_ != seen;
  };
  mu_.AwaitWithTimeout(absl::Condition(&moved), timeout);
  return !closed_;
}

void LogNotifier::Close() {
  absl::MutexLock lock(&mu_);
  closed_ = true;
}

}  // namespace tally::logs
