// Puts tallyd's transport limits (config::GrpcServerLimits, the grpc_server
// section of --config) on a gRPC server before it is built: header size,
// HTTP/2 frame size, streams per connection, message size, connection
// idle time and age, keepalive enforcement and the handshake timeout.
//
// These bound what gRPC 1.51 lets them bound. The HPACK parser of 1.51
// still decodes a header block in full before it can refuse it, at a cost
// that grows faster than the header (README: Transport limits); a
// deployment bounds header size in front of tallyd to close that.
#ifndef TALLY_SERVER_API_GRPC_SERVER_LIMITS_H_
#define TALLY_SERVER_API_GRPC_SERVER_LIMITS_H_

#include <string>
#include <utility>
#include <vector>

#include "server/config/server_limits.h"

namespace grpc {
class ServerBuilder;
}

namespace tally::api {

// The channel arguments `limits` stands for, by name ("grpc.max_metadata_size"),
// in milliseconds or bytes as gRPC takes them.
std::vector<std::pair<std::string, int>> GrpcServerArgs(const config::GrpcServerLimits& limits);

// Sets them on `builder` (and the receive message size).
void ApplyGrpcServerLimits(const config::GrpcServerLimits& limits, grpc::ServerBuilder* builder);

}  // namespace tally::api

#endif  // TALLY_SERVER_API_GRPC_SERVER_LIMITS_H_
