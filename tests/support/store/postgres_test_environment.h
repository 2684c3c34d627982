// One PostgresServer per test binary, started on first use and stopped when
// the binary's tests end (a gtest Environment), so tests that never touch
// PostgreSQL do not pay for initdb. Each test takes a fresh database.
#ifndef TALLY_TESTS_SUPPORT_STORE_POSTGRES_TEST_ENVIRONMENT_H_
#define TALLY_TESTS_SUPPORT_STORE_POSTGRES_TEST_ENVIRONMENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "tests/support/store/postgres_server.h"

namespace tally::store::testing {

class PostgresTestEnvironment : public ::testing::Environment {
 public:
  // The shared server, starting it on the first call. A failure (no
  // PostgreSQL binaries, say) is remembered and returned to every caller.
  static absl::StatusOr<PostgresServer*> Server() {
    State& s = state();
    if (!s.tried) {
      s.tried = true;
      auto server = PostgresServer::Start();
      if (server.ok()) {
        s.server = std::move(*server);
      } else {
        s.error = server.status();
      }
    }
    if (s.server == nullptr) return s.error;
    return s.server.get();
  }

  // A fresh database on the shared server; its DSN.
  static absl::StatusOr<std::string> NewDatabase() {
    absl::StatusOr<PostgresServer*> server = Server();
    if (!server.ok()) return server.status();
    return (*server)->CreateDatabase();
  }

  void TearDown() override { state().server.reset(); }

 private:
  struct State {
    bool tried = false;
    std::unique_ptr<PostgresServer> server;
    absl::Status error;
  };
  static State& state() {
    static State* s = new State;
    return *s;
  }
};

// Registers the environment once per binary; call from a namespace-scope
// initializer in each test file that uses it.
inline bool RegisterPostgresTestEnvironment() {
  static const bool registered = [] {
    ::testing::AddGlobalTestEnvironment(new PostgresTestEnvironment);
    return true;
  }();
  return registered;
}

}  // namespace tally::store::testing

#endif  // TALLY_TESTS_SUPPORT_STORE_POSTGRES_TEST_ENVIRONMENT_H_
