// tallyd: parse flags, open the store, serve Jobs and Workers over gRPC and
// /metrics over HTTP, tick the scheduler, drain on SIGTERM.
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "server/api/core.h"
#include "server/api/services.h"
#include "server/config/tallyd_config.h"
#include "server/metrics/build_info.h"
#include "server/metrics/http_exporter.h"
#include "server/metrics/job_metrics.h"
#include "server/store/memory_job_store.h"
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
          "job store: sqlite (durable, default) or memory (lost on exit)");
ABSL_FLAG(absl::Duration, heartbeat_interval, absl::Seconds(2),
          "how often workers are told to send heartbeats");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10),
          "a worker silent this long loses its attempts (they are requeued)");
ABSL_FLAG(absl::Duration, tick_interval, absl::Milliseconds(200),
          "how often the scheduler places queued jobs and checks heartbeats");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(5),
          "on SIGTERM, how long in-flight calls get to finish");
ABSL_FLAG(std::string, config, "",
          "YAML file with prices and throughputs (usd_per_gpu_hour, "
          "flops_per_second_per_gpu; see examples/tallyd.yaml); re-read on SIGHUP. "
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
ABSL_FLAG(absl::Duration, job_metrics_retention, absl::Minutes(15),
          "how long an ended job's per-job series keep their final values (with its terminal "
          "state on tally_job_info) before they are removed; 0 removes them when it ends");
ABSL_FLAG(std::vector<std::string>, job_info_labels, {},
          "comma-separated spec label keys exported on tally_job_info as label_<key> (at most "
          "8), e.g. team,project; each adds a label to every job's info series");
ABSL_FLAG(int32_t, moe_expert_series_max, 256,
          "per-expert series (tally_job_moe_expert_tokens) one job may have, all layers "
          "together; a larger model publishes only the per-layer load summary");

namespace tally {
namespace {

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

  const std::string config_path = absl::GetFlag(FLAGS_config);
  auto config = config::LoadTallydConfig(config_path);
  if (!config.ok()) {
    spdlog::error("{}", std::string(config.status().message()));
    return 2;
  }
  options.prices = config->prices;
  spdlog::info("tallyd: {}", options.prices.Describe());

  // Signals are taken by one thread with sigwait; block them everywhere first.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<store::JobStore> store;
  const std::string kind = absl::GetFlag(FLAGS_store);
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
    spdlog::error("--store: must be sqlite or memory, got \"{}\"", kind);
    return 2;
  }

  RealClock clock;
  metrics::Registry registry;
  metrics::RegisterBuildInfo(&registry);
  api::Core core(store.get(), &clock, &registry, options);
  if (absl::Status s = core.Init(); !s.ok()) {
    spdlog::error("recovering state from the store: {}", std::string(s.message()));
    return 1;
  }

  api::JobsService jobs(&core, jobs_options);
  api::ExperimentsService experiments(&core, experiments_options);
  api::WorkersService workers(&core);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int grpc_port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &grpc_port);
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
  auto exporter = metrics::HttpExporter::Start(metrics_listen, &registry);
  if (!exporter.ok()) {
    spdlog::error("{}", std::string(exporter.status().message()));
    server->Shutdown();
    return 2;
  }
  server->GetHealthCheckService()->SetServingStatus(true);

  const std::string addresses =
      absl::StrCat("grpc=", HostOf(listen), ":", grpc_port, " metrics=",
                   HostOf(metrics_listen), ":", (*exporter)->port());
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
    while (!stop.load()) {
      absl::Status s = core.Tick();
      if (!s.ok()) spdlog::error("scheduler tick: {}", std::string(s.message()));
      absl::SleepFor(every);
    }
  });

  int sig = 0;
  while (sigwait(&signals, &sig) == 0 && sig == SIGHUP) {
    // Reload prices; a bad file keeps the old ones.
    if (config_path.empty()) {
      spdlog::warn("SIGHUP: no --config to reload");
      continue;
    }
    auto reloaded = config::LoadTallydConfig(config_path);
    if (!reloaded.ok()) {
      spdlog::error("SIGHUP: {}; keeping the previous prices",
                    std::string(reloaded.status().message()));
      continue;
    }
    spdlog::info("SIGHUP: reloaded {}", reloaded->prices.Describe());
    core.Run([&](sched::Scheduler& s) {
      s.SetPrices(reloaded->prices);
      return 0;
    });
  }
  spdlog::info("tallyd: signal {}, draining", sig);
  // Health first, so load balancers and probes stop sending work.
  server->GetHealthCheckService()->SetServingStatus(false);
  stop.store(true);
  ticker.join();
  core.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(absl::GetFlag(FLAGS_drain_timeout)));
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
