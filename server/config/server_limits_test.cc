#include "server/config/server_limits.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/tallyd_config.h"

namespace tally::config {
namespace {

using ::testing::HasSubstr;

TEST(ServerLimitsTest, DefaultsAreValidAndBounded) {
  auto c = ParseTallydConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->grpc_server.max_metadata_bytes, 16384);
  EXPECT_EQ(c->grpc_server.max_concurrent_streams, 1000);
  EXPECT_EQ(c->grpc_server.handshake_timeout, absl::Seconds(10));
  EXPECT_TRUE(c->grpc_server.permit_keepalive_without_calls);
  EXPECT_DOUBLE_EQ(c->limits.submits_per_second, 20);
  EXPECT_EQ(c->limits.submit_burst, 100);
}

TEST(ServerLimitsTest, ParsesEveryKey) {
  auto c = ParseTallydConfig(R"(
grpc_server:
  max_metadata_bytes: 8192
  max_frame_bytes: 65536
  max_concurrent_streams: 50
  max_receive_message_bytes: 1048576
  max_connection_idle: 1m
  max_connection_age: 2h
  max_connection_age_grace: 30s
  keepalive_time: 1m
  keepalive_timeout: 5s
  min_client_ping_interval: 1s
  max_ping_strikes: 0
  permit_keepalive_without_calls: false
  handshake_timeout: 500ms
limits: {submits_per_second: 0.5, submit_burst: 3}
)");
  ASSERT_TRUE(c.ok()) << c.status();
  const GrpcServerLimits& g = c->grpc_server;
  EXPECT_EQ(g.max_metadata_bytes, 8192);
  EXPECT_EQ(g.max_frame_bytes, 65536);
  EXPECT_EQ(g.max_concurrent_streams, 50);
  EXPECT_EQ(g.max_receive_message_bytes, 1048576);
  EXPECT_EQ(g.max_connection_idle, absl::Minutes(1));
  EXPECT_EQ(g.max_connection_age, absl::Hours(2));
  EXPECT_EQ(g.max_connection_age_grace, absl::Seconds(30));
  EXPECT_EQ(g.keepalive_time, absl::Minutes(1));
  EXPECT_EQ(g.keepalive_timeout, absl::Seconds(5));
  EXPECT_EQ(g.min_client_ping_interval, absl::Seconds(1));
  EXPECT_EQ(g.max_ping_strikes, 0);
  EXPECT_FALSE(g.permit_keepalive_without_calls);
  EXPECT_EQ(g.handshake_timeout, absl::Milliseconds(500));
  EXPECT_DOUBLE_EQ(c->limits.submits_per_second, 0.5);
  EXPECT_EQ(c->limits.submit_burst, 3);
}

TEST(ServerLimitsTest, RefusalsNameTheKeyAndTheRange) {
  const struct {
    const char* yaml;
    const char* message;
  } cases[] = {
      {"grpc_server: {max_metadata_bytes: 100}",
       "grpc_server.max_metadata_bytes: must be between 1024 and 1048576, got 100"},
      {"grpc_server: {max_metadata_bytes: 67108864}", "grpc_server.max_metadata_bytes"},
      {"grpc_server: {max_frame_bytes: 1000}", "grpc_server.max_frame_bytes: must be between 16384"},
      {"grpc_server: {max_frame_bytes: 16777216}", "16777215"},
      {"grpc_server: {max_concurrent_streams: 0}", "grpc_server.max_concurrent_streams"},
      {"grpc_server: {max_metadata_bytes: 1.5}", "max_metadata_bytes (line 1): must be a whole"},
      {"grpc_server: {max_metadata_bytes: lots}", "max_metadata_bytes (line 1): not a number"},
      {"grpc_server: {handshake_timeout: 10}", "handshake_timeout (line 1): must be a duration"},
      {"grpc_server: {handshake_timeout: -1s}", "handshake_timeout (line 1): must be a duration"},
      {"grpc_server: {handshake_timeout: 0s}", "grpc_server.handshake_timeout: must be between"},
      {"grpc_server: {max_connection_idle: 10000h}", "grpc_server.max_connection_idle"},
      {"grpc_server: {permit_keepalive_without_calls: maybe}", "must be true or false"},
      {"grpc_server: {max_header_bytes: 1}", "grpc_server.max_header_bytes (line 1): unknown key"},
      {"grpc_server: [1, 2]", "grpc_server (line 1): expected a mapping"},
      {"grpc_server: {max_frame_bytes: 16384, max_frame_bytes: 16384}", "given twice"},
      {"limits: {submits_per_second: -1}", "limits.submits_per_second: must be between 0"},
      {"limits: {submits_per_second: .nan}", "limits.submits_per_second (line 1): must be a finite"},
      {"limits: {submits_per_second: 5, submit_burst: 0}", "limits.submit_burst: must be between 1"},
      {"limits: {streams: 5}", "limits.streams (line 1): unknown key"},
  };
  for (const auto& c : cases) {
    auto parsed = ParseTallydConfig(c.yaml);
    ASSERT_FALSE(parsed.ok()) << c.yaml;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(c.message)) << c.yaml;
  }
}

TEST(ServerLimitsTest, ZeroMeansNoLimitWhereDocumented) {
  auto c = ParseTallydConfig(
      "grpc_server: {max_connection_idle: 0, max_connection_age: 0s}\n"
      "limits: {submits_per_second: 0, submit_burst: 0}\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->grpc_server.max_connection_idle, absl::ZeroDuration());
  EXPECT_EQ(c->limits.submits_per_second, 0);
}

}  // namespace
}  // namespace tally::config
