// Bearer tokens for tallyd: the files named by --auth_tokens (users) and
// --worker_tokens (workers). A file lists principals with the SHA-256 of
// their token, never the token itself:
//
//   principals:
//     - {name: alice, tenant: research, role: user, token_sha256: "<64 hex>"}
//     - {name: ops, tenant: "", role: admin, token_sha256: "<64 hex>"}
//
// (the hash of a token: printf %s TOKEN | sha256sum). The message behind it is
// tally.v1.TokenFile (proto/tally/v1/auth_config.proto), read by the job
// spec's hardened YAML reader (common/spec_yaml.h): one document, no anchors
// or aliases, bounded size and depth, no key given twice, unknown fields
// refused, line numbers in errors.
//
// Then every entry is checked (principals[i].field named in the message):
// - role: admin, user or viewer in a users file; worker in a workers file;
// - name: 1 to kMaxPrincipalFieldBytes bytes of printable UTF-8, unique in
//   the file; for a worker, the worker id its token may use;
// - tenant: printable, at most kMaxPrincipalFieldBytes bytes; required for
//   user and viewer; an admin with a tenant acts only within it, and only an
//   admin with "" is global (every tenant); must be empty or absent for a
//   worker;
// - token_sha256: exactly 64 hex digits in either case, unique in the file,
//   and not the hash of the empty string.
// An empty file or an empty principals list is a valid, empty table: no
// token is accepted.
//
// A TokenTable is immutable once built; Find is thread-safe.
#ifndef TALLY_SERVER_AUTH_TOKEN_FILE_H_
#define TALLY_SERVER_AUTH_TOKEN_FILE_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/auth/principal.h"

namespace tally::auth {

class TokenTable {
 public:
  enum class Kind { kUsers, kWorkers };

  // Reads and checks a token file's text. `source` (the path) starts every
  // error message. Every error is INVALID_ARGUMENT.
  static absl::StatusOr<TokenTable> Parse(absl::string_view yaml, Kind kind,
                                          absl::string_view source);

  // Parse on the file at `path`. NOT_FOUND when it cannot be read.
  static absl::StatusOr<TokenTable> Load(const std::string& path, Kind kind);

  // The principal whose token_sha256 is SHA-256(token), with method "token";
  // nullopt for an unknown or empty token. Digests are compared in constant
  // time (CRYPTO_memcmp), against every entry whatever matches.
  std::optional<Principal> Find(absl::string_view token) const;

  // The number of principals.
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::array<uint8_t, 32> digest;
    Principal principal;
  };

  explicit TokenTable(std::vector<Entry> entries)
      : entries_(std::move(entries)) {}

  std::vector<Entry> entries_;
};

}  // namespace tally::auth

#endif  // TALLY_SERVER_AUTH_TOKEN_FILE_H_
