// The one mapping between absl::Status and grpc::Status.
#ifndef TALLY_COMMON_GRPC_STATUS_H_
#define TALLY_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace tally {

grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace tally

#endif  // TALLY_COMMON_GRPC_STATUS_H_
