#include "worker/dist/step_reduce.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tally::dist {
namespace {

constexpr size_t kFixedHead = 14;  // loss_sum .. distill_kl_sum
constexpr size_t kPerLayerTail = 3;  // router_entropy, assignments, dropped

size_t PackedSize(const StepSumsLayout& layout) {
  size_t n = kFixedHead + layout.num_parameters + 1;
  for (size_t experts : layout.experts_per_moe_layer) n += experts + kPerLayerTail;
  return n;
}

double D(int64_t n) { return static_cast<double>(n); }
int64_t I(double x) { return static_cast<int64_t>(x); }

}  // namespace

StepEnd StopVotes::Decide() const {
  if (preempt > 0) return StepEnd::kPreempt;
  if (keep_state > 0) return StepEnd::kKeepState;
  if (now > 0) return StepEnd::kStopNow;
  return StepEnd::kContinue;
}

StepSumsLayout LayoutOf(const StepSums& sums) {
  StepSumsLayout layout;
  layout.num_parameters = sums.ranks_with_grad.size();
  for (const MoeLayerLoad& l : sums.moe_layers) {
    layout.experts_per_moe_layer.push_back(l.tokens_per_expert.size());
  }
  return layout;
}

std::vector<double> PackStepSums(const StepSums& s) {
  std::vector<double> v = {s.loss_sum,
                           s.aux_loss_sum,
                           D(s.real_tokens),
                           D(s.padding_tokens),
                           D(s.votes.now),
                           D(s.fp8.overflows),
                           D(s.fp8.underflows),
                           D(s.fp8.elements),
                           D(s.fp8.fp8_products),
                           D(s.fp8.total_products),
                           D(s.ranks_with_nonfinite_amax),
                           D(s.votes.keep_state),
                           D(s.votes.preempt),
                           s.distill_kl_sum};
  v.reserve(PackedSize(LayoutOf(s)));
  for (int64_t n : s.ranks_with_grad) v.push_back(D(n));
  v.push_back(s.sharded_grad_square_sum);
  for (const MoeLayerLoad& l : s.moe_layers) {
    for (int64_t n : l.tokens_per_expert) v.push_back(D(n));
    v.push_back(l.router_entropy);
    v.push_back(D(l.assignments));
    v.push_back(D(l.dropped));
  }
  return v;
}

absl::StatusOr<StepSums> UnpackStepSums(absl::Span<const double> v,
                                        const StepSumsLayout& layout) {
  const size_t want = PackedSize(layout);
  if (v.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step sums: ", v.size(), " values, expected ", want, " for ", layout.num_parameters,
        " parameters and ", layout.experts_per_moe_layer.size(), " MoE layers"));
  }
  StepSums s;
  s.loss_sum = v[0];
  s.aux_loss_sum = v[1];
  s.real_tokens = I(v[2]);
  s.padding_tokens = I(v[3]);
  s.votes.now = I(v[4]);
  s.fp8.overflows = I(v[5]);
  s.fp8.underflows = I(v[6]);
  s.fp8.elements = I(v[7]);
  s.fp8.fp8_products = I(v[8]);
  s.fp8.total_products = I(v[9]);
  s.ranks_with_nonfinite_amax = I(v[10]);
  s.votes.keep_state = I(v[11]);
  s.votes.preempt = I(v[12]);
  s.distill_kl_sum = v[13];
  size_t at = kFixedHead;
  s.ranks_with_grad.reserve(layout.num_parameters);
  for (size_t i = 0; i < layout.num_parameters; ++i) s.ranks_with_grad.push_back(I(v[at++]));
  s.sharded_grad_square_sum = v[at++];
  for (size_t experts : layout.experts_per_moe_layer) {
    MoeLayerLoad& l = s.moe_layers.emplace_back();
    l.tokens_per_expert.reserve(experts);
    for (size_t e = 0; e < experts; ++e) l.tokens_per_expert.push_back(I(v[at++]));
    l.router_entropy = v[at++];
    l.assignments = I(v[at++]);
    l.dropped = I(v[at++]);
  }
  return s;
}

}  // namespace tally::dist
