// Which loss a job's rules judge (pure): spec.early_stopping.metric, and an
// experiment's target.metric. "val_loss" (empty means it) is the validation
// loss; "quantized_val_loss" the same tokens' loss with the model's chosen
// linears quantized as its GGUF export will be. Early stopping, the target,
// the forecast, checkpoint pricing, the best checkpoint and an experiment's
// figures all read a point's loss through LossOf, so each judges one metric
// and says which.
#ifndef TALLY_SERVER_POLICY_LOSS_METRIC_H_
#define TALLY_SERVER_POLICY_LOSS_METRIC_H_

#include <limits>
#include <string>

#include "absl/strings/string_view.h"

namespace tally::policy {

enum class LossMetric { kValLoss, kQuantizedValLoss };

inline constexpr char kValLossMetric[] = "val_loss";
inline constexpr char kQuantizedValLossMetric[] = "quantized_val_loss";

// The metric a spec field names; anything but "quantized_val_loss" (the
// validators refuse other values) is val_loss.
inline LossMetric ParseLossMetric(absl::string_view field) {
  return field == kQuantizedValLossMetric ? LossMetric::kQuantizedValLoss : LossMetric::kValLoss;
}

// "val_loss" or "quantized_val_loss": what messages and status fields say.
inline const char* LossMetricName(LossMetric m) {
  return m == LossMetric::kQuantizedValLoss ? kQuantizedValLossMetric : kValLossMetric;
}

// The metric's value at anything with val_loss() and an optional
// quantized_val_loss() (an evaluation, a curve point, a checkpoint, a job):
// NaN when the metric is the quantized loss and the point has none, so it
// counts as no evaluation (curves and targets skip non-finite points).
template <typename Point>
double LossOf(LossMetric m, const Point& p) {
  if (m == LossMetric::kValLoss) return p.val_loss();
  return p.has_quantized_val_loss() ? p.quantized_val_loss()
                                    : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_LOSS_METRIC_H_
