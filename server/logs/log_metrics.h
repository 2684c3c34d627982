// The /metrics series of job logs, moved once an append has committed:
// tally_job_log_lines_total{source} (trainer, worker, tally) and
// tally_job_log_dropped_bytes_total{by} (tallyd: over logs.keep_mib; worker:
// its buffer filled while tallyd was out of reach). Bounded label sets, all
// created at 0.
#ifndef TALLY_SERVER_LOGS_LOG_METRICS_H_
#define TALLY_SERVER_LOGS_LOG_METRICS_H_

#include <cstdint>
#include <vector>

#include "server/metrics/registry.h"
#include "tally/v1/jobs.pb.h"

namespace tally::logs {

class LogMetrics {
 public:
  explicit LogMetrics(metrics::Registry* registry);
  // `lines` were stored; `dropped_by_tallyd` bytes dropped to make room.
  void OnStored(const std::vector<tally::v1::LogLine>& lines, int64_t dropped_by_tallyd);

 private:
  metrics::Family<metrics::Counter>* lines_;
  metrics::Family<metrics::Counter>* dropped_;
};

}  // namespace tally::logs

#endif  // TALLY_SERVER_LOGS_LOG_METRICS_H_
