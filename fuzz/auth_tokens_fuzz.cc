// Fuzzes TokenTable::Parse (server/auth/token_file.h): what tallyd does with
// the --auth_tokens and --worker_tokens files. The input is the file's text,
// read once as a users file and once as a workers file; each table that
// reads is then asked for a few tokens (the seeds' entries hash them).
//
// Beyond "no crash, no sanitizer report" it checks:
// - a rejected file is INVALID_ARGUMENT with a message starting with the
//   source name;
// - no file with principals reads as both kinds (their roles are disjoint);
// - a principal Find returns is one the file's rules allow: method "token",
//   a non-empty name, a role of the file's kind, a tenant for a user or
//   viewer and none for a worker.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/auth/token_file.h"

namespace {

using tally::auth::Principal;
using tally::auth::Role;
using tally::auth::TokenTable;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "auth_tokens_fuzz: invariant violated: %s\n",
               what.c_str());
  std::abort();
}

// The seeds hold the SHA-256 of these.
constexpr absl::string_view kTokens[] = {"alice-secret", "ops-secret",
                                         "worker-1-secret", "", "x"};

void CheckPrincipal(const Principal& p, TokenTable::Kind kind) {
  if (p.method != "token") Fail("method is not \"token\": " + p.method);
  if (p.name.empty()) Fail("a principal without a name");
  if (kind == TokenTable::Kind::kWorkers) {
    if (p.role != Role::kWorker) Fail("a workers file gave a non-worker");
    if (!p.tenant.empty()) Fail("a worker with a tenant");
    return;
  }
  if (p.role == Role::kWorker) Fail("a users file gave a worker");
  if ((p.role == Role::kUser || p.role == Role::kViewer) && p.tenant.empty()) {
    Fail("a user or viewer without a tenant");
  }
}

std::optional<TokenTable> ParseAndCheck(absl::string_view text,
                                        TokenTable::Kind kind) {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(text, kind, "fuzz.yaml");
  if (!table.ok()) {
    if (table.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("a rejected file is not INVALID_ARGUMENT: " +
           table.status().ToString());
    }
    if (table.status().message().substr(0, 11) != "fuzz.yaml: ") {
      Fail("a rejection does not name the source: " +
           table.status().ToString());
    }
    return std::nullopt;
  }
  size_t found = 0;
  for (absl::string_view token : kTokens) {
    if (std::optional<Principal> p = table->Find(token)) {
      CheckPrincipal(*p, kind);
      ++found;
    }
  }
  if (table->Find("").has_value()) Fail("the empty token was accepted");
  if (found > table->size()) Fail("more tokens found than principals");
  return *std::move(table);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  std::optional<TokenTable> users =
      ParseAndCheck(text, TokenTable::Kind::kUsers);
  std::optional<TokenTable> workers =
      ParseAndCheck(text, TokenTable::Kind::kWorkers);
  if (users.has_value() && workers.has_value() &&
      (users->size() > 0 || workers->size() > 0)) {
    Fail("a file with principals reads both as a users and a workers file");
  }
  return 0;
}
