// Clock is the only source of time for code with policies in it. Only
// RealClock calls absl::Now(); tests use FakeClock and Advance() it.
//
// MonotonicClock is the same seam for code that measures intervals (a lease
// that must be renewed within a timeout), where wall time could jump. Only
// RealMonotonicClock reads std::chrono::steady_clock; tests use
// FakeMonotonicClock and Advance() it.
#ifndef TALLY_COMMON_CLOCK_H_
#define TALLY_COMMON_CLOCK_H_

#include <chrono>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tally {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

class RealClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

// Thread-safe.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000))
      : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

// Time on a clock that never goes back: Elapsed() is the time since the
// clock's own fixed, arbitrary origin (for the real one, usually the boot).
// Only differences between two readings of the same clock mean anything;
// never compare them with another clock's or turn them into wall time.
class MonotonicClock {
 public:
  virtual ~MonotonicClock() = default;
  // Never less than an earlier call's result. Thread-safe.
  virtual absl::Duration Elapsed() const = 0;
};

// std::chrono::steady_clock. Stateless and thread-safe.
class RealMonotonicClock final : public MonotonicClock {
 public:
  // A process-wide instance, the default where a MonotonicClock is optional.
  static const MonotonicClock* Get() {
    static const RealMonotonicClock clock;
    return &clock;
  }
  absl::Duration Elapsed() const override {
    return absl::FromChrono(std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()));
  }
};

// Stands still until Advance()d. Thread-safe.
class FakeMonotonicClock final : public MonotonicClock {
 public:
  // The origin is not zero so that code cannot rely on it being zero.
  explicit FakeMonotonicClock(absl::Duration start = absl::Hours(1000)) : elapsed_(start) {}
  absl::Duration Elapsed() const override {
    absl::MutexLock lock(&mu_);
    return elapsed_;
  }
  // A negative `d` does nothing: a monotonic clock does not go back.
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    if (d > absl::ZeroDuration()) elapsed_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Duration elapsed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally

#endif  // TALLY_COMMON_CLOCK_H_
