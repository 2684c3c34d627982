// tallyd's job store, as --store names it: in memory, SQLite under
// --data_dir, or PostgreSQL shared by a leader and standbys. With
// PostgreSQL this tallyd serves as a standby (health NOT_SERVING, every call
// UNAVAILABLE naming the leader, /readyz 503) until it holds the leader
// lease; see server/ha/leader_lease.h for the protocol. The gRPC server is
// already bound (server/wiring/grpc_server.h): a standby only sets what its
// api::Frontend refuses calls with.
#ifndef TALLY_SERVER_WIRING_STORE_H_
#define TALLY_SERVER_WIRING_STORE_H_

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/config/tallyd_options.h"
#include "server/ha/leader_lease.h"
#include "server/metrics/http_exporter.h"
#include "server/metrics/registry.h"
#include "server/store/job_store.h"

namespace tally::api {
class Frontend;
}  // namespace tally::api

namespace tally::wiring {

// --store=postgres: the DSN and lease settings, read before anything is
// served.
struct PostgresSettings {
  std::string dsn;
  absl::Duration lease_timeout;
  std::string advertise_address;
};

// nullopt unless --store=postgres; else the DSN from --postgres_dsn,
// --postgres_dsn_file or $TALLY_POSTGRES_DSN (errors name the flag), and a
// warning logged for a short --lease_timeout. Expects options that passed
// Validate().
absl::StatusOr<std::optional<PostgresSettings>> LoadPostgresSettings(
    const config::TallydOptions& options);

// What opening the store needs; borrowed, must outlive the call.
struct StoreInputs {
  const config::TallydOptions& options;
  const std::optional<PostgresSettings>& postgres;
  // The gRPC server's services and the port it bound.
  api::Frontend* frontend;
  int grpc_port;
  metrics::Registry* registry;
  std::optional<metrics::HttpExporter::Tls> metrics_tls;
  // SIGTERM, SIGINT and SIGHUP, blocked: a standby waits for them.
  const sigset_t& signals;
};

// The open store and, with --store=postgres, the lease that fences it and
// the /metrics server the standby started. Members are destroyed in reverse
// order: the keeper's threads stop before what they use goes.
struct OpenedStore {
  // Started by a standby (null otherwise: start it once serving).
  std::unique_ptr<metrics::HttpExporter> exporter;
  // A SIGHUP the standby received, to act on once it leads.
  bool hup_while_standby = false;
  std::unique_ptr<store::JobStore> store;
  // Held only with --store=postgres: the lease and its keeper. lease_lost is
  // set (and SIGTERM raised) when the keeper loses the lease.
  std::atomic<bool> lease_lost{false};
  int64_t lease_epoch = 0;
  std::unique_ptr<ha::LeaderLease> lease;
  std::unique_ptr<ha::LeaseKeeper> keeper;

  // A lapse of the lease (ha::LeaseKeeper: not renewed in time, the
  // database unreachable): its reason while it lasts. The keeper reports
  // it from its thread; the leader installs what to do with OnLapse (stop
  // serving, then serve again), told at once of a lapse already under way.
  void SetLapse(std::optional<std::string> why);
  void OnLapse(std::function<void(const std::optional<std::string>&)> fn);
  std::optional<std::string> Lapse() const;

 private:
  mutable absl::Mutex lapse_mu_;
  std::optional<std::string> lapse_ ABSL_GUARDED_BY(lapse_mu_);
  std::function<void(const std::optional<std::string>&)> on_lapse_ ABSL_GUARDED_BY(lapse_mu_);
};

// Opens the store. With --store=postgres: serves as a standby, writes
// --address_file, waits for the lease, fences the store with its epoch and
// keeps the lease renewed (a lapse is reported through SetLapse; losing it
// logs, raises SIGTERM, and exits with code 3 if draining takes over 5 s). Null when a signal stopped the standby
// before it led. Errors are a message to log before exiting with code 2.
absl::StatusOr<std::unique_ptr<OpenedStore>> OpenStore(const StoreInputs& in);

}  // namespace tally::wiring

#endif  // TALLY_SERVER_WIRING_STORE_H_
