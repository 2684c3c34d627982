// The gRPC server a standby tallyd runs until it holds the leader lease.
//
// It binds tallyd's --listen port and serves only:
//   - gRPC health: service "" NOT_SERVING (so a Kubernetes Service or any
//     health-checking load balancer routes to the leader) and "tally.live"
//     SERVING (the process is alive: liveness probes must not restart it);
//   - every other method: UNAVAILABLE "this tallyd is a standby; the leader
//     is HOST:PORT (epoch N)", which clients given several addresses take as
//     the sign to try the next one.
// On winning the lease tallyd shuts it down and binds the same port with the
// real services.
//
// Thread-safety: SetLeader may be called from any thread while RPCs are
// served; Shutdown from one thread.
#ifndef TALLY_SERVER_HA_STANDBY_SERVER_H_
#define TALLY_SERVER_HA_STANDBY_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tally::ha {

// The health service name that answers SERVING on standbys and leaders alike
// (for liveness probes); "" is SERVING on the leader only.
inline constexpr char kLivenessService[] = "tally.live";

class StandbyServer {
 public:
  // Binds `listen` (host:port; port 0 picks one, see port()). UNAVAILABLE
  // when it cannot be bound. `configure`, when set, runs on the builder
  // first (tallyd's transport limits, which a standby needs as much).
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials,
      const std::function<void(grpc::ServerBuilder*)>& configure = nullptr);
  ~StandbyServer();

  int port() const { return port_; }
  // What refused calls say after "the leader is ": "HOST:PORT (epoch N)".
  void SetLeader(const std::string& description);
  std::string UnavailableMessage() const;
  // Stops serving; in-flight calls get `deadline` to finish.
  void Shutdown(absl::Duration deadline = absl::Milliseconds(200));

 private:
  class Generic;
  StandbyServer();

  std::unique_ptr<Generic> generic_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable absl::Mutex mu_;
  // Until the first read of the lease row.
  std::string leader_ ABSL_GUARDED_BY(mu_) =
      "not known yet (this tallyd is still reading the lease)";
};

}  // namespace tally::ha

#endif  // TALLY_SERVER_HA_STANDBY_SERVER_H_
