// PostgresServer: a throwaway PostgreSQL server for tests. Start() runs
// Debian's initdb into a fresh temp dir and starts postgres on a free
// 127.0.0.1 port with its unix socket in that dir, trust authentication and a
// superuser named "tally". fsync stays on: tests exercise the real thing.
// PostgreSQL refuses to run as root, so when the test runs as root (CI),
// initdb and pg_ctl run as user `nobody` and the temp dir is owned by it.
//
// The binaries are read from $TALLY_POSTGRES_BIN_DIR, else
// /usr/lib/postgresql/15/bin; if they are missing, Start() says to run
// scripts/setup.sh.
//
// A watchdog child process stops the server and removes the dir if the test
// process dies without running the destructor (a crash, a ctest timeout).
//
// Not thread-safe: one thread drives Stop()/Start_()/Restart(); Dsn() and
// CreateDatabase() may be called from any thread while the server runs.
#ifndef TALLY_TESTS_SUPPORT_STORE_POSTGRES_SERVER_H_
#define TALLY_TESTS_SUPPORT_STORE_POSTGRES_SERVER_H_

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tally::store::testing {

class PostgresServer {
 public:
  // initdb into a fresh temp dir and start the server.
  static absl::StatusOr<std::unique_ptr<PostgresServer>> Start();
  // pg_ctl stop -m immediate, then removes the temp dir.
  ~PostgresServer();
  PostgresServer(const PostgresServer&) = delete;
  PostgresServer& operator=(const PostgresServer&) = delete;

  // A libpq keyword/value DSN for `dbname` over TCP on 127.0.0.1.
  std::string Dsn(const std::string& dbname = "postgres") const;
  // Creates a fresh, empty database and returns its DSN.
  absl::StatusOr<std::string> CreateDatabase();

  // Fast stop (pg_ctl stop -m fast): clients are disconnected.
  absl::Status Stop();
  // Starts the stopped server again on the same port with the same data.
  absl::Status Start_();
  absl::Status Restart();

  int port() const { return port_; }
  const std::string& dir() const { return dir_; }

 private:
  PostgresServer(std::string bin_dir, std::string dir, int port)
      : bin_dir_(std::move(bin_dir)), dir_(std::move(dir)), port_(port) {}
  // Runs bin_dir_/tool with `args` (as nobody when root); on failure the
  // error includes the tool's output.
  absl::Status RunTool(const std::string& tool, const std::vector<std::string>& args);
  // A child that waits for this process to die (its pipe to close) and then
  // stops the server and removes the dir, so a crashed or killed test leaves
  // no server behind.
  absl::Status StartWatchdog();

  const std::string bin_dir_;
  const std::string dir_;
  int port_;
  bool running_ = false;
  pid_t watchdog_pid_ = -1;
  int watchdog_fd_ = -1;  // write end of the watchdog's pipe
  std::atomic<int> next_db_{0};
};

}  // namespace tally::store::testing

#endif  // TALLY_TESTS_SUPPORT_STORE_POSTGRES_SERVER_H_
