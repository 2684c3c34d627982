// tallyd: parse flags, open the store, serve Jobs and Workers over gRPC and
// /metrics over HTTP, tick the scheduler, drain on SIGTERM.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "server/api/core.h"
#include "server/api/data_roots.h"
#include "server/api/gate.h"
#include "server/api/grpc_server_limits.h"
#include "server/api/rate_limiter.h"
#include "server/api/services.h"
#include "server/api/tls_files.h"
#include "server/auth/jwt.h"
#include "server/auth/token_file.h"
#include "server/config/tallyd_config.h"
#include "server/ha/await_lease.h"
#include "server/ha/dsn.h"
#include "server/ha/leader_lease.h"
#include "server/ha/standby_server.h"
#include "server/metrics/build_info.h"
#include "server/metrics/http_exporter.h"
#include "server/metrics/job_metrics.h"
#include "server/store/memory_job_store.h"
#include "server/store/postgres_job_store.h"
#include "server/store/sqlite_job_store.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC address (host:port) for the Jobs and Workers APIs; port 0 "
          "picks a free port");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "HTTP address (host:port) for /metrics; port 0 picks a free port");
ABSL_FLAG(std::string, data_dir, "tally-data",
          "directory for tallyd's SQLite database (created if missing)");
ABSL_FLAG(std::string, store, "sqlite",
          "job store: sqlite (durable, default), memory (lost on exit) or postgres (one "
          "database shared by a leader and standbys; needs a DSN, see --postgres_dsn)");
ABSL_FLAG(std::string, postgres_dsn, "",
          "--store=postgres: libpq connection string (\"host=db port=5432 dbname=tally "
          "user=tally\" or postgresql://...); else $TALLY_POSTGRES_DSN, or "
          "--postgres_dsn_file. Never logged with its password");
ABSL_FLAG(std::string, postgres_dsn_file, "",
          "--store=postgres: file holding the connection string (e.g. a mounted Secret; "
          "trailing newline trimmed); instead of --postgres_dsn");
ABSL_FLAG(absl::Duration, lease_timeout, absl::Seconds(10),
          "--store=postgres: length of the leader lease, renewed every lease_timeout/3. A "
          "standby takes over within about this long after the leader dies; a leader that "
          "cannot renew for this long exits with code 3");
ABSL_FLAG(std::string, advertise_address, "",
          "--store=postgres: HOST:PORT other tallyds name as the leader while this one "
          "leads (default: --listen's host and port, the machine's hostname for 0.0.0.0)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2),
          "how often workers are told to send heartbeats");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10),
          "a worker silent this long loses its attempts (they are requeued)");
ABSL_FLAG(absl::Duration, tick_interval, absl::Milliseconds(200),
          "how often the scheduler places queued jobs and checks heartbeats");
ABSL_FLAG(bool, priority_preemption, true,
          "a queued job that cannot be placed may preempt running jobs of strictly lower "
          "priority on its GPU type: they checkpoint, stop and requeue (a preemption does not "
          "count against max_attempts)");
ABSL_FLAG(absl::Duration, min_runtime_before_preemption, absl::Minutes(10),
          "an attempt that has run less than this is never preempted for a higher-priority "
          "job (0: at once)");
ABSL_FLAG(bool, group_commit, true,
          "batch concurrent submits into one store transaction (one fsync), each caller "
          "answered once its batch has committed; false: one transaction per submit under "
          "the scheduler lock");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(5),
          "on SIGTERM, how long in-flight calls get to finish");
ABSL_FLAG(std::string, config, "",
          "YAML file with prices and throughputs (usd_per_gpu_hour, spot_usd_per_gpu_hour, "
          "flops_per_second_per_gpu) and tenants' quotas (tenants; see examples/tallyd.yaml); "
          "re-read on SIGHUP. "
          "Without it every GPU type costs $0");
ABSL_FLAG(std::string, address_file, "",
          "if set, write \"grpc=HOST:PORT metrics=HOST:PORT\" here once serving");
ABSL_FLAG(int64_t, max_watch_streams_per_principal, 1000,
          "open WatchJob streams one caller (today: one IP address) may hold; "
          "more are refused with RESOURCE_EXHAUSTED. 0: no limit");
ABSL_FLAG(int64_t, max_watch_streams, 20000,
          "open WatchJob streams all callers together may hold; more are "
          "refused with RESOURCE_EXHAUSTED. 0: no limit");
ABSL_FLAG(int64_t, max_experiment_watch_streams_per_principal, 64,
          "open WatchExperiment streams one caller may hold (each holds a "
          "server thread while it waits); more are refused with "
          "RESOURCE_EXHAUSTED. 0: no limit");
ABSL_FLAG(int64_t, max_experiment_watch_streams, 512,
          "open WatchExperiment streams all callers together may hold. 0: no limit");
ABSL_FLAG(int64_t, watch_streams_reserved, -1,
          "the last this many of --max_watch_streams are kept for callers that hold no "
          "WatchJob stream yet, so a few callers at their own limit cannot lock out others. "
          "0: none kept; -1 (default): a tenth of --max_watch_streams");
ABSL_FLAG(int64_t, experiment_watch_streams_reserved, -1,
          "the last this many of --max_experiment_watch_streams are kept for callers that "
          "hold no WatchExperiment stream yet. 0: none kept; -1 (default): a tenth of "
          "--max_experiment_watch_streams");
ABSL_FLAG(int64_t, max_worker_streams_per_principal, 64,
          "open Workers.Connect streams (a Hello sent or not) one worker credential (or one "
          "address, when workers are not authenticated) may hold; more are refused with "
          "RESOURCE_EXHAUSTED. 0: no limit");
ABSL_FLAG(int64_t, max_worker_streams, 4096,
          "open Workers.Connect streams all callers together may hold. 0: no limit");
ABSL_FLAG(absl::Duration, job_metrics_retention, absl::Minutes(15),
          "how long an ended job's per-job series keep their final values (with its terminal "
          "state on tally_job_info) before they are removed; 0 removes them when it ends");
ABSL_FLAG(std::vector<std::string>, job_info_labels, {},
          "comma-separated spec label keys exported on tally_job_info as label_<key> (at most "
          "8), e.g. team,project; each adds a label to every job's info series");
ABSL_FLAG(int32_t, moe_expert_series_max, 256,
          "per-expert series (tally_job_moe_expert_tokens) one job may have, all layers "
          "together; a larger model publishes only the per-layer load summary");

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve gRPC over TLS (with --tls_key). Re-read when the file "
          "changes (checked every 5 s) and checked on SIGHUP");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, client_ca, "",
          "PEM CA bundle: workers may authenticate with a client certificate signed by it, "
          "whose CN or a DNS SAN must equal their --worker_id (needs --tls_cert)");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext and unauthenticated callers on a non-loopback --listen address "
          "(without it tallyd refuses to start there)");
ABSL_FLAG(std::string, auth_tokens, "",
          "YAML file of users: principals: [{name, tenant, role: admin|user|viewer, "
          "token_sha256}]; callers send 'authorization: Bearer TOKEN'. Re-read on SIGHUP");
ABSL_FLAG(std::string, worker_tokens, "",
          "YAML file of worker tokens (same format, role worker, name = the worker id); for "
          "workers that cannot present a client certificate. Re-read on SIGHUP");
ABSL_FLAG(std::string, jwt_jwks, "",
          "JWK Set (JSON) whose RS256/ES256 keys sign accepted JWT bearer tokens (needs "
          "--jwt_issuer and --jwt_audience). Re-read on SIGHUP");
ABSL_FLAG(std::string, jwt_issuer, "", "the iss every accepted JWT must carry");
ABSL_FLAG(std::string, jwt_audience, "", "the aud every accepted JWT must carry");
ABSL_FLAG(std::string, jwt_principal_claim, "sub", "JWT claim naming the principal");
ABSL_FLAG(std::string, jwt_tenant_claim, "tenant", "JWT claim naming the tenant");
ABSL_FLAG(std::string, jwt_role_claim, "role",
          "JWT claim naming the role (admin, user, viewer or worker)");
ABSL_FLAG(absl::Duration, jwt_max_lifetime, absl::Hours(24),
          "the longest a JWT may be valid: exp - iat and exp - now above it are refused");
ABSL_FLAG(bool, reflection, true, "serve gRPC server reflection (it stays unauthenticated)");
ABSL_FLAG(std::string, metrics_tls_cert, "",
          "PEM certificate chain: serve /metrics and /healthz over HTTPS only (with "
          "--metrics_tls_key; --tls_cert's files will do). Re-read when the files change "
          "(checked at most every 5 s)");
ABSL_FLAG(std::string, metrics_tls_key, "", "PEM private key of --metrics_tls_cert");
ABSL_FLAG(std::vector<std::string>, data_roots, {},
          "comma-separated folders: a submitted job's (or experiment variant's) "
          "data.train_path and data.val_path must resolve, after symlinks, inside one, else "
          "the call is refused with INVALID_ARGUMENT. A relative dataset path is taken "
          "relative to tallyd's working directory: tallyd and the workers should see datasets "
          "at the same paths (workers check again, tally-worker --data_root). Empty: no check");

namespace tally {
namespace {

bool IsLoopbackHost(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host == "localhost" || host == "::1" || absl::StartsWith(host, "127.");
}

// Reads the credentials files; errors name the flag and the path. At start
// (`failed` null) the first bad file is the error. On a reload (`failed` set)
// a bad file fails closed: a token file becomes an empty table and a bad
// --jwt_jwks refuses every JWT, until a later reload reads it; each is
// appended to `failed` as {flag, error}.
absl::StatusOr<api::Credentials> LoadCredentials(
    std::vector<std::pair<std::string, std::string>>* failed = nullptr) {
  api::Credentials c;
  c.client_certificates = !absl::GetFlag(FLAGS_client_ca).empty();
  const auto load_tokens = [&](const std::string& flag, const std::string& path,
                               auth::TokenTable::Kind kind,
                               std::shared_ptr<const auth::TokenTable>* out) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    auto t = auth::TokenTable::Load(path, kind);
    if (t.ok()) {
      *out = std::make_shared<const auth::TokenTable>(std::move(*t));
      return absl::OkStatus();
    }
    absl::Status error(t.status().code(), absl::StrCat("--", flag, ": ", t.status().message()));
    if (failed == nullptr) return error;
    failed->emplace_back(flag, std::string(error.message()));
    *out = std::make_shared<const auth::TokenTable>(*auth::TokenTable::Parse("", kind, path));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(load_tokens("auth_tokens", absl::GetFlag(FLAGS_auth_tokens),
                              auth::TokenTable::Kind::kUsers, &c.users));
  RETURN_IF_ERROR(load_tokens("worker_tokens", absl::GetFlag(FLAGS_worker_tokens),
                              auth::TokenTable::Kind::kWorkers, &c.workers));
  const std::string jwks = absl::GetFlag(FLAGS_jwt_jwks);
  auth::JwtOptions jo;
  jo.issuer = absl::GetFlag(FLAGS_jwt_issuer);
  jo.audience = absl::GetFlag(FLAGS_jwt_audience);
  jo.principal_claim = absl::GetFlag(FLAGS_jwt_principal_claim);
  jo.tenant_claim = absl::GetFlag(FLAGS_jwt_tenant_claim);
  jo.role_claim = absl::GetFlag(FLAGS_jwt_role_claim);
  jo.max_lifetime = absl::GetFlag(FLAGS_jwt_max_lifetime);
  if (jwks.empty() != (jo.issuer.empty() && jo.audience.empty()) ||
      (!jwks.empty() && (jo.issuer.empty() || jo.audience.empty()))) {
    return absl::InvalidArgumentError(
        "--jwt_jwks, --jwt_issuer and --jwt_audience go together: give all three or none");
  }
  if (!jwks.empty()) {
    auto v = auth::JwtVerifier::Load(jwks, jo);
    if (!v.ok()) {
      absl::Status error(v.status().code(),
                         absl::StrCat("--jwt_jwks: ", v.status().message()));
      if (failed == nullptr) return error;
      failed->emplace_back("jwt_jwks", std::string(error.message()));
      c.jwt_refused = true;
      return c;
    }
    c.jwt = std::make_shared<const auth::JwtVerifier>(std::move(*v));
  }
  return c;
}

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

// Writes `text` to `path` atomically (a temporary file renamed over it), so a
// reader never sees half of it. Errors name the flag and the path.
absl::Status WriteAddressFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text << "\n";
    out.flush();
    if (!out) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--address_file: cannot write ", tmp, " (does its directory exist and is it writable?)"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::FailedPreconditionError(
        absl::StrCat("--address_file: cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

std::string HostOf(const std::string& hostport) {
  return hostport.substr(0, hostport.rfind(':'));
}

// --store=postgres: the DSN and lease settings, checked before anything is
// served. Errors name the flag.
struct PostgresSettings {
  std::string dsn;
  absl::Duration lease_timeout;
  std::string advertise_address;
};

absl::StatusOr<std::optional<PostgresSettings>> LoadPostgresSettings(const std::string& kind) {
  const std::string dsn_flag = absl::GetFlag(FLAGS_postgres_dsn);
  const std::string dsn_file = absl::GetFlag(FLAGS_postgres_dsn_file);
  if (kind != "postgres") {
    if (!dsn_flag.empty() || !dsn_file.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--postgres_dsn and --postgres_dsn_file need --store=postgres (got --store=", kind,
          ")"));
    }
    return std::nullopt;
  }
  PostgresSettings p;
  const char* env = std::getenv("TALLY_POSTGRES_DSN");
  ASSIGN_OR_RETURN(p.dsn, ha::ResolveDsn({dsn_flag, dsn_file, env != nullptr ? env : ""}));
  p.lease_timeout = absl::GetFlag(FLAGS_lease_timeout);
  if (p.lease_timeout < absl::Seconds(1) || p.lease_timeout > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--lease_timeout: must be between 1s and 1h (e.g. 10s), got ",
        absl::FormatDuration(p.lease_timeout)));
  }
  if (p.lease_timeout < absl::Seconds(6)) {
    spdlog::warn("--lease_timeout={}: shorter than 6s, one reconnect to PostgreSQL (up to 2 s) "
                 "can outlast a renewal, and the leader then exits with code 3 on a brief "
                 "database blip; 10s or more suits production",
                 absl::FormatDuration(p.lease_timeout));
  }
  p.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  if (!p.advertise_address.empty()) {
    RETURN_IF_ERROR(CheckHostPort("advertise_address", p.advertise_address));
  }
  return p;
}

// What standbys name as the leader: --advertise_address, else the bound
// --listen address (the hostname when it listens on every interface).
std::string LeaseHolder(const PostgresSettings& p, const std::string& listen, int port) {
  if (!p.advertise_address.empty()) return p.advertise_address;
  std::string host = HostOf(listen);
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') host = name;
  }
  return absl::StrCat(host, ":", port);
}

// Sleeps up to `d` in sigwait: false on SIGTERM or SIGINT (stop waiting).
// A SIGHUP is remembered in `hup` for when this tallyd leads.
bool WaitForSignal(const sigset_t& signals, absl::Duration d, bool* hup) {
  const absl::Time until = absl::Now() + d;
  while (true) {
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    const timespec ts = absl::ToTimespec(left);
    const int sig = sigtimedwait(&signals, nullptr, &ts);
    if (sig == SIGTERM || sig == SIGINT) return false;
    if (sig == SIGHUP) {
      spdlog::info("SIGHUP: this tallyd is a standby; it reloads once it leads");
      *hup = true;
    }
  }
}

// tallyd's TLS files (flags), checked: the gRPC server's and the metrics
// endpoint's.
struct TlsFlags {
  std::string cert, key, client_ca;
  std::string metrics_cert, metrics_key;
};

absl::StatusOr<TlsFlags> ReadTlsFlags() {
  TlsFlags t{absl::GetFlag(FLAGS_tls_cert), absl::GetFlag(FLAGS_tls_key),
             absl::GetFlag(FLAGS_client_ca), absl::GetFlag(FLAGS_metrics_tls_cert),
             absl::GetFlag(FLAGS_metrics_tls_key)};
  if (t.cert.empty() != t.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both (PEM files) or neither");
  }
  if (!t.client_ca.empty() && t.cert.empty()) {
    return absl::InvalidArgumentError(
        "--client_ca needs --tls_cert and --tls_key: client certificates are checked in the "
        "TLS handshake");
  }
  if (!t.cert.empty()) RETURN_IF_ERROR(api::CheckTlsFiles(t.cert, t.key, t.client_ca));
  if (t.metrics_cert.empty() != t.metrics_key.empty()) {
    return absl::InvalidArgumentError(
        "--metrics_tls_cert and --metrics_tls_key go together: give both (PEM files) or "
        "neither");
  }
  if (!t.metrics_cert.empty()) {
    RETURN_IF_ERROR(api::CheckTlsFiles(t.metrics_cert, t.metrics_key, "",
                                       {"metrics_tls_cert", "metrics_tls_key", ""}));
  }
  return t;
}

// Why serving on `listen` would expose tallyd (plaintext, or callers or
// workers not authenticated) when it is not a loopback address and
// --insecure is not given; empty when it may serve.
std::string ExposureProblem(const std::string& listen, const std::string& tls_cert,
                            const api::Credentials& credentials) {
  if (IsLoopbackHost(HostOf(listen)) || absl::GetFlag(FLAGS_insecure)) return "";
  if (tls_cert.empty()) return "it would be served in plaintext: pass --tls_cert and --tls_key";
  if (!credentials.users_authenticated()) {
    return "anyone reaching it could submit and cancel jobs: pass --auth_tokens or --jwt_jwks";
  }
  if (!credentials.workers_authenticated()) {
    return "any process could connect as a worker: pass --client_ca or --worker_tokens";
  }
  return "";
}

// What a SIGHUP reloads, and what it reloads into.
struct Reloadable {
  api::Gate& gate;
  metrics::Family<metrics::Counter>& credential_reload_failures;
  const TlsFlags& tls;
  const std::string& config_path;
  const config::TallydConfig& config;  // as read at start
  api::RateLimiter& submit_limiter;
  api::PriorityCaps& priority_caps;
  api::Core& core;
};

// One SIGHUP: credentials (a bad file fails closed, and streams they no
// longer admit end), a check of the TLS files, then the config file's
// prices, quotas, submit limits and priority caps (a bad file keeps the
// old ones; what is read at start only is named).
void Reload(const Reloadable& r) {
  const std::string& tls_cert = r.tls.cert;
  const std::string& tls_key = r.tls.key;
  const std::string& client_ca = r.tls.client_ca;
  const std::string& config_path = r.config_path;
  api::Gate& gate = r.gate;
  api::Core& core = r.core;
  const config::TallydConfig* config = &r.config;
  auto& credential_reload_failures = r.credential_reload_failures;
  api::RateLimiter& submit_limiter = r.submit_limiter;
  api::PriorityCaps& priority_caps = r.priority_caps;
  // Credentials: a bad file fails closed (none of its credentials is
  // accepted until a reload reads it); streams they no longer admit end.
  std::vector<std::pair<std::string, std::string>> failed;
  absl::StatusOr<api::Credentials> reloaded_credentials = LoadCredentials(&failed);
  for (const auto& [flag, error] : failed) {
    spdlog::error("SIGHUP: {}; every credential of --{} is refused until it is fixed and "
                  "tallyd reloaded", error, flag);
    credential_reload_failures.Add({{"file", flag}}).Increment();
  }
  if (!reloaded_credentials.ok()) {
    spdlog::error("SIGHUP: {}; keeping the previous credentials",
                  std::string(reloaded_credentials.status().message()));
  } else {
    const int ended = gate.Reload(*std::move(reloaded_credentials));
    spdlog::info("SIGHUP: reloaded the token and JWT key files{}; ended {} stream(s) whose "
                 "credential was revoked", failed.empty() ? "" : " (failing closed)", ended);
  }
  if (!tls_cert.empty()) {
    absl::Status s = api::CheckTlsFiles(tls_cert, tls_key, client_ca);
    if (s.ok()) {
      spdlog::info("SIGHUP: the TLS files are valid; they are served within 5 s of a change");
    } else {
      spdlog::error("SIGHUP: {}; the last valid certificate stays in use",
                    std::string(s.message()));
    }
  }
  // Reload prices; a bad file keeps the old ones.
  if (config_path.empty()) {
    spdlog::warn("SIGHUP: no --config to reload");
    return;
  }
  auto reloaded = config::LoadTallydConfig(config_path);
  if (!reloaded.ok()) {
    spdlog::error("SIGHUP: {}; keeping the previous prices",
                  std::string(reloaded.status().message()));
    return;
  }
  submit_limiter.SetLimits(reloaded->limits.submits_per_second, reloaded->limits.submit_burst);
  priority_caps.Set(reloaded->tenancy);
  if (reloaded->tenancy.cross_tenant_preemption != config->tenancy.cross_tenant_preemption) {
    spdlog::warn("SIGHUP: tenancy.cross_tenant_preemption in {} changed; it is read at start "
                 "only, restart tallyd to apply it", config_path);
  }
  if (api::GrpcServerArgs(reloaded->grpc_server) != api::GrpcServerArgs(config->grpc_server)) {
    spdlog::warn("SIGHUP: grpc_server in {} changed; it is read at start only, restart "
                 "tallyd to apply it", config_path);
  }
  const std::string prices = reloaded->prices.Describe();
  const absl::Status priced = core.Run([&](sched::Scheduler& s) {
    s.SetQuotas(reloaded->quotas);
    return s.SetPrices(reloaded->prices);
  });
  if (priced.ok()) {
    spdlog::info("SIGHUP: reloaded {}", prices);
  } else {
    spdlog::error("SIGHUP: {}; keeping the previous prices (send SIGHUP again once the store "
                  "takes writes)", std::string(priced.message()));
  }
}

int Run() {
  const std::string listen = absl::GetFlag(FLAGS_listen);
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  for (const auto& [flag, value] :
       {std::pair{"listen", listen}, std::pair{"metrics_listen", metrics_listen}}) {
    if (absl::Status s = CheckHostPort(flag, value); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      return 2;
    }
  }
  sched::SchedulerOptions options;
  options.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  options.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  if (options.heartbeat_timeout <= options.heartbeat_interval) {
    spdlog::error("--heartbeat_timeout ({}) must be longer than --heartbeat_interval ({})",
                  absl::FormatDuration(options.heartbeat_timeout),
                  absl::FormatDuration(options.heartbeat_interval));
    return 2;
  }

  options.priority_preemption = absl::GetFlag(FLAGS_priority_preemption);
  options.group_commit = absl::GetFlag(FLAGS_group_commit);
  options.min_runtime_before_preemption = absl::GetFlag(FLAGS_min_runtime_before_preemption);
  if (options.min_runtime_before_preemption < absl::ZeroDuration() ||
      options.min_runtime_before_preemption == absl::InfiniteDuration()) {
    spdlog::error("--min_runtime_before_preemption: must be a finite duration >= 0 (e.g. 10m), "
                  "got {}",
                  absl::FormatDuration(options.min_runtime_before_preemption));
    return 2;
  }

  options.job_metrics.retention = absl::GetFlag(FLAGS_job_metrics_retention);
  options.job_metrics.info_labels = absl::GetFlag(FLAGS_job_info_labels);
  options.job_metrics.max_expert_series = absl::GetFlag(FLAGS_moe_expert_series_max);
  if (absl::Status s = metrics::ValidateJobMetricsOptions(options.job_metrics); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }

  api::JobsService::Options jobs_options;
  jobs_options.max_watch_streams_per_principal =
      absl::GetFlag(FLAGS_max_watch_streams_per_principal);
  jobs_options.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  api::ExperimentsService::Options experiments_options;
  experiments_options.max_watch_streams_per_principal =
      absl::GetFlag(FLAGS_max_experiment_watch_streams_per_principal);
  experiments_options.max_watch_streams = absl::GetFlag(FLAGS_max_experiment_watch_streams);
  for (const auto& [flag, value] :
       {std::pair{"max_watch_streams_per_principal",
                  jobs_options.max_watch_streams_per_principal},
        std::pair{"max_watch_streams", jobs_options.max_watch_streams},
        std::pair{"max_experiment_watch_streams_per_principal",
                  experiments_options.max_watch_streams_per_principal},
        std::pair{"max_experiment_watch_streams", experiments_options.max_watch_streams}}) {
    if (value < 0) {
      spdlog::error("--{}: must be 0 (no limit) or a positive count, got {}", flag, value);
      return 2;
    }
  }
  for (auto [flag, given, reserved, total_flag, total] :
       {std::tuple{"watch_streams_reserved", absl::GetFlag(FLAGS_watch_streams_reserved),
                   &jobs_options.watch_streams_reserved, "max_watch_streams",
                   jobs_options.max_watch_streams},
        std::tuple{"experiment_watch_streams_reserved",
                   absl::GetFlag(FLAGS_experiment_watch_streams_reserved),
                   &experiments_options.watch_streams_reserved, "max_experiment_watch_streams",
                   experiments_options.max_watch_streams}}) {
    *reserved = given == -1 ? total / 10 : given;
    if (*reserved < 0 || (total > 0 && *reserved >= total)) {
      spdlog::error("--{}: must be -1 (a tenth), 0 (none kept) or a count below --{} ({}), "
                    "got {}", flag, total_flag, total, given);
      return 2;
    }
  }

  const std::string kind = absl::GetFlag(FLAGS_store);
  if (kind != "sqlite" && kind != "memory" && kind != "postgres") {
    spdlog::error("--store: must be sqlite, memory or postgres, got \"{}\"", kind);
    return 2;
  }
  absl::StatusOr<std::optional<PostgresSettings>> postgres = LoadPostgresSettings(kind);
  if (!postgres.ok()) {
    spdlog::error("{}", std::string(postgres.status().message()));
    return 2;
  }

  // A bad --address_file is refused before anything is served.
  const std::string address_file = absl::GetFlag(FLAGS_address_file);
  if (!address_file.empty()) {
    // Its temporary file is made and removed: the file itself appears only
    // once tallyd serves, since readers take its appearance as that sign.
    const std::string tmp = address_file + ".tmp";
    if (!std::ofstream(tmp, std::ios::trunc)) {
      spdlog::error("--address_file: cannot write {} (does its directory exist and is it "
                    "writable?)", tmp);
      return 2;
    }
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
  }

  // Transport and credentials: refused before anything is served.
  absl::StatusOr<TlsFlags> tls_flags = ReadTlsFlags();
  if (!tls_flags.ok()) {
    spdlog::error("{}", std::string(tls_flags.status().message()));
    return 2;
  }
  const std::string& tls_cert = tls_flags->cert;
  const std::string& tls_key = tls_flags->key;
  const std::string& client_ca = tls_flags->client_ca;
  const std::string& metrics_tls_cert = tls_flags->metrics_cert;
  const std::string& metrics_tls_key = tls_flags->metrics_key;
  std::error_code cwd_error;
  const std::filesystem::path cwd = std::filesystem::current_path(cwd_error);
  if (cwd_error) {
    spdlog::error("cannot read the working directory: {}", cwd_error.message());
    return 2;
  }
  absl::StatusOr<api::DataRoots> data_roots =
      api::DataRoots::Make(absl::GetFlag(FLAGS_data_roots), cwd);
  if (!data_roots.ok()) {
    spdlog::error("{}", std::string(data_roots.status().message()));
    return 2;
  }
  if (data_roots->checking()) {
    spdlog::info("tallyd: datasets must lie under --data_roots {}", data_roots->Describe());
    jobs_options.data_roots = &*data_roots;
    experiments_options.data_roots = &*data_roots;
  }
  absl::StatusOr<api::Credentials> credentials = LoadCredentials();
  if (!credentials.ok()) {
    spdlog::error("{}", std::string(credentials.status().message()));
    return 2;
  }
  if (const std::string why = ExposureProblem(listen, tls_cert, *credentials); !why.empty()) {
    spdlog::error("--listen={} is not a loopback address and {}, or --insecure to serve it "
                  "anyway", listen, why);
    return 2;
  }
  spdlog::info("tallyd: gRPC {} on {}; users: {}; workers: {}",
               tls_cert.empty() ? "in plaintext" : "over TLS", listen,
               credentials->users_authenticated() ? "authenticated"
                                                  : "not authenticated (every caller is admin)",
               credentials->workers_authenticated()
                   ? (client_ca.empty() ? "worker tokens" : "client certificates or tokens")
                   : "not authenticated");

  const std::string config_path = absl::GetFlag(FLAGS_config);
  auto config = config::LoadTallydConfig(config_path);
  if (!config.ok()) {
    spdlog::error("{}", std::string(config.status().message()));
    return 2;
  }
  options.prices = config->prices;
  options.quotas = config->quotas;
  options.cross_tenant_preemption = config->tenancy.cross_tenant_preemption;
  api::PriorityCaps priority_caps(config->tenancy);
  jobs_options.priority_caps = &priority_caps;
  experiments_options.priority_caps = &priority_caps;
  spdlog::info("tallyd: {}", options.prices.Describe());
  api::RateLimiter submit_limiter({config->limits.submits_per_second,
                                   config->limits.submit_burst, "submits",
                                   "limits.submits_per_second", "limits.submit_burst"});
  jobs_options.submit_limiter = &submit_limiter;
  experiments_options.submit_limiter = &submit_limiter;

  // Signals are taken by one thread with sigwait; block them everywhere first.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::shared_ptr<grpc::ServerCredentials> server_credentials = grpc::InsecureServerCredentials();
  if (!tls_cert.empty()) {
    // The files are watched: a renewed certificate is served within 5 s.
    constexpr unsigned kRefreshSeconds = 5;
    auto provider =
        client_ca.empty()
            ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                  tls_key, tls_cert, kRefreshSeconds)
            : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                  tls_key, tls_cert, client_ca, kRefreshSeconds);
    grpc::experimental::TlsServerCredentialsOptions tls(provider);
    tls.watch_identity_key_cert_pairs();
    if (client_ca.empty()) {
      tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    } else {
      // Requested, not required: users call the same port with tokens.
      tls.watch_root_certs();
      tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    }
    server_credentials = grpc::experimental::TlsServerCredentials(tls);
  }
  RealClock clock;
  metrics::Registry registry;
  metrics::RegisterBuildInfo(&registry);
  auto& credential_reload_failures =
      metrics::BuildCounter()
          .Name("tally_credential_reload_failures_total")
          .Help("SIGHUP reloads that found a credentials file (file: auth_tokens, "
                "worker_tokens, jwt_jwks) bad; its credentials are refused until it is fixed")
          .Register(registry);
  for (const char* file : {"auth_tokens", "worker_tokens", "jwt_jwks"}) {
    credential_reload_failures.Add({{"file", file}});
  }
  metrics::Gauge& leader_gauge =
      metrics::BuildGauge()
          .Name("tally_leader")
          .Help("1 while this tallyd leads (schedules, accepts workers, writes); 0 on a "
                "standby waiting for the lease (--store=postgres)")
          .Register(registry)
          .Add({});
  std::optional<metrics::HttpExporter::Tls> metrics_tls;
  if (!metrics_tls_cert.empty()) {
    metrics_tls = metrics::HttpExporter::Tls{metrics_tls_cert, metrics_tls_key};
  }
  std::unique_ptr<metrics::HttpExporter> exporter;
  // The gRPC address to bind: a standby's port 0 becomes the port it bound,
  // so the leader it turns into serves where it was found.
  std::string grpc_listen = listen;
  bool hup_while_standby = false;
  std::unique_ptr<store::JobStore> store;
  // Held only with --store=postgres: the lease and its keeper (declared
  // last, so its threads stop before what they use is destroyed).
  std::atomic<bool> lease_lost{false};
  int64_t lease_epoch = 0;
  std::unique_ptr<ha::LeaderLease> lease;
  std::unique_ptr<ha::LeaseKeeper> keeper;
  // A standby's server keeps the port until the leader's is bound beside it
  // (gRPC sets SO_REUSEPORT), so clients never find the port closed.
  std::unique_ptr<ha::StandbyServer> standby;
  if (kind == "memory") {
    store = std::make_unique<store::InMemoryJobStore>();
  } else if (kind == "sqlite") {
    const std::string dir = absl::GetFlag(FLAGS_data_dir);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      spdlog::error("--data_dir: cannot create {}: {}", dir, ec.message());
      return 2;
    }
    auto opened = store::SqliteJobStore::Open((std::filesystem::path(dir) / "tally.db").string());
    if (!opened.ok()) {
      spdlog::error("{}", std::string(opened.status().message()));
      return 2;
    }
    store = std::move(*opened);
  } else {
    // --store=postgres: serve as a standby (health NOT_SERVING, every call
    // UNAVAILABLE naming the leader, /readyz 503) until the lease is ours;
    // see server/ha/leader_lease.h for the protocol.
    const PostgresSettings& pg = **postgres;
    auto started_standby = ha::StandbyServer::Start(
        listen, server_credentials, [&](grpc::ServerBuilder* b) {
          api::ApplyGrpcServerLimits(config->grpc_server, b);
        });
    if (!started_standby.ok()) {
      spdlog::error("{}", std::string(started_standby.status().message()));
      return 2;
    }
    standby = *std::move(started_standby);
    grpc_listen = absl::StrCat(HostOf(listen), ":", standby->port());
    auto started = metrics::HttpExporter::Start(metrics_listen, &registry, metrics_tls);
    if (!started.ok()) {
      spdlog::error("{}", std::string(started.status().message()));
      return 2;
    }
    exporter = *std::move(started);
    const std::string addresses = absl::StrCat("grpc=", grpc_listen, " metrics=",
                                               HostOf(metrics_listen), ":", exporter->port());
    if (!address_file.empty()) {
      if (absl::Status s = WriteAddressFile(address_file, addresses); !s.ok()) {
        spdlog::error("{}", std::string(s.message()));
        return 2;
      }
    }
    const std::string holder = LeaseHolder(pg, listen, standby->port());
    spdlog::info("tallyd: standby {} on PostgreSQL {}, waiting for the leader lease "
                 "(--lease_timeout={})",
                 addresses, ha::RedactDsn(pg.dsn), absl::FormatDuration(pg.lease_timeout));
    lease = std::make_unique<ha::LeaderLease>(pg.dsn, holder, pg.lease_timeout);
    std::unique_ptr<store::PostgresJobStore> opened;
    ha::AwaitOptions await;
    await.poll_interval = pg.lease_timeout / 5;
    // Opening migrates the schema, which creates the lease table.
    await.prepare = [&]() -> absl::Status {
      auto o = store::PostgresJobStore::Open(pg.dsn);
      if (!o.ok()) return o.status();
      opened = *std::move(o);
      return absl::OkStatus();
    };
    await.wait = [&](absl::Duration d) { return WaitForSignal(signals, d, &hup_while_standby); };
    await.on_leader = [&](const std::string& leader) { standby->SetLeader(leader); };
    absl::StatusOr<std::optional<ha::Acquired>> acquired = ha::AwaitLease(lease.get(), await);
    if (!acquired.ok()) {
      spdlog::error("{}", std::string(acquired.status().message()));
      return 2;
    }
    if (!acquired->has_value()) {
      spdlog::info("tallyd: standby stopped by a signal");
      return 0;
    }
    lease_epoch = (*acquired)->epoch;
    // Fenced before recovery: from here on no write commits unless the
    // lease row still carries this epoch.
    opened->SetFencingEpoch(lease_epoch);
    store::PostgresJobStore* fenced = opened.get();
    ha::LeaseKeeper::Options keep;
    keep.lease_timeout = pg.lease_timeout;
    keep.must_restart = [fenced] { return fenced->MustRestart(); };
    keep.on_lost = [&lease_lost](const std::string& why) {
      spdlog::error("tallyd: no longer the leader: {}; exiting with code 3 (to restart as a "
                    "standby)", why);
      lease_lost.store(true);
      // Draining must not keep a deposed leader alive: the fence already
      // keeps it from committing, this keeps it from serving.
      std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        spdlog::error("tallyd: drain after losing the lease took over 5 s; exiting now");
        spdlog::shutdown();
        std::_Exit(3);
      }).detach();
      kill(getpid(), SIGTERM);
    };
    keeper = std::make_unique<ha::LeaseKeeper>(lease.get(), lease_epoch, (*acquired)->sent,
                                               std::move(keep));
    spdlog::info("tallyd: took the leader lease (epoch {}, holder {}); recovering state",
                 lease_epoch, holder);
    standby->SetLeader(
        absl::StrCat(holder, " (epoch ", lease_epoch, "): this tallyd, recovering its state"));
    store = std::move(opened);
  }

  api::Core core(store.get(), &clock, &registry, options);
  if (absl::Status s = core.Init(); !s.ok()) {
    spdlog::error("recovering state from the store: {}", std::string(s.message()));
    return lease_lost.load() ? 3 : 1;
  }
  if (lease_lost.load() || (keeper != nullptr && keeper->lost())) {
    // Deposed while recovering: never announce this tallyd as the leader.
    spdlog::error("tallyd: lost the leader lease while recovering; exiting with code 3");
    return 3;
  }

  api::Gate gate(&clock, *credentials);
  jobs_options.gate = &gate;
  experiments_options.gate = &gate;
  api::JobsService jobs(&core, jobs_options);
  api::ExperimentsService experiments(&core, experiments_options);
  api::WorkersService::Options workers_options;
  workers_options.max_streams_per_principal =
      absl::GetFlag(FLAGS_max_worker_streams_per_principal);
  workers_options.max_streams = absl::GetFlag(FLAGS_max_worker_streams);
  workers_options.gate = &gate;
  if (workers_options.max_streams_per_principal < 0 || workers_options.max_streams < 0) {
    spdlog::error("--max_worker_streams_per_principal and --max_worker_streams: must be 0 (no "
                  "limit) or a positive count");
    return 2;
  }
  api::WorkersService workers(&core, workers_options);
  grpc::EnableDefaultHealthCheckService(true);
  if (absl::GetFlag(FLAGS_reflection)) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  api::ApplyGrpcServerLimits(config->grpc_server, &builder);
  int grpc_port = 0;
  builder.AddListeningPort(grpc_listen, server_credentials, &grpc_port);
  builder.RegisterService(&jobs);
  builder.RegisterService(&experiments);
  builder.RegisterService(&workers);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<api::MetricsInterceptorFactory>(
          &registry, &clock,
          std::vector<std::string>{"tally.v1.Jobs", "tally.v1.Experiments", "tally.v1.Workers"}));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || grpc_port == 0) {
    spdlog::error("--listen: cannot listen on {} (address in use?)", listen);
    return 2;
  }
  if (exporter != nullptr) exporter->SetReady(true);
  leader_gauge.Set(1);
  if (standby != nullptr) {
    standby->Shutdown();
    standby.reset();
  }
  if (exporter == nullptr) {
    auto started = metrics::HttpExporter::Start(metrics_listen, &registry, metrics_tls);
    if (!started.ok()) {
      spdlog::error("{}", std::string(started.status().message()));
      server->Shutdown();
      return 2;
    }
    exporter = *std::move(started);
  }
  // /readyz: not ready while the store refuses writes (a full disk), with
  // the reason; the ticker probes the store until writes succeed again.
  exporter->SetReadinessCheck([&store]() -> std::optional<std::string> {
    const store::WriteHealth* health = store->write_health();
    return health != nullptr ? health->Failing() : std::nullopt;
  });
  spdlog::info("tallyd: /metrics over {} on {}", metrics_tls ? "HTTPS" : "plain HTTP",
               metrics_listen);
  server->GetHealthCheckService()->SetServingStatus(true);
  server->GetHealthCheckService()->SetServingStatus(ha::kLivenessService, true);
  exporter->SetReady(true);
  leader_gauge.Set(1);

  const std::string addresses =
      absl::StrCat("grpc=", HostOf(listen), ":", grpc_port, " metrics=",
                   HostOf(metrics_listen), ":", exporter->port());
  std::printf("tallyd serving %s\n", addresses.c_str());
  std::fflush(stdout);
  if (!address_file.empty()) {
    if (absl::Status s = WriteAddressFile(address_file, addresses); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      server->Shutdown();
      return 2;
    }
  }

  std::atomic<bool> stop{false};
  std::thread ticker([&] {
    const absl::Duration every = absl::GetFlag(FLAGS_tick_interval);
    bool writes_failing = false;
    while (!stop.load()) {
      absl::Status s = core.Tick();
      if (!s.ok()) spdlog::error("scheduler tick: {}", std::string(s.message()));
      if (const store::WriteHealth* health = store->write_health(); health != nullptr) {
        // While failing, one small write per tick finds out when the store
        // takes writes again (nothing else may write meanwhile).
        if (std::optional<std::string> why = health->Failing(); why.has_value()) {
          if (!writes_failing) spdlog::error("/readyz: not ready: {}", *why);
          writes_failing = !store->ProbeWrite().ok();
          if (!writes_failing) spdlog::info("/readyz: the store takes writes again; ready");
        } else if (writes_failing) {
          writes_failing = false;
          spdlog::info("/readyz: the store takes writes again; ready");
        }
      }
      absl::SleepFor(every);
    }
  });

  // Streams whose JWT or client certificate expired end here, off the
  // scheduler's thread (each check admits every open stream again).
  std::thread credential_checker([&] {
    absl::Time next = clock.Now() + api::kStreamRecheckInterval;
    while (!stop.load()) {
      absl::SleepFor(absl::Milliseconds(100));
      if (clock.Now() < next) continue;
      next = clock.Now() + api::kStreamRecheckInterval;
      if (int ended = gate.RecheckStreams(); ended > 0) {
        spdlog::info("tallyd: ended {} stream(s) whose credential expired", ended);
      }
    }
  });

  // A SIGHUP a standby received is acted on now that it leads.
  if (hup_while_standby) kill(getpid(), SIGHUP);
  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    Reload({gate, credential_reload_failures, *tls_flags, config_path, *config, submit_limiter,
            priority_caps, core});
  }
  const bool deposed = lease_lost.load();
  if (!deposed) spdlog::info("tallyd: signal {}, draining", sig);
  // Health first, so load balancers and probes stop sending work.
  server->GetHealthCheckService()->SetServingStatus(false);
  exporter->SetReady(false);
  leader_gauge.Set(0);
  stop.store(true);
  ticker.join();
  credential_checker.join();
  core.Shutdown();
  // A deposed leader's calls would only fail at the fence: cut them short.
  server->Shutdown(std::chrono::system_clock::now() +
                   (deposed ? std::chrono::seconds(1)
                            : absl::ToChronoSeconds(absl::GetFlag(FLAGS_drain_timeout))));
  if (keeper != nullptr) {
    // Nothing more is written: hand the lease over now rather than after
    // --lease_timeout (stopping the keeper first, so no renewal follows).
    keeper->Stop();
    if (deposed || keeper->lost()) {
      spdlog::info("tallyd: stopped (deposed; exit code 3)");
      return 3;
    }
    if (absl::Status s = lease->Release(lease_epoch); s.ok()) {
      spdlog::info("tallyd: released the leader lease (epoch {})", lease_epoch);
    } else {
      spdlog::warn("tallyd: could not release the leader lease (a standby takes over "
                   "within --lease_timeout): {}", std::string(s.message()));
    }
  }
  spdlog::info("tallyd: stopped");
  return 0;
}

}  // namespace
}  // namespace tally

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tallyd: the Tally controller. Accepts training jobs over gRPC, stores "
      "them durably, schedules them onto tally-worker processes and exports "
      "Prometheus metrics.\n\nUsage: tallyd [--listen=HOST:PORT] "
      "[--metrics_listen=HOST:PORT] [--data_dir=DIR]");
  absl::ParseCommandLine(argc, argv);
  return tally::Run();
}
