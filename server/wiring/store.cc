#include "server/wiring/store.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/api/frontend.h"
#include "server/ha/await_lease.h"
#include "server/ha/dsn.h"
#include "server/store/memory_job_store.h"
#include "server/store/postgres_job_store.h"
#include "server/store/sqlite_job_store.h"
#include "server/wiring/address_file.h"
#include "spdlog/spdlog.h"

namespace tally::wiring {
namespace {

// What standbys name as the leader: --advertise_address, else the bound
// --listen address (the hostname when it listens on every interface).
std::string LeaseHolder(const PostgresSettings& p, const std::string& listen, int port) {
  if (!p.advertise_address.empty()) return p.advertise_address;
  std::string host = config::HostOf(listen);
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

absl::StatusOr<std::unique_ptr<store::JobStore>> OpenSqlite(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data_dir: cannot create ", dir, ": ", ec.message()));
  }
  ASSIGN_OR_RETURN(auto opened,
                   store::SqliteJobStore::Open((std::filesystem::path(dir) / "tally.db").string()));
  return std::unique_ptr<store::JobStore>(std::move(opened));
}

// What a standby's calls are refused with, naming the leader.
std::string StandbyRefusal(const std::string& leader) {
  return absl::StrCat("this tallyd is a standby; the leader is ", leader);
}

// The standby's /metrics, and --address_file naming it and the gRPC port;
// returns the addresses ("grpc=... metrics=...").
absl::StatusOr<std::string> StartStandby(const StoreInputs& in, OpenedStore* out) {
  in.frontend->SetRefusal(StandbyRefusal("not known yet (this tallyd is still reading the lease)"));
  const std::string grpc_address =
      absl::StrCat(config::HostOf(in.options.listen), ":", in.grpc_port);
  ASSIGN_OR_RETURN(out->exporter, metrics::HttpExporter::Start(in.options.metrics_listen,
                                                               in.registry, in.metrics_tls));
  const std::string addresses =
      absl::StrCat("grpc=", grpc_address, " metrics=", config::HostOf(in.options.metrics_listen),
                   ":", out->exporter->port());
  if (!in.options.address_file.empty()) {
    RETURN_IF_ERROR(WriteAddressFile(in.options.address_file, addresses));
  }
  return addresses;
}

// Renews the lease from now on; a lapse is reported (OpenedStore::SetLapse)
// and losing it stops this tallyd with code 3.
void KeepLease(const PostgresSettings& pg, const ha::Acquired& acquired,
               store::PostgresJobStore* fenced, OpenedStore* out) {
  ha::LeaseKeeper::Options keep;
  keep.lease_timeout = pg.lease_timeout;
  keep.must_restart = [fenced] { return fenced->MustRestart(); };
  std::atomic<bool>& lease_lost = out->lease_lost;
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
  keep.on_lapsed = [out](const std::string& why) {
    spdlog::error("tallyd: {}", why);
    out->SetLapse(why);
  };
  keep.on_restored = [out] {
    spdlog::info("tallyd: renewed the leader lease after its lapse: still the leader, serving "
                 "again");
    out->SetLapse(std::nullopt);
  };
  out->keeper = std::make_unique<ha::LeaseKeeper>(out->lease.get(), out->lease_epoch,
                                                  acquired.sent, std::move(keep));
}

// Serves as a standby until the lease is ours, then fences and opens the
// store. False when a signal stopped the standby first.
absl::StatusOr<bool> LeadOnPostgres(const StoreInputs& in, const PostgresSettings& pg,
                                    OpenedStore* out) {
  ASSIGN_OR_RETURN(const std::string addresses, StartStandby(in, out));
  const std::string holder = LeaseHolder(pg, in.options.listen, in.grpc_port);
  spdlog::info("tallyd: standby {} on PostgreSQL {}, waiting for the leader lease "
               "(--lease_timeout={})",
               addresses, ha::RedactDsn(pg.dsn), absl::FormatDuration(pg.lease_timeout));
  out->lease = std::make_unique<ha::LeaderLease>(pg.dsn, holder, pg.lease_timeout);
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
  await.wait = [&](absl::Duration d) {
    return WaitForSignal(in.signals, d, &out->hup_while_standby);
  };
  await.on_leader = [&](const std::string& leader) {
    in.frontend->SetRefusal(StandbyRefusal(leader));
  };
  ASSIGN_OR_RETURN(std::optional<ha::Acquired> acquired, ha::AwaitLease(out->lease.get(), await));
  if (!acquired.has_value()) {
    spdlog::info("tallyd: standby stopped by a signal");
    return false;
  }
  out->lease_epoch = acquired->epoch;
  // Fenced before recovery: from here on no write commits unless the
  // lease row still carries this epoch.
  opened->SetFencingEpoch(out->lease_epoch);
  KeepLease(pg, *acquired, opened.get(), out);
  spdlog::info("tallyd: took the leader lease (epoch {}, holder {}); recovering state",
               out->lease_epoch, holder);
  in.frontend->SetRefusal(StandbyRefusal(
      absl::StrCat(holder, " (epoch ", out->lease_epoch, "): this tallyd, recovering its state")));
  out->store = std::move(opened);
  return true;
}

}  // namespace

void OpenedStore::SetLapse(std::optional<std::string> why) {
  absl::MutexLock lock(&lapse_mu_);
  lapse_ = std::move(why);
  if (on_lapse_) on_lapse_(lapse_);
}

void OpenedStore::OnLapse(std::function<void(const std::optional<std::string>&)> fn) {
  absl::MutexLock lock(&lapse_mu_);
  on_lapse_ = std::move(fn);
  if (on_lapse_ && lapse_.has_value()) on_lapse_(lapse_);
}

std::optional<std::string> OpenedStore::Lapse() const {
  absl::MutexLock lock(&lapse_mu_);
  return lapse_;
}

absl::StatusOr<std::optional<PostgresSettings>> LoadPostgresSettings(
    const config::TallydOptions& options) {
  if (options.store != "postgres") return std::nullopt;
  PostgresSettings p;
  ASSIGN_OR_RETURN(p.dsn, ha::ResolveDsn({options.postgres_dsn, options.postgres_dsn_file,
                                          options.postgres_dsn_env}));
  p.lease_timeout = options.lease_timeout;
  if (p.lease_timeout < absl::Seconds(6)) {
    spdlog::warn("--lease_timeout={}: shorter than 6s, one reconnect to PostgreSQL (up to 2 s) "
                 "can outlast a renewal, and the leader then stops serving on a brief "
                 "database blip until it renews; 10s or more suits production",
                 absl::FormatDuration(p.lease_timeout));
  }
  p.advertise_address = options.advertise_address;
  return p;
}

absl::StatusOr<std::unique_ptr<OpenedStore>> OpenStore(const StoreInputs& in) {
  auto out = std::make_unique<OpenedStore>();
  if (in.options.store == "memory") {
    out->store = std::make_unique<store::InMemoryJobStore>();
  } else if (in.options.store == "sqlite") {
    ASSIGN_OR_RETURN(out->store, OpenSqlite(in.options.data_dir));
  } else {
    ASSIGN_OR_RETURN(const bool leads, LeadOnPostgres(in, *in.postgres, out.get()));
    if (!leads) return nullptr;
  }
  return out;
}

}  // namespace tally::wiring
