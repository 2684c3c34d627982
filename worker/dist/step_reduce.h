// StepSums: everything the ranks of a data-parallel group add up at the end
// of a training step, by name, and the flat vector of doubles that travels
// in the step's one all-reduce (Group::AllReduceSum).
//
// Every field is a sum over the ranks once reduced: loss and token sums,
// the FP8 counts, and counts of ranks for the rest (how many voted to stop
// in each way, how many saw a non-finite amax, how many hold a gradient for
// each parameter). Integer fields travel as doubles, exact up to 2^53.
//
// The layout is fixed by the number of parameters and each MoE layer's
// number of experts (StepSumsLayout), which every rank of a run shares:
//
//   loss_sum, aux_loss_sum, real_tokens, padding_tokens, votes.now,
//   fp8.{overflows, underflows, elements, fp8_products, total_products},
//   ranks_with_nonfinite_amax, votes.keep_state, votes.preempt,
//   distill_kl_sum, ranks_with_grad[num_parameters], sharded_grad_square_sum,
//   per MoE layer: tokens_per_expert[num_experts], router_entropy,
//   assignments, dropped.
//
// Pure values: no LibTorch, no group; thread-compatible.
#ifndef TALLY_WORKER_DIST_STEP_REDUCE_H_
#define TALLY_WORKER_DIST_STEP_REDUCE_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tally::dist {

// How a step ends for the whole group, decided from the summed votes.
enum class StepEnd { kContinue, kStopNow, kKeepState, kPreempt };

// One rank's vote is a 1 in at most one field; summed, the number of ranks
// that cast each vote.
struct StopVotes {
  int64_t now = 0;         // stop at once, without applying the step
  int64_t keep_state = 0;  // apply the step, evaluate, checkpoint, stop
  int64_t preempt = 0;     // apply the step, checkpoint without evaluating, stop

  // Any preempt vote preempts every rank; otherwise any vote to keep the
  // state keeps it (both outweigh a stop at once: their checkpoint needs
  // every rank); otherwise any vote to stop stops at once.
  StepEnd Decide() const;
};

struct Fp8Counts {
  int64_t overflows = 0;
  int64_t underflows = 0;
  int64_t elements = 0;
  int64_t fp8_products = 0;
  int64_t total_products = 0;
};

// One MoE layer's routing over the step.
struct MoeLayerLoad {
  std::vector<int64_t> tokens_per_expert;
  double router_entropy = 0;
  int64_t assignments = 0;  // token-to-expert assignments
  int64_t dropped = 0;      // of those, dropped for capacity
};

struct StepSums {
  double loss_sum = 0;      // cross-entropy summed over target tokens
  double aux_loss_sum = 0;  // MoE load-balancing loss
  // Distillation: KL(teacher || student) at the temperature, summed over
  // target tokens (0 without a teacher).
  double distill_kl_sum = 0;
  int64_t real_tokens = 0;
  int64_t padding_tokens = 0;
  StopVotes votes;
  Fp8Counts fp8;
  int64_t ranks_with_nonfinite_amax = 0;
  // By parameter index: ranks on which the parameter has a gradient.
  std::vector<int64_t> ranks_with_grad;
  // Sum of squares of the gradients of expert-sharded parameters (each rank
  // holds its own block).
  double sharded_grad_square_sum = 0;
  std::vector<MoeLayerLoad> moe_layers;  // in the model's layer order
};

struct StepSumsLayout {
  size_t num_parameters = 0;
  std::vector<size_t> experts_per_moe_layer;
};

StepSumsLayout LayoutOf(const StepSums& sums);

// The flat vector, in the order above.
std::vector<double> PackStepSums(const StepSums& sums);

// Back from a (summed) flat vector of `layout`; InvalidArgument when its
// size is not the layout's.
absl::StatusOr<StepSums> UnpackStepSums(absl::Span<const double> packed,
                                        const StepSumsLayout& layout);

}  // namespace tally::dist

#endif  // TALLY_WORKER_DIST_STEP_REDUCE_H_
