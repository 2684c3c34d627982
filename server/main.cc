// tallyd: parse flags into TallydOptions, Validate() them, read the files they
// name, open the store (as a standby until it leads, with --store=postgres),
// serve Jobs, Experiments and Workers over gRPC and /metrics over HTTP, tick
// the scheduler, reload on SIGHUP, drain on SIGTERM.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/flag_env.h"
#include "common/status_macros.h"
#include "server/api/core.h"
#include "server/api/data_roots.h"
#include "server/api/frontend.h"
#include "server/api/gate.h"
#include "server/api/priority_caps.h"
#include "server/api/rate_limiter.h"
#include "server/api/services.h"
#include "server/api/tls_files.h"
#include "server/config/tallyd_config.h"
#include "server/config/tallyd_options.h"
#include "server/metrics/build_info.h"
#include "server/metrics/http_exporter.h"
#include "server/metrics/registry.h"
#include "server/wiring/address_file.h"
#include "server/wiring/credentials.h"
#include "server/wiring/grpc_server.h"
#include "server/wiring/reload.h"
#include "server/wiring/store.h"
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

config::TallydOptions OptionsFromFlags() {
  config::TallydOptions o;
  o.listen = absl::GetFlag(FLAGS_listen);
  o.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  o.data_dir = absl::GetFlag(FLAGS_data_dir);
  o.store = absl::GetFlag(FLAGS_store);
  o.postgres_dsn = absl::GetFlag(FLAGS_postgres_dsn);
  o.postgres_dsn_file = absl::GetFlag(FLAGS_postgres_dsn_file);
  o.lease_timeout = absl::GetFlag(FLAGS_lease_timeout);
  o.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  o.heartbeat_interval = absl::GetFlag(FLAGS_heartbeat_interval);
  o.heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout);
  o.tick_interval = absl::GetFlag(FLAGS_tick_interval);
  o.priority_preemption = absl::GetFlag(FLAGS_priority_preemption);
  o.min_runtime_before_preemption = absl::GetFlag(FLAGS_min_runtime_before_preemption);
  o.group_commit = absl::GetFlag(FLAGS_group_commit);
  o.drain_timeout = absl::GetFlag(FLAGS_drain_timeout);
  o.config = absl::GetFlag(FLAGS_config);
  o.address_file = absl::GetFlag(FLAGS_address_file);
  o.max_watch_streams_per_principal = absl::GetFlag(FLAGS_max_watch_streams_per_principal);
  o.max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams);
  o.max_experiment_watch_streams_per_principal =
      absl::GetFlag(FLAGS_max_experiment_watch_streams_per_principal);
  o.max_experiment_watch_streams = absl::GetFlag(FLAGS_max_experiment_watch_streams);
  o.watch_streams_reserved = absl::GetFlag(FLAGS_watch_streams_reserved);
  o.experiment_watch_streams_reserved = absl::GetFlag(FLAGS_experiment_watch_streams_reserved);
  o.max_worker_streams_per_principal = absl::GetFlag(FLAGS_max_worker_streams_per_principal);
  o.max_worker_streams = absl::GetFlag(FLAGS_max_worker_streams);
  o.job_metrics_retention = absl::GetFlag(FLAGS_job_metrics_retention);
  o.job_info_labels = absl::GetFlag(FLAGS_job_info_labels);
  o.moe_expert_series_max = absl::GetFlag(FLAGS_moe_expert_series_max);
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.client_ca = absl::GetFlag(FLAGS_client_ca);
  o.insecure = absl::GetFlag(FLAGS_insecure);
  o.auth_tokens = absl::GetFlag(FLAGS_auth_tokens);
  o.worker_tokens = absl::GetFlag(FLAGS_worker_tokens);
  o.jwt_jwks = absl::GetFlag(FLAGS_jwt_jwks);
  o.jwt_issuer = absl::GetFlag(FLAGS_jwt_issuer);
  o.jwt_audience = absl::GetFlag(FLAGS_jwt_audience);
  o.jwt_principal_claim = absl::GetFlag(FLAGS_jwt_principal_claim);
  o.jwt_tenant_claim = absl::GetFlag(FLAGS_jwt_tenant_claim);
  o.jwt_role_claim = absl::GetFlag(FLAGS_jwt_role_claim);
  o.jwt_max_lifetime = absl::GetFlag(FLAGS_jwt_max_lifetime);
  o.reflection = absl::GetFlag(FLAGS_reflection);
  o.metrics_tls_cert = absl::GetFlag(FLAGS_metrics_tls_cert);
  o.metrics_tls_key = absl::GetFlag(FLAGS_metrics_tls_key);
  o.data_roots = absl::GetFlag(FLAGS_data_roots);
  o.postgres_dsn_env = FlagOrEnv("", "TALLY_POSTGRES_DSN");
  return o;
}

int Refuse(const absl::Status& s) {
  spdlog::error("{}", std::string(s.message()));
  return 2;
}

// What tallyd reads from files and the environment before it serves; the
// first bad one refuses the start.
struct StartFiles {
  std::optional<wiring::PostgresSettings> postgres;
  api::DataRoots data_roots;
  api::Credentials credentials;
  config::TallydConfig config;
};

absl::StatusOr<StartFiles> ReadStartFiles(const config::TallydOptions& o) {
  StartFiles f;
  ASSIGN_OR_RETURN(f.postgres, wiring::LoadPostgresSettings(o));
  // A bad --address_file is refused before anything is served.
  if (!o.address_file.empty()) RETURN_IF_ERROR(wiring::CheckAddressFile(o.address_file));
  if (!o.tls_cert.empty()) {
    RETURN_IF_ERROR(api::CheckTlsFiles(o.tls_cert, o.tls_key, o.client_ca));
  }
  if (!o.metrics_tls_cert.empty()) {
    RETURN_IF_ERROR(api::CheckTlsFiles(o.metrics_tls_cert, o.metrics_tls_key, "",
                                       {"metrics_tls_cert", "metrics_tls_key", ""}));
  }
  std::error_code cwd_error;
  const std::filesystem::path cwd = std::filesystem::current_path(cwd_error);
  if (cwd_error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the working directory: ", cwd_error.message()));
  }
  ASSIGN_OR_RETURN(f.data_roots, api::DataRoots::Make(o.data_roots, cwd));
  if (f.data_roots.checking()) {
    spdlog::info("tallyd: datasets must lie under --data_roots {}", f.data_roots.Describe());
  }
  ASSIGN_OR_RETURN(f.credentials, wiring::LoadCredentials(o));
  spdlog::info("tallyd: gRPC {} on {}; users: {}; workers: {}",
               o.tls_cert.empty() ? "in plaintext" : "over TLS", o.listen,
               f.credentials.users_authenticated() ? "authenticated"
                                                   : "not authenticated (every caller is admin)",
               f.credentials.workers_authenticated()
                   ? (o.client_ca.empty() ? "worker tokens" : "client certificates or tokens")
                   : "not authenticated");
  ASSIGN_OR_RETURN(f.config, config::LoadTallydConfig(o.config));
  spdlog::info("tallyd: {}", f.config.prices.Describe());
  return f;
}

sched::SchedulerOptions SchedulerOptionsFrom(const config::TallydOptions& o,
                                             const config::TallydConfig& config) {
  sched::SchedulerOptions s;
  s.heartbeat_interval = o.heartbeat_interval;
  s.heartbeat_timeout = o.heartbeat_timeout;
  s.priority_preemption = o.priority_preemption;
  s.group_commit = o.group_commit;
  s.min_runtime_before_preemption = o.min_runtime_before_preemption;
  s.job_metrics.retention = o.job_metrics_retention;
  s.job_metrics.info_labels = o.job_info_labels;
  s.job_metrics.max_expert_series = o.moe_expert_series_max;
  s.prices = config.prices;
  s.quotas = config.quotas;
  s.cross_tenant_preemption = config.tenancy.cross_tenant_preemption;
  s.checkpoint_root = config.checkpoint_root;
  s.logs_keep_bytes = config.logs.keep_bytes();
  return s;
}

// What the Jobs and Experiments services share: who may call, where
// datasets must lie, the priority caps and the submit limiter.
struct Admission {
  const api::Gate* gate;
  const api::DataRoots* data_roots;  // null: no check
  const api::PriorityCaps* priority_caps;
  api::RateLimiter* submit_limiter;
};

// JobsService::Options or ExperimentsService::Options.
template <typename Options>
Options WatchServiceOptions(int64_t max_per_principal, int64_t max_streams, int64_t reserved,
                            const Admission& a) {
  Options s;
  s.max_watch_streams_per_principal = max_per_principal;
  s.max_watch_streams = max_streams;
  s.watch_streams_reserved = reserved;
  s.gate = a.gate;
  s.data_roots = a.data_roots;
  s.priority_caps = a.priority_caps;
  s.submit_limiter = a.submit_limiter;
  return s;
}

// Signals are taken by one thread with sigwait; block them everywhere first.
sigset_t BlockSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// tallyd's own series (beside the build info and the scheduler's).
struct ServerMetrics {
  metrics::Family<metrics::Counter>& credential_reload_failures;
  metrics::Gauge& leader;
};

ServerMetrics RegisterServerMetrics(metrics::Registry* registry) {
  auto& credential_reload_failures =
      metrics::BuildCounter()
          .Name("tally_credential_reload_failures_total")
          .Help("SIGHUP reloads that found a credentials file (file: auth_tokens, "
                "worker_tokens, jwt_jwks) bad; its credentials are refused until it is fixed")
          .Register(*registry);
  for (const char* file : {"auth_tokens", "worker_tokens", "jwt_jwks"}) {
    credential_reload_failures.Add({{"file", file}});
  }
  metrics::Gauge& leader_gauge =
      metrics::BuildGauge()
          .Name("tally_leader")
          .Help("1 while this tallyd leads (schedules, accepts workers, writes); 0 on a "
                "standby waiting for the lease (--store=postgres)")
          .Register(*registry)
          .Add({});
  return {credential_reload_failures, leader_gauge};
}

// What serving needs once the store is open; borrowed from Run.
struct Serving {
  const config::TallydOptions& options;
  const StartFiles& files;
  api::PriorityCaps& priority_caps;
  api::RateLimiter& submit_limiter;
  const sigset_t& signals;
  api::Frontend& frontend;
  grpc::Server& server;
  int grpc_port;
  const Clock& clock;
  metrics::Registry& registry;
  const ServerMetrics& server_metrics;
  const std::optional<metrics::HttpExporter::Tls>& metrics_tls;
  wiring::OpenedStore& opened;
};

// Ticks the scheduler every --tick_interval until `stop`. While the store
// refuses writes, one small write per tick finds out when it takes writes
// again (nothing else may write meanwhile).
std::thread StartTicker(api::Core& core, store::JobStore& store, absl::Duration every,
                        const std::atomic<bool>& stop) {
  return std::thread([&core, &store, every, &stop] {
    bool writes_failing = false;
    while (!stop.load()) {
      absl::Status s = core.Tick();
      if (!s.ok()) spdlog::error("scheduler tick: {}", std::string(s.message()));
      if (const store::WriteHealth* health = store.write_health(); health != nullptr) {
        if (std::optional<std::string> why = health->Failing(); why.has_value()) {
          if (!writes_failing) spdlog::error("/readyz: not ready: {}", *why);
          writes_failing = !store.ProbeWrite().ok();
          if (!writes_failing) spdlog::info("/readyz: the store takes writes again; ready");
        } else if (writes_failing) {
          writes_failing = false;
          spdlog::info("/readyz: the store takes writes again; ready");
        }
      }
      absl::SleepFor(every);
    }
  });
}

// Streams whose JWT or client certificate expired end here, off the
// scheduler's thread (each check admits every open stream again).
std::thread StartCredentialChecker(const api::Gate& gate, const Clock& clock,
                                   const std::atomic<bool>& stop) {
  return std::thread([&gate, &clock, &stop] {
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
}

// Makes this tallyd the one that serves (its gRPC server already passes
// calls to the leader's services): /metrics started (unless the standby
// started it) and ready, health SERVING, and the addresses printed and
// written to --address_file. Errors are a message to log before exiting
// with code 2.
absl::Status Announce(const Serving& s) {
  wiring::OpenedStore& opened = s.opened;
  if (opened.exporter == nullptr) {
    ASSIGN_OR_RETURN(opened.exporter, metrics::HttpExporter::Start(s.options.metrics_listen,
                                                                   &s.registry, s.metrics_tls));
  }
  // /readyz: not ready while the store refuses writes (a full disk), with
  // the reason; the ticker probes the store until writes succeed again.
  opened.exporter->SetReadinessCheck([&opened]() -> std::optional<std::string> {
    if (std::optional<std::string> lapse = opened.Lapse()) return lapse;
    const store::WriteHealth* health = opened.store->write_health();
    return health != nullptr ? health->Failing() : std::nullopt;
  });
  spdlog::info("tallyd: /metrics over {} on {}", s.metrics_tls ? "HTTPS" : "plain HTTP",
               s.options.metrics_listen);
  s.server.GetHealthCheckService()->SetServingStatus(true);
  s.server.GetHealthCheckService()->SetServingStatus(api::kLivenessService, true);
  opened.exporter->SetReady(true);
  s.server_metrics.leader.Set(1);
  const std::string addresses = absl::StrCat(
      "grpc=", config::HostOf(s.options.listen), ":", s.grpc_port,
      " metrics=", config::HostOf(s.options.metrics_listen), ":", opened.exporter->port());
  std::printf("tallyd serving %s\n", addresses.c_str());
  std::fflush(stdout);
  if (!s.options.address_file.empty()) {
    RETURN_IF_ERROR(wiring::WriteAddressFile(s.options.address_file, addresses));
  }
  return absl::OkStatus();
}

// After SIGTERM or SIGINT (or a lost lease): health first, so load
// balancers and probes stop sending work; then the loops, the core, the
// calls in flight, and the lease. Returns the exit code.
int Drain(const Serving& s, int sig, api::Core& core, grpc::Server& server,
          std::atomic<bool>& stop, std::thread& ticker, std::thread& credential_checker) {
  wiring::OpenedStore& opened = s.opened;
  const bool deposed = opened.lease_lost.load();
  if (!deposed) spdlog::info("tallyd: signal {}, draining", sig);
  server.GetHealthCheckService()->SetServingStatus(false);
  opened.exporter->SetReady(false);
  s.server_metrics.leader.Set(0);
  stop.store(true);
  ticker.join();
  credential_checker.join();
  core.Shutdown();
  // A deposed leader's calls would only fail at the fence: cut them short.
  server.Shutdown(std::chrono::system_clock::now() +
                  (deposed ? std::chrono::seconds(1)
                           : absl::ToChronoSeconds(s.options.drain_timeout)));
  if (opened.keeper != nullptr) {
    // Nothing more is written: hand the lease over now rather than after
    // --lease_timeout (stopping the keeper first, so no renewal follows).
    opened.keeper->Stop();
    if (deposed || opened.keeper->lost()) {
      spdlog::info("tallyd: stopped (deposed; exit code 3)");
      return 3;
    }
    if (absl::Status st = opened.lease->Release(opened.lease_epoch); st.ok()) {
      spdlog::info("tallyd: released the leader lease (epoch {})", opened.lease_epoch);
    } else {
      spdlog::warn("tallyd: could not release the leader lease (a standby takes over "
                   "within --lease_timeout): {}", std::string(st.message()));
    }
  }
  spdlog::info("tallyd: stopped");
  return 0;
}

// Serves until SIGTERM or SIGINT, reloading on SIGHUP, then drains.
int ServeUntilSignalled(const Serving& s, api::Core& core, api::Gate& gate,
                        grpc::Server& server) {
  std::atomic<bool> stop{false};
  std::thread ticker = StartTicker(core, *s.opened.store, s.options.tick_interval, stop);
  std::thread credential_checker = StartCredentialChecker(gate, s.clock, stop);
  // A SIGHUP a standby received is acted on now that it leads.
  if (s.opened.hup_while_standby) kill(getpid(), SIGHUP);
  int sig = 0;
  while (sigwait(&s.signals, &sig) == 0 && sig == SIGHUP) {
    wiring::Reload({gate, s.server_metrics.credential_reload_failures, s.options,
                    s.files.config, s.submit_limiter, s.priority_caps, core});
  }
  return Drain(s, sig, core, server, stop, ticker, credential_checker);
}

// Recovers the scheduler's state from the store, then serves as the leader.
int Lead(const Serving& s) {
  const config::TallydOptions& o = s.options;
  api::Core core(s.opened.store.get(), &s.clock, &s.registry,
                 SchedulerOptionsFrom(o, s.files.config));
  if (absl::Status st = core.Init(); !st.ok()) {
    spdlog::error("recovering state from the store: {}", std::string(st.message()));
    return s.opened.lease_lost.load() ? 3 : 1;
  }
  if (s.opened.lease_lost.load() || (s.opened.keeper != nullptr && s.opened.keeper->lost())) {
    // Deposed while recovering: never announce this tallyd as the leader.
    spdlog::error("tallyd: lost the leader lease while recovering; exiting with code 3");
    return 3;
  }
  api::Gate gate(&s.clock, s.files.credentials);
  const Admission admission{&gate, s.files.data_roots.checking() ? &s.files.data_roots : nullptr,
                            &s.priority_caps, &s.submit_limiter};
  api::JobsService jobs(&core, WatchServiceOptions<api::JobsService::Options>(
                                   o.max_watch_streams_per_principal, o.max_watch_streams,
                                   o.ReservedWatchStreams(), admission));
  api::ExperimentsService experiments(
      &core, WatchServiceOptions<api::ExperimentsService::Options>(
                 o.max_experiment_watch_streams_per_principal, o.max_experiment_watch_streams,
                 o.ReservedExperimentWatchStreams(), admission));
  api::WorkersService::Options workers_options;
  workers_options.max_streams_per_principal = o.max_worker_streams_per_principal;
  workers_options.max_streams = o.max_worker_streams;
  workers_options.gate = &gate;
  api::WorkersService workers(&core, workers_options);
  // From here on the server's calls reach the services above: it must be
  // shut down before they go (Drain does; so does a failed Announce).
  s.frontend.Serve(&jobs, &experiments, &workers);
  if (absl::Status st = Announce(s); !st.ok()) {
    s.server.Shutdown();
    return Refuse(st);
  }
  // While the lease has lapsed (PostgreSQL unreachable past
  // --lease_timeout) another tallyd may lead: every call is refused
  // UNAVAILABLE and every stream ended (workers and watchers reconnect to
  // whichever leads) until a renewal shows the lease is still this one's.
  struct LapseHandler {
    const Serving& s;
    ~LapseHandler() { s.opened.OnLapse(nullptr); }
  } uninstall{s};
  s.opened.OnLapse([&gate, &s](const std::optional<std::string>& why) {
    if (why.has_value()) {
      const int ended = gate.Suspend(absl::UnavailableError(absl::StrCat(
          "this tallyd's leader lease has lapsed (PostgreSQL could not be reached); it serves "
          "again once it renews the lease, or another tallyd leads: try again or the next "
          "address")));
      s.server.GetHealthCheckService()->SetServingStatus("", false);
      s.server_metrics.leader.Set(0);
      spdlog::warn("tallyd: refusing every call until the lease is renewed; ended {} streams",
                   ended);
    } else {
      gate.Resume();
      s.server.GetHealthCheckService()->SetServingStatus("", true);
      s.server_metrics.leader.Set(1);
    }
  });
  return ServeUntilSignalled(s, core, gate, s.server);
}

int Run(const config::TallydOptions& o) {
  if (absl::Status s = o.Validate(); !s.ok()) return Refuse(s);
  absl::StatusOr<StartFiles> files = ReadStartFiles(o);
  if (!files.ok()) return Refuse(files.status());
  api::PriorityCaps priority_caps(files->config.tenancy);
  api::RateLimiter submit_limiter({files->config.limits.submits_per_second,
                                   files->config.limits.submit_burst, "submits",
                                   "limits.submits_per_second", "limits.submit_burst"});
  const sigset_t signals = BlockSignals();
  std::shared_ptr<grpc::ServerCredentials> server_credentials = wiring::ServerCredentials(o);
  RealClock clock;
  metrics::Registry registry;
  metrics::RegisterBuildInfo(&registry);
  const ServerMetrics server_metrics = RegisterServerMetrics(&registry);
  std::optional<metrics::HttpExporter::Tls> metrics_tls;
  if (!o.metrics_tls_cert.empty()) {
    metrics_tls = metrics::HttpExporter::Tls{o.metrics_tls_cert, o.metrics_tls_key};
  }
  // Bound once, before the store opens: until Lead() serves, every call is
  // refused UNAVAILABLE (a standby's names the leader).
  api::Frontend frontend("tallyd is starting: recovering its state from the store");
  absl::StatusOr<wiring::GrpcServer> grpc = wiring::StartGrpcServer(
      {o.listen, server_credentials, files->config.grpc_server, o.reflection, &registry, &clock},
      &frontend);
  if (!grpc.ok()) return Refuse(grpc.status());
  absl::StatusOr<std::unique_ptr<wiring::OpenedStore>> opened = wiring::OpenStore(
      {o, files->postgres, &frontend, grpc->port, &registry, metrics_tls, signals});
  if (!opened.ok()) return Refuse(opened.status());
  if (*opened == nullptr) return 0;  // a standby stopped by a signal
  return Lead({o, *files, priority_caps, submit_limiter, signals, frontend, *grpc->server,
               grpc->port, clock, registry, server_metrics, metrics_tls, **opened});
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
  return tally::Run(tally::OptionsFromFlags());
}
