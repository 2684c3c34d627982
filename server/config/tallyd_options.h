// TallydOptions: tallyd's command-line flags as plain values (server/main.cc
// fills it from the flags), and Validate(), which refuses a bad value or a
// bad combination before anything is read or served. The files the flags name
// (TLS, tokens, JWKs, --config, the DSN file) are read while tallyd starts,
// after Validate(); their errors are not checked here.
//
// The YAML file of --config is TallydConfig (tallyd_config.h).
#ifndef TALLY_SERVER_CONFIG_TALLYD_OPTIONS_H_
#define TALLY_SERVER_CONFIG_TALLYD_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace tally::config {

struct TallydOptions {
  // Addresses and files.
  std::string listen = "127.0.0.1:50051";
  std::string metrics_listen = "127.0.0.1:9464";
  std::string data_dir = "tally-data";
  std::string config;
  std::string address_file;
  std::vector<std::string> data_roots;

  // The store; postgres_* and lease_timeout, advertise_address only with
  // store == "postgres". postgres_dsn_env is $TALLY_POSTGRES_DSN.
  std::string store = "sqlite";
  std::string postgres_dsn;
  std::string postgres_dsn_file;
  std::string postgres_dsn_env;
  absl::Duration lease_timeout = absl::Seconds(10);
  std::string advertise_address;

  // The scheduler.
  absl::Duration heartbeat_interval = absl::Seconds(2);
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  absl::Duration tick_interval = absl::Milliseconds(200);
  bool priority_preemption = true;
  absl::Duration min_runtime_before_preemption = absl::Minutes(10);
  bool group_commit = true;
  absl::Duration drain_timeout = absl::Seconds(5);

  // Stream limits; 0: no limit. A reserved count of -1 is a tenth of its
  // total (ReservedWatchStreams()).
  int64_t max_watch_streams_per_principal = 1000;
  int64_t max_watch_streams = 20000;
  int64_t max_experiment_watch_streams_per_principal = 64;
  int64_t max_experiment_watch_streams = 512;
  int64_t watch_streams_reserved = -1;
  int64_t experiment_watch_streams_reserved = -1;
  int64_t max_worker_streams_per_principal = 64;
  int64_t max_worker_streams = 4096;

  // Per-job metrics.
  absl::Duration job_metrics_retention = absl::Minutes(15);
  std::vector<std::string> job_info_labels;
  int32_t moe_expert_series_max = 256;

  // Transport and credentials.
  std::string tls_cert;
  std::string tls_key;
  std::string client_ca;
  bool insecure = false;
  std::string auth_tokens;
  std::string worker_tokens;
  std::string jwt_jwks;
  std::string jwt_issuer;
  std::string jwt_audience;
  std::string jwt_principal_claim = "sub";
  std::string jwt_tenant_claim = "tenant";
  std::string jwt_role_claim = "role";
  absl::Duration jwt_max_lifetime = absl::Hours(24);
  bool reflection = true;
  std::string metrics_tls_cert;
  std::string metrics_tls_key;

  // InvalidArgument naming the flag and what would fix it: a malformed
  // host:port, a heartbeat timeout not above its interval, a negative or
  // infinite preemption delay, bad per-job metrics options, a negative
  // stream limit or a reserve not below its total, an unknown store, a DSN
  // or lease flag that does not fit the store, flags that go in pairs or
  // threes given alone, and a non-loopback --listen served in plaintext or
  // without authenticated users and workers (unless --insecure). Checks the
  // flags in the order tallyd always has; the first problem is the error.
  absl::Status Validate() const;

  // The watch streams kept for callers that hold none yet (the reserved
  // flag, or a tenth of its total for -1).
  int64_t ReservedWatchStreams() const;
  int64_t ReservedExperimentWatchStreams() const;
};

// InvalidArgument unless `value` is host:port with a port in [0, 65535],
// naming `flag`.
absl::Status CheckHostPort(const std::string& flag, const std::string& value);

// The host part of "host:port" (everything before the last ':').
std::string HostOf(const std::string& hostport);

}  // namespace tally::config

#endif  // TALLY_SERVER_CONFIG_TALLYD_OPTIONS_H_
