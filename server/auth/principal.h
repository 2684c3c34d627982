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
  kViewer,  // reads its tenant's jobs
  kUser,    // submits and manages its tenant's jobs
  kAdmin,   // everything, in its tenant or (tenant "") in every tenant
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
  std::string tenant;  // "" for an admin means every tenant; workers: ""
  Role role = Role::kViewer;
  // How it was authenticated: "token", "jwt", "certificate", "anonymous".
  std::string method;
};

}  // namespace tally::auth

#endif  // TALLY_SERVER_AUTH_PRINCIPAL_H_
