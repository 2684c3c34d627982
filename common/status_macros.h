// RETURN_IF_ERROR / ASSIGN_OR_RETURN for absl::Status and absl::StatusOr<T>.
// Debian's Abseil (20220623) does not ship its own status macros.
#ifndef TALLY_COMMON_STATUS_MACROS_H_
#define TALLY_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TALLY_CONCAT_INNER_(a, b) a##b
#define TALLY_CONCAT_(a, b) TALLY_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status tally_status_ = (expr);       \
    if (!tally_status_.ok()) return tally_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL_(TALLY_CONCAT_(tally_statusor_, __LINE__), lhs, expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // TALLY_COMMON_STATUS_MACROS_H_
