// Bearer tokens for tallyd: making one, and the entry of tallyd's token file
// that admits it. tallyd keeps only each token's SHA-256, so a leaked token
// file grants nothing.
//
// A token is 32 bytes from OpenSSL's CSPRNG (RAND_bytes), written as 64
// lowercase hex characters: safe in a shell, a file or a header, and easy to
// tell apart from a truncated copy. Its hash is the SHA-256 of those 64
// characters as sent (not of the raw bytes), in lowercase hex.
//
// All functions are thread-safe.
#ifndef TALLY_CLI_TALLYCTL_TOKENS_H_
#define TALLY_CLI_TALLYCTL_TOKENS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally::cli {

inline constexpr int kTokenRandomBytes = 32;

// Who a token speaks for: one entry of tallyd's token file (--auth_tokens
// for admin, user and viewer; --worker_tokens for worker, whose name is the
// worker id the token may use).
struct TokenEntry {
  std::string name;    // the principal, e.g. "alice"
  std::string tenant;  // required for the user and viewer roles
  std::string role;    // admin, user, viewer or worker
  std::string token_sha256;
};

// A fresh token (see above). INTERNAL when the CSPRNG fails.
absl::StatusOr<std::string> NewToken();

// The token that `bytes` spell (lowercase hex of each byte).
std::string TokenFromBytes(absl::string_view bytes);

// The lowercase hex SHA-256 of `token`'s bytes.
std::string TokenSha256Hex(absl::string_view token);

// INVALID_ARGUMENT, naming the flag, unless: the role is admin, user, viewer
// or worker; user and viewer have a tenant and a worker has none (as tallyd's
// token files require: server/auth/token_file.h); name (required) and tenant
// (when given) are plain words that read back as themselves in YAML (a letter
// or digit, then letters, digits, '.', '_', '-' or '@', at most 128, and
// neither a number nor a YAML keyword such as true or null).
absl::Status ValidateTokenEntry(const TokenEntry& entry);

// The entry as one line of tallyd's token file, e.g.
//   - {name: alice, tenant: research, role: user, token_sha256: "ab12..."}
// (two leading spaces; an empty tenant is written "").
std::string TokenEntryYaml(const TokenEntry& entry);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_TOKENS_H_
