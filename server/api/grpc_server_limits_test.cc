#include "server/api/grpc_server_limits.h"

#include <grpc/grpc.h>

#include <climits>
#include <map>

#include "gtest/gtest.h"

namespace tally::api {
namespace {

std::map<std::string, int> Args(const config::GrpcServerLimits& limits) {
  std::map<std::string, int> out;
  for (const auto& [name, value] : GrpcServerArgs(limits)) out[name] = value;
  return out;
}

TEST(GrpcServerLimitsTest, DefaultsBecomeChannelArgs) {
  const std::map<std::string, int> args = Args(config::GrpcServerLimits());
  const std::map<std::string, int> want = {
      {GRPC_ARG_MAX_METADATA_SIZE, 16384},
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16384},
      {GRPC_ARG_MAX_CONCURRENT_STREAMS, 1000},
      {GRPC_ARG_MAX_CONNECTION_IDLE_MS, 15 * 60 * 1000},
      {GRPC_ARG_MAX_CONNECTION_AGE_MS, INT_MAX},  // 0s: never
      {GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS, 5 * 60 * 1000},
      {GRPC_ARG_KEEPALIVE_TIME_MS, 5 * 60 * 1000},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20 * 1000},
      {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000},
      {GRPC_ARG_HTTP2_MAX_PING_STRIKES, 2},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
      {GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000},
  };
  EXPECT_EQ(args, want);
}

TEST(GrpcServerLimitsTest, ZeroIdleIsNeverAndLongDurationsSaturate) {
  config::GrpcServerLimits l;
  l.max_connection_idle = absl::ZeroDuration();
  l.max_connection_age = absl::Hours(24 * 24);  // Validate's longest: fits an int
  l.keepalive_time = absl::Hours(1000);         // beyond it: saturates
  l.permit_keepalive_without_calls = false;
  const std::map<std::string, int> args = Args(l);
  EXPECT_EQ(args.at(GRPC_ARG_MAX_CONNECTION_IDLE_MS), INT_MAX);
  EXPECT_EQ(args.at(GRPC_ARG_MAX_CONNECTION_AGE_MS), 24 * 24 * 3600 * 1000);
  EXPECT_EQ(args.at(GRPC_ARG_KEEPALIVE_TIME_MS), INT_MAX);
  EXPECT_EQ(args.at(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS), 0);
}

}  // namespace
}  // namespace tally::api
