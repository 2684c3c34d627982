#include "server/logs/log_metrics.h"

namespace tally::logs {

LogMetrics::LogMetrics(metrics::Registry* registry) {
  lines_ = &metrics::BuildCounter()
                .Name("tally_job_log_lines_total")
                .Help("Log lines of jobs' attempts tallyd stored, by source: trainer (the "
                      "attempt's output), worker (the worker's messages about it), tally "
                      "(markers for dropped output).")
                .Register(*registry);
  dropped_ = &metrics::BuildCounter()
                  .Name("tally_job_log_dropped_bytes_total")
                  .Help("Bytes of jobs' log output dropped, by who dropped them: tallyd (a "
                        "job's oldest output past logs.keep_mib) or worker (its local buffer "
                        "filled while tallyd was out of reach).")
                  .Register(*registry);
  for (const char* source : {"trainer", "worker", "tally"}) lines_->Add({{"source", source}});
  for (const char* by : {"tallyd", "worker"}) dropped_->Add({{"by", by}});
}

void LogMetrics::OnStored(const std::vector<tally::v1::LogLine>& lines,
                          int64_t dropped_by_tallyd) {
  int64_t trainer = 0, worker = 0, tally = 0, worker_dropped = 0;
  for (const auto& l : lines) {
    if (l.source() == "trainer") ++trainer;
    if (l.source() == "worker") ++worker;
    if (l.source() == "tally") {
      ++tally;
      worker_dropped += l.dropped_bytes();
    }
  }
  if (trainer) lines_->Add({{"source", "trainer"}}).Increment(static_cast<double>(trainer));
  if (worker) lines_->Add({{"source", "worker"}}).Increment(static_cast<double>(worker));
  if (tally) lines_->Add({{"source", "tally"}}).Increment(static_cast<double>(tally));
  if (worker_dropped) {
    dropped_->Add({{"by", "worker"}}).Increment(static_cast<double>(worker_dropped));
  }
  if (dropped_by_tallyd) {
    dropped_->Add({{"by", "tallyd"}}).Increment(static_cast<double>(dropped_by_tallyd));
  }
}

}  // namespace tally::logs
