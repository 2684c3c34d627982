#include "server/policy/target.h"

#include <cmath>

namespace tally::policy {

std::optional<TargetCrossing> FindTargetCrossing(const std::vector<CurvePoint>& curve,
                                                 double target) {
  if (!std::isfinite(target) || target <= 0) return std::nullopt;
  const CurvePoint* before = nullptr;  // the latest finite evaluation above the target
  for (const CurvePoint& p : curve) {
    if (!std::isfinite(p.val_loss)) continue;
    if (p.val_loss > target) {
      before = &p;
      continue;
    }
    TargetCrossing out;
    out.at = p;
    out.cost_usd = p.cost_usd;
    out.tokens = static_cast<double>(p.tokens);
    out.gpu_seconds = p.gpu_seconds;
    out.steps = static_cast<double>(p.step);
    if (before != nullptr && before->val_loss > p.val_loss) {
      const double f = (before->val_loss - target) / (before->val_loss - p.val_loss);
      auto lerp = [f](double a, double b) { return a + (b - a) * f; };
      out.cost_usd = lerp(before->cost_usd, p.cost_usd);
      out.tokens = lerp(static_cast<double>(before->tokens), static_cast<double>(p.tokens));
      out.gpu_seconds = lerp(before->gpu_seconds, p.gpu_seconds);
      out.steps = lerp(static_cast<double>(before->step), static_cast<double>(p.step));
    }
    return out;
  }
  return std::nullopt;
}

}  // namespace tally::policy
