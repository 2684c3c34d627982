// StreamLimiter: caps the long-lived streams one principal, and everyone
// together, may hold open. A stream takes a Lease when it starts and gives it
// back (by destroying the lease) when it ends.
//
// The principal is a plain string. Until tallyd authenticates its callers it
// is the caller's network address (PeerPrincipal); an authenticating
// interceptor will supply a name instead, and only the function that derives
// the key changes.
//
// Thread-safety: thread-safe.
#ifndef TALLY_SERVER_API_STREAM_LIMITER_H_
#define TALLY_SERVER_API_STREAM_LIMITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace grpc {
class ServerContextBase;
}

namespace tally::api {

// Who a call is from: the key streams are counted by.
using PrincipalFn = std::function<std::string(const grpc::ServerContextBase&)>;

// The caller's IP address, without the port ("127.0.0.1", "::1"); other
// transports (unix sockets) give their whole peer string.
std::string PeerPrincipal(const grpc::ServerContextBase& context);
// The same for a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000").
std::string PrincipalOfPeer(absl::string_view peer);

class StreamLimiter {
 public:
  struct Options {
    std::string what;  // "WatchJob streams"
    int64_t max_per_principal = 0;
    std::string per_principal_flag;  // "max_watch_streams_per_principal"
    int64_t max_total = 0;
    std::string total_flag;  // "max_watch_streams"
    // The last `reserved` places of max_total are kept for principals that
    // hold none of these streams yet, so a few principals at their own limit
    // cannot fill the server and lock everyone else out. 0: none kept.
    int64_t reserved = 0;
    std::string reserved_flag;  // "watch_streams_reserved"
  };

  // Holds one stream's place; movable, gives it back when destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept { *this = std::move(other); }
    Lease& operator=(Lease&& other) noexcept;
    ~Lease() { Release(); }
    void Release();

   private:
    friend class StreamLimiter;
    Lease(StreamLimiter* limiter, std::string principal)
        : limiter_(limiter), principal_(std::move(principal)) {}
    StreamLimiter* limiter_ = nullptr;
    std::string principal_;
  };

  explicit StreamLimiter(Options options) : options_(std::move(options)) {}

  // RESOURCE_EXHAUSTED, naming the limit and the flag that sets it, when the
  // principal or the server is at its limit, or when only reserved places
  // are left and the principal already holds a stream. The limiter must
  // outlive the lease.
  absl::StatusOr<Lease> Acquire(const std::string& principal);

  int64_t num_open() const;
  int64_t num_open(const std::string& principal) const;

 private:
  void Release(const std::string& principal);

  const Options options_;
  mutable absl::Mutex mu_;
  int64_t total_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t, std::less<>> per_principal_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_STREAM_LIMITER_H_
