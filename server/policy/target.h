// Cost to a target quality (pure): where a validation curve first reaches a
// target loss, and what it had spent by then.
//
// The dollars, tokens, GPU-seconds and steps *to* the target are interpolated
// between the two evaluations that straddle it, linearly in validation loss:
// with the evaluation before the crossing at loss L0 (spent C0) and the first
// at or below the target T at loss L1 (spent C1),
//   C = C0 + (C1 - C0) * (L0 - T) / (L0 - L1),
// so the answer does not depend on where the evaluation interval happens to
// fall. An evaluation at or below the target with no evaluation before it
// (e.g. the step-0 one) is its own answer.
#ifndef TALLY_SERVER_POLICY_TARGET_H_
#define TALLY_SERVER_POLICY_TARGET_H_

#include <cstdint>
#include <optional>
#include <vector>

namespace tally::policy {

// One evaluation and what the job had spent when it was made.
struct CurvePoint {
  int64_t step = 0;
  int64_t tokens = 0;
  double cost_usd = 0;
  double gpu_seconds = 0;
  double val_loss = 0;
};

struct TargetCrossing {
  CurvePoint at;             // the first evaluation at or below the target
  double cost_usd = 0;       // interpolated to the target
  double tokens = 0;
  double gpu_seconds = 0;
  double steps = 0;
};

// The first crossing of `target` on `curve` (evaluations in order; non-finite
// losses never reach a target and are skipped as "before" points); nullopt
// when no evaluation is at or below it, or `target` is not a positive finite
// number.
std::optional<TargetCrossing> FindTargetCrossing(const std::vector<CurvePoint>& curve,
                                                 double target);

}  // namespace tally::policy

#endif  // TALLY_SERVER_POLICY_TARGET_H_
