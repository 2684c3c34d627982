// absl::Time <-> google.protobuf.Timestamp, for tallyd's records.
#ifndef TALLY_COMMON_PROTO_TIME_H_
#define TALLY_COMMON_PROTO_TIME_H_

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"
#include "google/protobuf/util/time_util.h"

namespace tally {

inline google::protobuf::Timestamp ToProto(absl::Time t) {
  return google::protobuf::util::TimeUtil::NanosecondsToTimestamp(absl::ToUnixNanos(t));
}

inline absl::Time FromProto(const google::protobuf::Timestamp& ts) {
  return absl::FromUnixNanos(google::protobuf::util::TimeUtil::TimestampToNanoseconds(ts));
}

}  // namespace tally

#endif  // TALLY_COMMON_PROTO_TIME_H_
