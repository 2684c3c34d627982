// What a worker's LogBatch (workers.proto) may hold, checked before a line
// is stored: the batch's limits (common/log_lines.h), each line's level,
// source, time and text. Pure: INVALID_ARGUMENT naming the field, or OK.
#ifndef TALLY_SERVER_SCHED_LOG_REPORT_CHECKS_H_
#define TALLY_SERVER_SCHED_LOG_REPORT_CHECKS_H_

#include "absl/status/status.h"
#include "tally/v1/workers.pb.h"

namespace tally::sched {

absl::Status CheckLogBatch(const tally::v1::LogBatch& batch);

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_LOG_REPORT_CHECKS_H_
