#include "server/config/tallyd_options.h"

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::config {
namespace {

using ::testing::HasSubstr;

struct Case {
  std::string name;
  std::function<void(TallydOptions&)> change;
  std::string error;  // empty: accepted; else the whole message
};

// A non-loopback address with TLS and authenticated users and workers.
void ExposedButSafe(TallydOptions& o) {
  o.listen = "0.0.0.0:50051";
  o.tls_cert = "cert.pem";
  o.tls_key = "key.pem";
  o.auth_tokens = "users.yaml";
  o.worker_tokens = "workers.yaml";
}

TEST(TallydOptionsTest, DefaultsAreValid) { EXPECT_TRUE(TallydOptions().Validate().ok()); }

TEST(TallydOptionsTest, ValidateTable) {
  const Case cases[] = {
      {"listen without port", [](TallydOptions& o) { o.listen = "localhost"; },
       "--listen: expected host:port (e.g. 127.0.0.1:0), got \"localhost\""},
      {"listen port out of range", [](TallydOptions& o) { o.listen = "127.0.0.1:70000"; },
       "--listen: expected host:port (e.g. 127.0.0.1:0), got \"127.0.0.1:70000\""},
      {"metrics_listen without host", [](TallydOptions& o) { o.metrics_listen = ":9464"; },
       "--metrics_listen: expected host:port (e.g. 127.0.0.1:0), got \":9464\""},
      {"heartbeat timeout not above interval",
       [](TallydOptions& o) { o.heartbeat_timeout = absl::Seconds(2); },
       "--heartbeat_timeout (2s) must be longer than --heartbeat_interval (2s)"},
      {"negative preemption delay",
       [](TallydOptions& o) { o.min_runtime_before_preemption = absl::Seconds(-1); },
       "--min_runtime_before_preemption: must be a finite duration >= 0 (e.g. 10m), got -1s"},
      {"infinite preemption delay",
       [](TallydOptions& o) { o.min_runtime_before_preemption = absl::InfiniteDuration(); },
       "--min_runtime_before_preemption: must be a finite duration >= 0 (e.g. 10m), got inf"},
      {"zero preemption delay",
       [](TallydOptions& o) { o.min_runtime_before_preemption = absl::ZeroDuration(); }, ""},
      {"negative job metrics retention",
       [](TallydOptions& o) { o.job_metrics_retention = absl::Seconds(-1); },
       "--job_metrics_retention: must not be negative (0 removes a job's series when it ends), "
       "got -1s"},
      {"job info label listed twice",
       [](TallydOptions& o) { o.job_info_labels = {"team", "team"}; },
       "--job_info_labels: \"team\" is listed twice"},
      {"negative moe series", [](TallydOptions& o) { o.moe_expert_series_max = -1; },
       "--moe_expert_series_max: must not be negative (0 publishes only the per-layer "
       "summary), got -1"},
      {"negative watch streams per principal",
       [](TallydOptions& o) { o.max_watch_streams_per_principal = -1; },
       "--max_watch_streams_per_principal: must be 0 (no limit) or a positive count, got -1"},
      {"negative watch streams", [](TallydOptions& o) { o.max_watch_streams = -2; },
       "--max_watch_streams: must be 0 (no limit) or a positive count, got -2"},
      {"negative experiment watch streams per principal",
       [](TallydOptions& o) { o.max_experiment_watch_streams_per_principal = -1; },
       "--max_experiment_watch_streams_per_principal: must be 0 (no limit) or a positive "
       "count, got -1"},
      {"negative experiment watch streams",
       [](TallydOptions& o) { o.max_experiment_watch_streams = -1; },
       "--max_experiment_watch_streams: must be 0 (no limit) or a positive count, got -1"},
      {"reserve not below total",
       [](TallydOptions& o) {
         o.max_watch_streams = 10;
         o.watch_streams_reserved = 10;
       },
       "--watch_streams_reserved: must be -1 (a tenth), 0 (none kept) or a count below "
       "--max_watch_streams (10), got 10"},
      {"reserve below -1", [](TallydOptions& o) { o.watch_streams_reserved = -2; },
       "--watch_streams_reserved: must be -1 (a tenth), 0 (none kept) or a count below "
       "--max_watch_streams (20000), got -2"},
      {"experiment reserve not below total",
       [](TallydOptions& o) { o.experiment_watch_streams_reserved = 512; },
       "--experiment_watch_streams_reserved: must be -1 (a tenth), 0 (none kept) or a count "
       "below --max_experiment_watch_streams (512), got 512"},
      {"any reserve without a total",
       [](TallydOptions& o) {
         o.max_watch_streams = 0;
         o.watch_streams_reserved = 5;
       },
       ""},
      {"unknown store", [](TallydOptions& o) { o.store = "bogus"; },
       "--store: must be sqlite, memory or postgres, got \"bogus\""},
      {"dsn without postgres", [](TallydOptions& o) { o.postgres_dsn = "host=db"; },
       "--postgres_dsn and --postgres_dsn_file need --store=postgres (got --store=sqlite)"},
      {"dsn file without postgres",
       [](TallydOptions& o) {
         o.store = "memory";
         o.postgres_dsn_file = "/run/dsn";
       },
       "--postgres_dsn and --postgres_dsn_file need --store=postgres (got --store=memory)"},
      {"lease timeout too short",
       [](TallydOptions& o) {
         o.store = "postgres";
         o.lease_timeout = absl::Milliseconds(500);
       },
       "--lease_timeout: must be between 1s and 1h (e.g. 10s), got 500ms"},
      {"lease timeout too long",
       [](TallydOptions& o) {
         o.store = "postgres";
         o.lease_timeout = absl::Hours(2);
       },
       "--lease_timeout: must be between 1s and 1h (e.g. 10s), got 2h"},
      {"lease timeout ignored without postgres",
       [](TallydOptions& o) { o.lease_timeout = absl::Hours(2); }, ""},
      {"bad advertise address",
       [](TallydOptions& o) {
         o.store = "postgres";
         o.advertise_address = "db";
       },
       "--advertise_address: expected host:port (e.g. 127.0.0.1:0), got \"db\""},
      {"tls cert without key", [](TallydOptions& o) { o.tls_cert = "cert.pem"; },
       "--tls_cert and --tls_key go together: give both (PEM files) or neither"},
      {"tls key without cert", [](TallydOptions& o) { o.tls_key = "key.pem"; },
       "--tls_cert and --tls_key go together: give both (PEM files) or neither"},
      {"client ca without tls", [](TallydOptions& o) { o.client_ca = "ca.pem"; },
       "--client_ca needs --tls_cert and --tls_key: client certificates are checked in the "
       "TLS handshake"},
      {"metrics cert without key", [](TallydOptions& o) { o.metrics_tls_cert = "cert.pem"; },
       "--metrics_tls_cert and --metrics_tls_key go together: give both (PEM files) or "
       "neither"},
      {"jwks without issuer and audience", [](TallydOptions& o) { o.jwt_jwks = "keys.json"; },
       "--jwt_jwks, --jwt_issuer and --jwt_audience go together: give all three or none"},
      {"issuer without jwks", [](TallydOptions& o) { o.jwt_issuer = "https://idp"; },
       "--jwt_jwks, --jwt_issuer and --jwt_audience go together: give all three or none"},
      {"jwks without audience",
       [](TallydOptions& o) {
         o.jwt_jwks = "keys.json";
         o.jwt_issuer = "https://idp";
       },
       "--jwt_jwks, --jwt_issuer and --jwt_audience go together: give all three or none"},
      {"plaintext on a non-loopback address",
       [](TallydOptions& o) { o.listen = "0.0.0.0:50051"; },
       "--listen=0.0.0.0:50051 is not a loopback address and it would be served in plaintext: "
       "pass --tls_cert and --tls_key, or --insecure to serve it anyway"},
      {"users not authenticated",
       [](TallydOptions& o) {
         ExposedButSafe(o);
         o.auth_tokens.clear();
       },
       "--listen=0.0.0.0:50051 is not a loopback address and anyone reaching it could submit "
       "and cancel jobs: pass --auth_tokens or --jwt_jwks, or --insecure to serve it anyway"},
      {"workers not authenticated",
       [](TallydOptions& o) {
         ExposedButSafe(o);
         o.worker_tokens.clear();
       },
       "--listen=0.0.0.0:50051 is not a loopback address and any process could connect as a "
       "worker: pass --client_ca or --worker_tokens, or --insecure to serve it anyway"},
      {"exposed with tls and tokens", ExposedButSafe, ""},
      {"workers by client certificate",
       [](TallydOptions& o) {
         ExposedButSafe(o);
         o.worker_tokens.clear();
         o.client_ca = "ca.pem";
       },
       ""},
      {"users and workers by jwt",
       [](TallydOptions& o) {
         ExposedButSafe(o);
         o.auth_tokens.clear();
         o.worker_tokens.clear();
         o.jwt_jwks = "keys.json";
         o.jwt_issuer = "https://idp";
         o.jwt_audience = "tally";
       },
       ""},
      {"insecure", [](TallydOptions& o) {
         o.listen = "10.0.0.1:50051";
         o.insecure = true;
       },
       ""},
      {"localhost is loopback", [](TallydOptions& o) { o.listen = "localhost:50051"; }, ""},
      // The port is what follows the first ':', so an IPv6 literal is refused.
      {"ipv6 literal", [](TallydOptions& o) { o.listen = "[::1]:50051"; },
       "--listen: expected host:port (e.g. 127.0.0.1:0), got \"[::1]:50051\""},
      {"negative worker streams per principal",
       [](TallydOptions& o) { o.max_worker_streams_per_principal = -1; },
       "--max_worker_streams_per_principal and --max_worker_streams: must be 0 (no limit) or a "
       "positive count"},
      {"negative worker streams", [](TallydOptions& o) { o.max_worker_streams = -1; },
       "--max_worker_streams_per_principal and --max_worker_streams: must be 0 (no limit) or a "
       "positive count"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    TallydOptions o;
    c.change(o);
    const absl::Status s = o.Validate();
    if (c.error.empty()) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(s.message(), c.error);
    }
  }
}

TEST(TallydOptionsTest, FirstProblemInFlagOrderWins) {
  TallydOptions o;
  o.store = "bogus";
  o.tls_cert = "cert.pem";
  EXPECT_THAT(o.Validate().message(), HasSubstr("--store"));
}

TEST(TallydOptionsTest, ReservedDefaultsToATenth) {
  TallydOptions o;
  EXPECT_EQ(o.ReservedWatchStreams(), 2000);
  EXPECT_EQ(o.ReservedExperimentWatchStreams(), 51);
  o.watch_streams_reserved = 0;
  EXPECT_EQ(o.ReservedWatchStreams(), 0);
}

}  // namespace
}  // namespace tally::config
