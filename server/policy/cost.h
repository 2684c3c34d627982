// The cost ledger's arithmetic (pure): dollars for GPU time, checkpoint
// costs, estimates. server/ledger's CostLedger calls these; they do no I/O.
#ifndef TALLY_SERVER_POLICY_COST_H_
#define TALLY_SERVER_POLICY_COST_H_

#include <cstdint>
#include "absl/time/time.h"

namespace tally::policy {

double CostUsd(absl::Duration held, int gpus, double usd_per_gpu_hour);

struct CheckpointPrice {
  double cost_since_previous_usd = 0;
  int64_t tokens_since_previous = 0;
  // Dollars spent since the previous checkpoint per unit of loss it gained
  // over the previous checkpoint's loss (or the step-0 baseline for the
  // first), of whichever metric the job is judged by (the caller passes that
  // metric's losses). 0 when it gained nothing or either loss is unknown.
  double usd_per_val_loss_improvement = 0;
};

struct PreviousCheckpoint {
  double cost_usd = 0;
  int64_t tokens = 0;
  double val_loss = 0;  // 0: unknown
};

CheckpointPrice PriceCheckpoint(double cost_usd, int64_t tokens, double val_loss,
                                const PreviousCheckpoint& previous);

struct Estimate {
  double flops_per_token = 0;
  int64_t tokens = 0;
  double flops_per_second_per_gpu = 0;
  double seconds = 0;
  double gpu_hours = 0;
  double cost_usd = 0;
};

// seconds = flops_per_token x tokens / (flops_per_second_per_gpu x gpus).
Estimate EstimateRun(double flops_per_token, int64_t tokens, int gpus,
                     double flops_per_second_per_gpu, double usd_per_gpu_hour);

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_COST_H_
