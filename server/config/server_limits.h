// ServerLimits: the limits tallyd puts on its gRPC transport and on each
// principal, from two sections of its --config file:
//
//   grpc_server:                      # read at start; a change needs a restart
//     max_metadata_bytes: 16384       # headers of one call, all together
//     max_frame_bytes: 16384          # HTTP/2 SETTINGS_MAX_FRAME_SIZE
//     max_concurrent_streams: 1000    # per connection
//     max_receive_message_bytes: 4194304
//     max_connection_idle: 15m        # no call open for this long: closed
//     max_connection_age: 0s          # 0: no limit
//     max_connection_age_grace: 5m    # streams' time to end after the age
//     keepalive_time: 5m              # tallyd pings an idle peer this often
//     keepalive_timeout: 20s          # and closes the connection without an answer
//     min_client_ping_interval: 5s    # pings more often count as strikes
//     max_ping_strikes: 2             # more strikes: GOAWAY
//     permit_keepalive_without_calls: true   # workers ping between streams
//     handshake_timeout: 10s          # TCP accept to first HTTP/2 settings (TLS included)
//   limits:                           # per principal; re-read on SIGHUP
//     submits_per_second: 20          # SubmitJob and CreateExperiment; 0: no limit
//     submit_burst: 100
//
// Every key is optional; the defaults are the values above. Durations are
// written as in Go ("500ms", "10s", "15m", "1h"). Parse errors name the key,
// its line and the expected range.
#ifndef TALLY_SERVER_CONFIG_SERVER_LIMITS_H_
#define TALLY_SERVER_CONFIG_SERVER_LIMITS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace YAML {
class Node;
}

namespace tally::config {

// What tallyd sets on its gRPC server (grpc::ServerBuilder channel args).
struct GrpcServerLimits {
  int64_t max_metadata_bytes = 16 * 1024;
  int64_t max_frame_bytes = 16 * 1024;
  int64_t max_concurrent_streams = 1000;
  int64_t max_receive_message_bytes = 4 * 1024 * 1024;
  absl::Duration max_connection_idle = absl::Minutes(15);
  absl::Duration max_connection_age = absl::ZeroDuration();  // no limit
  absl::Duration max_connection_age_grace = absl::Minutes(5);
  absl::Duration keepalive_time = absl::Minutes(5);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  absl::Duration min_client_ping_interval = absl::Seconds(5);
  int64_t max_ping_strikes = 2;
  bool permit_keepalive_without_calls = true;
  absl::Duration handshake_timeout = absl::Seconds(10);

  // InvalidArgument naming the key ("grpc_server.max_frame_bytes") and its
  // range when a value is outside it.
  absl::Status Validate() const;
};

// Per-principal limits (the principal: the authenticated name, or the
// caller's address when calls are not authenticated).
struct PrincipalLimits {
  // A token bucket per principal: `submit_burst` submits at once, refilled
  // at `submits_per_second`. 0 submits_per_second: no limit.
  double submits_per_second = 20;
  int64_t submit_burst = 100;

  absl::Status Validate() const;
};

// Parses the `grpc_server` / `limits` section into `out` (keys not given
// keep their defaults). `line` is the section key's line, for messages.
absl::Status ParseGrpcServerLimits(const YAML::Node& node, int line, GrpcServerLimits* out);
absl::Status ParsePrincipalLimits(const YAML::Node& node, int line, PrincipalLimits* out);

}  // namespace tally::config

#endif  // TALLY_SERVER_CONFIG_SERVER_LIMITS_H_
