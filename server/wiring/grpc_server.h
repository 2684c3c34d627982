// tallyd's one gRPC server: bound once at start-up, before the store is
// opened, and serving api::Frontend's services until tallyd exits (refusing
// calls UNAVAILABLE while a standby or recovering, see server/api/frontend.h).
#ifndef TALLY_SERVER_WIRING_GRPC_SERVER_H_
#define TALLY_SERVER_WIRING_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "server/api/frontend.h"
#include "server/config/server_limits.h"
#include "server/metrics/registry.h"

namespace tally::wiring {

// Borrowed; must outlive the call (registry and clock: the server).
struct GrpcServerInputs {
  std::string listen;
  std::shared_ptr<grpc::ServerCredentials> credentials;
  const config::GrpcServerLimits& limits;
  bool reflection = true;
  metrics::Registry* registry = nullptr;
  const Clock* clock = nullptr;
};

struct GrpcServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

// Starts the server with `frontend`'s services, health checks (service ""
// NOT_SERVING, api::kLivenessService SERVING), reflection unless
// inputs.reflection is false, and per-method metrics. UNAVAILABLE naming
// --listen when the address cannot be bound.
absl::StatusOr<GrpcServer> StartGrpcServer(const GrpcServerInputs& inputs, api::Frontend* frontend);

}  // namespace tally::wiring

#endif  // TALLY_SERVER_WIRING_GRPC_SERVER_H_
