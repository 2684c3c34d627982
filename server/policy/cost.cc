#include "server/policy/cost.h"

#include <cmath>


namespace tally::policy {

double CostUsd(absl::Duration held, int gpus, double usd_per_gpu_hour) {
  return absl::ToDoubleHours(held) * gpus * usd_per_gpu_hour;
}

CheckpointPrice PriceCheckpoint(double cost_usd, int64_t tokens, double val_loss,
                                const PreviousCheckpoint& prev) {
  CheckpointPrice p;
  p.cost_since_previous_usd = cost_usd - prev.cost_usd;
  p.tokens_since_previous = tokens - prev.tokens;
  if (val_loss > 0 && prev.val_loss > 0 && val_loss < prev.val_loss) {
    p.usd_per_val_loss_improvement = p.cost_since_previous_usd / (prev.val_loss - val_loss);
  }
  return p;
}

Estimate EstimateRun(double flops_per_token, int64_t tokens, int gpus,
                     double flops_per_second_per_gpu, double usd_per_gpu_hour) {
  Estimate e;
  e.flops_per_token = flops_per_token;
  e.tokens = tokens;
  e.flops_per_second_per_gpu = flops_per_second_per_gpu;
  if (flops_per_second_per_gpu > 0 && gpus > 0) {
    e.seconds = flops_per_token * static_cast<double>(tokens) /
                (flops_per_second_per_gpu * gpus);
  }
  e.gpu_hours = e.seconds * gpus / 3600.0;
  e.cost_usd = e.gpu_hours * usd_per_gpu_hour;
  return e;
}

}  // namespace tally::policy
