// The `logs` section of tallyd's --config: how much of each job's output
// tallyd keeps (server/logs/log_retention.h).
//
//   logs:
//     keep_mib: 4     # per job, newest kept; 0.0625-1024, default 4
//
// Read at start; SIGHUP does not move it.
#ifndef TALLY_SERVER_CONFIG_LOGS_CONFIG_H_
#define TALLY_SERVER_CONFIG_LOGS_CONFIG_H_

#include <cstdint>

#include "absl/status/status.h"

namespace YAML {
class Node;
}

namespace tally::config {

struct LogsConfig {
  double keep_mib = 4;
  int64_t keep_bytes() const { return static_cast<int64_t>(keep_mib * 1024 * 1024); }
};

// Parses the `logs` section into `out`; INVALID_ARGUMENT naming the key and
// its line and saying what is expected.
absl::Status ParseLogsConfig(const YAML::Node& node, int line, LogsConfig* out);

}  // namespace tally::config

#endif  // TALLY_SERVER_CONFIG_LOGS_CONFIG_H_
