#include "server/auth/principal.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace tally::auth {

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kViewer:
      return "viewer";
    case Role::kUser:
      return "user";
    case Role::kAdmin:
      return "admin";
    case Role::kWorker:
      return "worker";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role role : {Role::kViewer, Role::kUser, Role::kAdmin, Role::kWorker}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role ", QuoteForMessage(name),
                   "; use one of admin, user, viewer, worker"));
}

}  // namespace tally::auth
