// Who a caller is, once authenticated: a name, the tenant it acts in and its
// role. TokenTable (token_file.h) and JwtVerifier (jwt.h) produce them; the
// gRPC server decides from them what a call may do.
//
// All functions are pure and thread-safe.
#ifndef TALLY_SERVER_AUTH_PRINCIPAL_H_
#define TALLY_SERVER_AUTH_PRINCIPAL_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally::auth {

enum class Role {
  kViewer,  // reads its tenant's jobs and experiments
  kUser,    // submits and manages its tenant's jobs and experiments
  // With a tenant: what a user may do, on every job and experiment of that
  // tenant and nothing of any other (another tenant's objects are NOT_FOUND,
  // exactly as missing ones). With tenant "": a global admin, everything in
  // every tenant. Only a global admin is global (api::IsGlobalAdmin).
  kAdmin,
  kWorker,  // a tally-worker process; speaks the Workers protocol only
};

// "viewer", "user", "admin", "worker".
absl::string_view RoleName(Role role);

// The role named exactly (lower case) as RoleName writes it; INVALID_ARGUMENT
// listing the names otherwise.
absl::StatusOr<Role> ParseRole(absl::string_view name);

// The longest principal name or tenant accepted, in bytes, from a token file
// or a JWT claim.
inline constexpr size_t kMaxPrincipalFieldBytes = 128;

struct Principal {
  std::string name;    // "alice"; for a worker: the worker id it may use
  // The one tenant it acts in; "" only for a global admin (every tenant) and
  // for workers. A non-empty tenant bounds an admin too.
  std::string tenant;
  Role role = Role::kViewer;
  // How it was authenticated: "token", "jwt", "certificate", "anonymous".
  std::string method;
};

}  // namespace tally::auth

#endif  // TALLY_SERVER_AUTH_PRINCIPAL_H_
