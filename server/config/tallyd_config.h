// TallydConfig: what tallyd reads from its --config file (YAML), re-read on
// SIGHUP: the price table and the tenants' quotas (and the sections of
// server_limits.h and tenancy.h).
//
//   usd_per_gpu_hour: {cpu: 0.05, h200: 3.50}
//   spot_usd_per_gpu_hour: {h200: 1.40}   # workers run with --capacity=spot
//   flops_per_second_per_gpu: {cpu: 2.0e10, h200: 4.0e14}   # for estimates
//   tenants:
//     research: {max_gpus: 8, max_dollars_per_day: 200, max_dollars_per_month: 3000}
//   worker_gpu_types: [l4]                # announced by workers, not priced
//   checkpoint_root: /mnt/tally-checkpoints
//   logs: {keep_mib: 4}                   # job output kept per job (logs_config.h)
//
// A GPU type with no spot price is priced on spot at its on-demand price; a
// spot price above the on-demand one is accepted as given.
//
// A tenant's limits are each optional (absent or 0: no limit); a tenant not
// listed has none (server/ledger/tenant_quota.h).
//
// Parse errors and Validate() name the key and its line and say what is
// expected. A bad file on SIGHUP leaves the running config in force.
#ifndef TALLY_SERVER_CONFIG_TALLYD_CONFIG_H_
#define TALLY_SERVER_CONFIG_TALLYD_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/ledger/cost_ledger.h"
#include "server/ledger/tenant_quota.h"
#include "server/config/logs_config.h"
#include "server/config/server_limits.h"
#include "server/config/tenancy.h"

namespace tally::config {

struct TallydConfig {
  ledger::PriceTable prices;
  ledger::TenantQuotas quotas;
  // grpc_server: and limits: (server_limits.h).
  GrpcServerLimits grpc_server;
  PrincipalLimits limits;
  // tenancy: priority caps and cross-tenant preemption (tenancy.h).
  TenancyPolicy tenancy;
  // checkpoint_root: where workers write checkpoints (their --checkpoint_dir,
  // as they resolve it; an absolute path, no "." or ".." components): tallyd
  // then records only checkpoints in ROOT/job-N/. Empty: not checked.
  // Read at start; SIGHUP does not move it.
  std::string checkpoint_root;
  // logs: how much of each job's output tallyd keeps. Read at start.
  LogsConfig logs;

  // InvalidArgument for a negative or non-finite price (on-demand or spot),
  // or a throughput that is not a positive finite number, naming the key.
  absl::Status Validate() const;
};

// Files larger than this are refused before they are parsed.
inline constexpr size_t kMaxConfigBytes = 1 << 20;

// Parses and validates; an empty document is the default config.
absl::StatusOr<TallydConfig> ParseTallydConfig(absl::string_view yaml);

// Reads `path` (empty: the default config). NotFound when it cannot be read;
// InvalidArgument, prefixed with the path, when it does not parse.
absl::StatusOr<TallydConfig> LoadTallydConfig(const std::string& path);

}  // namespace tally::config

#endif  // TALLY_SERVER_CONFIG_TALLYD_CONFIG_H_
