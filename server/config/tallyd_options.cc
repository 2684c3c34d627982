#include "server/config/tallyd_options.h"

#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "server/metrics/job_metrics.h"

namespace tally::config {
namespace {

absl::Status Refuse(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}

bool IsLoopbackHost(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

int64_t Reserved(int64_t given, int64_t total) { return given == -1 ? total / 10 : given; }

absl::Status CheckScheduling(const TallydOptions& o) {
  if (o.heartbeat_timeout <= o.heartbeat_interval) {
    return Refuse(absl::StrCat("--heartbeat_timeout (", absl::FormatDuration(o.heartbeat_timeout),
                               ") must be longer than --heartbeat_interval (",
                               absl::FormatDuration(o.heartbeat_interval), ")"));
  }
  if (o.min_runtime_before_preemption < absl::ZeroDuration() ||
      o.min_runtime_before_preemption == absl::InfiniteDuration()) {
    return Refuse(absl::StrCat(
        "--min_runtime_before_preemption: must be a finite duration >= 0 (e.g. 10m), got ",
        absl::FormatDuration(o.min_runtime_before_preemption)));
  }
  metrics::JobMetricsOptions job_metrics;
  job_metrics.retention = o.job_metrics_retention;
  job_metrics.info_labels = o.job_info_labels;
  job_metrics.max_expert_series = o.moe_expert_series_max;
  return metrics::ValidateJobMetricsOptions(job_metrics);
}

absl::Status CheckWatchStreams(const TallydOptions& o) {
  for (const auto& [flag, value] :
       {std::pair{"max_watch_streams_per_principal", o.max_watch_streams_per_principal},
        std::pair{"max_watch_streams", o.max_watch_streams},
        std::pair{"max_experiment_watch_streams_per_principal",
                  o.max_experiment_watch_streams_per_principal},
        std::pair{"max_experiment_watch_streams", o.max_experiment_watch_streams}}) {
    if (value < 0) {
      return Refuse(
          absl::StrCat("--", flag, ": must be 0 (no limit) or a positive count, got ", value));
    }
  }
  for (auto [flag, given, total_flag, total] :
       {std::tuple{"watch_streams_reserved", o.watch_streams_reserved, "max_watch_streams",
                   o.max_watch_streams},
        std::tuple{"experiment_watch_streams_reserved", o.experiment_watch_streams_reserved,
                   "max_experiment_watch_streams", o.max_experiment_watch_streams}}) {
    const int64_t reserved = Reserved(given, total);
    if (reserved < 0 || (total > 0 && reserved >= total)) {
      return Refuse(absl::StrCat("--", flag,
                                 ": must be -1 (a tenth), 0 (none kept) or a count below --",
                                 total_flag, " (", total, "), got ", given));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckStore(const TallydOptions& o) {
  if (o.store != "sqlite" && o.store != "memory" && o.store != "postgres") {
    return Refuse(absl::StrCat("--store: must be sqlite, memory or postgres, got \"", o.store,
                               "\""));
  }
  if (o.store != "postgres") {
    if (!o.postgres_dsn.empty() || !o.postgres_dsn_file.empty()) {
      return Refuse(absl::StrCat(
          "--postgres_dsn and --postgres_dsn_file need --store=postgres (got --store=", o.store,
          ")"));
    }
    return absl::OkStatus();
  }
  if (o.lease_timeout < absl::Seconds(1) || o.lease_timeout > absl::Hours(1)) {
    return Refuse(absl::StrCat("--lease_timeout: must be between 1s and 1h (e.g. 10s), got ",
                               absl::FormatDuration(o.lease_timeout)));
  }
  if (!o.advertise_address.empty()) {
    RETURN_IF_ERROR(CheckHostPort("advertise_address", o.advertise_address));
  }
  return absl::OkStatus();
}

absl::Status CheckTransport(const TallydOptions& o) {
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Refuse("--tls_cert and --tls_key go together: give both (PEM files) or neither");
  }
  if (!o.client_ca.empty() && o.tls_cert.empty()) {
    return Refuse(
        "--client_ca needs --tls_cert and --tls_key: client certificates are checked in the "
        "TLS handshake");
  }
  if (o.metrics_tls_cert.empty() != o.metrics_tls_key.empty()) {
    return Refuse(
        "--metrics_tls_cert and --metrics_tls_key go together: give both (PEM files) or "
        "neither");
  }
  if (o.jwt_jwks.empty() != (o.jwt_issuer.empty() && o.jwt_audience.empty()) ||
      (!o.jwt_jwks.empty() && (o.jwt_issuer.empty() || o.jwt_audience.empty()))) {
    return Refuse(
        "--jwt_jwks, --jwt_issuer and --jwt_audience go together: give all three or none");
  }
  return absl::OkStatus();
}

// Why serving on --listen would expose tallyd (plaintext, or callers or
// workers not authenticated) when it is not a loopback address and
// --insecure is not given; empty when it may serve. Users are authenticated
// by --auth_tokens or --jwt_jwks, workers by --client_ca, --worker_tokens or
// --jwt_jwks.
std::string ExposureProblem(const TallydOptions& o) {
  if (IsLoopbackHost(HostOf(o.listen)) || o.insecure) return "";
  if (o.tls_cert.empty()) return "it would be served in plaintext: pass --tls_cert and --tls_key";
  if (o.auth_tokens.empty() && o.jwt_jwks.empty()) {
    return "anyone reaching it could submit and cancel jobs: pass --auth_tokens or --jwt_jwks";
  }
  if (o.worker_tokens.empty() && o.jwt_jwks.empty() && o.client_ca.empty()) {
    return "any process could connect as a worker: pass --client_ca or --worker_tokens";
  }
  return "";
}

}  // namespace

absl::Status CheckHostPort(const std::string& flag, const std::string& value) {
  std::vector<std::string> parts = absl::StrSplit(value, absl::MaxSplits(':', 1));
  int port;
  if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": expected host:port (e.g. 127.0.0.1:0), got \"", value, "\""));
  }
  return absl::OkStatus();
}

std::string HostOf(const std::string& hostport) {
  return hostport.substr(0, hostport.rfind(':'));
}

absl::Status TallydOptions::Validate() const {
  RETURN_IF_ERROR(CheckHostPort("listen", listen));
  RETURN_IF_ERROR(CheckHostPort("metrics_listen", metrics_listen));
  RETURN_IF_ERROR(CheckScheduling(*this));
  RETURN_IF_ERROR(CheckWatchStreams(*this));
  RETURN_IF_ERROR(CheckStore(*this));
  RETURN_IF_ERROR(CheckTransport(*this));
  if (const std::string why = ExposureProblem(*this); !why.empty()) {
    return Refuse(absl::StrCat("--listen=", listen, " is not a loopback address and ", why,
                               ", or --insecure to serve it anyway"));
  }
  if (max_worker_streams_per_principal < 0 || max_worker_streams < 0) {
    return Refuse(
        "--max_worker_streams_per_principal and --max_worker_streams: must be 0 (no limit) or a "
        "positive count");
  }
  return absl::OkStatus();
}

int64_t TallydOptions::ReservedWatchStreams() const {
  return Reserved(watch_streams_reserved, max_watch_streams);
}

int64_t TallydOptions::ReservedExperimentWatchStreams() const {
  return Reserved(experiment_watch_streams_reserved, max_experiment_watch_streams);
}

}  // namespace tally::config
