#include "server/api/grpc_server_limits.h"

#include <grpcpp/grpcpp.h>

#include <climits>

namespace tally::api {
namespace {

// Milliseconds as gRPC takes them; 0 (no limit) is INT_MAX, gRPC's "never".
int Millis(absl::Duration d, bool zero_is_never) {
  if (zero_is_never && d == absl::ZeroDuration()) return INT_MAX;
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

}  // namespace

std::vector<std::pair<std::string, int>> GrpcServerArgs(const config::GrpcServerLimits& l) {
  return {
      {GRPC_ARG_MAX_METADATA_SIZE, static_cast<int>(l.max_metadata_bytes)},
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, static_cast<int>(l.max_frame_bytes)},
      {GRPC_ARG_MAX_CONCURRENT_STREAMS, static_cast<int>(l.max_concurrent_streams)},
      {GRPC_ARG_MAX_CONNECTION_IDLE_MS, Millis(l.max_connection_idle, true)},
      {GRPC_ARG_MAX_CONNECTION_AGE_MS, Millis(l.max_connection_age, true)},
      {GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, Millis(l.max_connection_age_grace, false)},
      {GRPC_ARG_KEEPALIVE_TIME_MS, Millis(l.keepalive_time, false)},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(l.keepalive_timeout, false)},
      {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
       Millis(l.min_client_ping_interval, false)},
      {GRPC_ARG_HTTP2_MAX_PING_STRIKES, static_cast<int>(l.max_ping_strikes)},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, l.permit_keepalive_without_calls ? 1 : 0},
      {GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, Millis(l.handshake_timeout, false)},
  };
}

void ApplyGrpcServerLimits(const config::GrpcServerLimits& limits, grpc::ServerBuilder* builder) {
  for (const auto& [name, value] : GrpcServerArgs(limits)) {
    builder->AddChannelArgument(name, value);
  }
  builder->SetMaxReceiveMessageSize(static_cast<int>(limits.max_receive_message_bytes));
}

}  // namespace tally::api
