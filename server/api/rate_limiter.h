// RateLimiter: a token bucket per principal (tallyd's limits.submits_per_second
// and limits.submit_burst). A principal starts with `burst` tokens; each
// call takes one; tokens come back at `per_second`, up to `burst`. A call
// with no token left is refused RESOURCE_EXHAUSTED, naming the limit and
// how long until a token is back.
//
// Pure: time is passed in, nothing is read from a clock. Buckets that have
// refilled are forgotten once more than kMaxTracked principals are held, so
// memory stays bounded whatever the callers call themselves.
//
// Thread-safe; SetLimits may be called while calls are admitted (SIGHUP).
#ifndef TALLY_SERVER_API_RATE_LIMITER_H_
#define TALLY_SERVER_API_RATE_LIMITER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tally::api {

class RateLimiter {
 public:
  struct Options {
    double per_second = 0;  // 0: no limit
    int64_t burst = 1;
    std::string what;       // "submits" (SubmitJob and CreateExperiment)
    std::string rate_key;   // "limits.submits_per_second"
    std::string burst_key;  // "limits.submit_burst"
  };
  static constexpr size_t kMaxTracked = 1 << 16;

  explicit RateLimiter(Options options) : options_(std::move(options)) {}

  // OK and one token taken, or RESOURCE_EXHAUSTED: "PRINCIPAL is over its
  // limit of 20 submits per second (limits.submits_per_second, burst 100
  // limits.submit_burst); retry in 0.05s".
  absl::Status Take(const std::string& principal, absl::Time now);

  // New limits; each principal's tokens are kept (capped at the new burst).
  void SetLimits(double per_second, int64_t burst);

  // How long until `principal` has a token at `now` (0: it has one).
  absl::Duration WaitFor(const std::string& principal, absl::Time now) const;
  size_t num_tracked() const;

 private:
  struct Bucket {
    double tokens = 0;
    absl::Time updated;
  };
  // The bucket's tokens at `now` (refilled, capped at the burst).
  double TokensAt(const Bucket& b, absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Forget(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  Options options_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Bucket, std::less<>> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_RATE_LIMITER_H_
