// What a JobStore answers about a job's log lines (LogLine, jobs.proto):
// the filters of a read. Appends follow server/logs/log_retention.h.
#ifndef TALLY_SERVER_STORE_JOB_LOGS_H_
#define TALLY_SERVER_STORE_JOB_LOGS_H_

#include <cstdint>
#include <limits>

namespace tally::store {

// Lines of one job, oldest first. A marker tallyd wrote for the whole job
// (attempt 0) matches every attempt and rank.
struct LogQuery {
  int64_t after_sequence = 0;
  int32_t attempt = 0;  // 0: every attempt
  int32_t rank = -1;    // -1: every rank
  int64_t since_micros = std::numeric_limits<int64_t>::min();  // line time, Unix us
  // > 0: the last `tail` lines that match (at most `limit` of them).
  int64_t tail = 0;
  int64_t limit = 1000;
};

}  // namespace tally::store

#endif  // TALLY_SERVER_STORE_JOB_LOGS_H_
