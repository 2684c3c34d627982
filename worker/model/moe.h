// Mixture-of-Experts feed-forward block.
//
// E experts, each a SwiGLU of width F. A router scores every token against
// every expert in FP32 whatever the compute precision (softmax, or sigmoid);
// each token goes to its top-k experts, chosen on score + bias (the bias,
// nudged toward balance by the trainer, affects selection only), and their
// outputs are combined with the scores of the chosen experts, normalised to
// sum to 1 when k > 1 (with k = 1 the gate is the raw score, as in the Switch
// Transformer, so the router learns from the model's loss). An optional
// shared expert sees every token.
//
// Compute: token-expert assignments are sorted by expert (stable), each
// expert's group padded to the alignment the grouped product needs (the
// permutation built on the device from ATen ops, so autograd carries it in
// every dtype), and each weight runs as one grouped product over all experts
// (at::_grouped_mm with int32 group ends; BF16 on CUDA, FP32 on CPU); the
// results are gathered back and combined with their gates. With FP8 (a
// LinearOverride) the override's GroupedLinear takes each weight's grouped
// product where its Groups() allows (at::_scaled_grouped_mm on CUDA), and
// each expert runs once over its tokens in a loop elsewhere.
// An expert that gets no tokens has an empty group or is skipped: its
// weights get a zero gradient or none, never NaN. With a capacity factor, an expert takes at most
// ceil(factor x N x k / E) tokens, in token order, and the rest are dropped
// (their contribution is 0); 0 is dropless.
//
// Losses (returned, for the trainer to add): the Switch Transformer
// load-balancing loss E x sum_i f_i x P_i, with f_i the fraction of
// assignments to expert i (so it is normalised for top-k) and P_i its mean
// router probability; and the router z-loss, mean(logsumexp(logits)^2).
//
// Legend: N tokens, D d_model, E experts, F expert width, K top-k.
#ifndef TALLY_WORKER_MODEL_MOE_H_
#define TALLY_WORKER_MODEL_MOE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/config.h"

namespace tally::model {

class LinearOverride;

// Expert parallelism: E experts dealt to `size()` ranks in contiguous blocks
// (rank r computes experts [r·E/W, (r+1)·E/W)); every rank routes its own
// tokens, sends each assignment to its expert's rank and gets the results
// back, by all-to-all. The weights stay replicated (the trainer sums expert
// gradients over ranks like any other, so every replica takes the owner's
// update); what is split is the experts' compute.
class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Rows of `x`: the first send[0] go to rank 0, the next send[1] to rank
  // 1, ...; returns the rows received, recv[j] from rank j, in rank order.
  // Every rank calls it the same number of times, in the same order.
  virtual at::Tensor AllToAll(const at::Tensor& x, const std::vector<int64_t>& send,
                              const std::vector<int64_t>& recv) = 0;
};

// ExpertExchange::AllToAll as an autograd function: the gradient goes back
// along the same routes, the splits swapped, and every rank joins that
// exchange even when its output got no gradient (it then sends zeros on
// x's device, in x's dtype). MoeForward's collectives; exposed for tests.
at::Tensor AllToAllWithGrad(const at::Tensor& x, ExpertExchange* exchange,
                            const std::vector<int64_t>& send, const std::vector<int64_t>& recv);


struct MoeStats {
  std::vector<int64_t> tokens_per_expert;  // assignments kept, per expert
  int64_t assignments = 0;                 // N x K (real tokens only)
  int64_t dropped = 0;                     // over capacity
  double router_entropy = 0;               // mean over tokens, nats
};

struct MoeOutput {
  at::Tensor y_ND;
  at::Tensor aux_loss;  // Switch load-balancing loss (scalar)
  at::Tensor z_loss;    // router z-loss (scalar)
  MoeStats stats;
};

// The routing decisions alone (exposed for tests and statistics).
struct Routing {
  at::Tensor scores_NE;   // FP32 router probabilities (softmax) or sigmoids
  at::Tensor logits_NE;   // FP32
  at::Tensor expert_NK;   // int64 chosen experts
  at::Tensor gate_NK;     // FP32 combine weights (sum to 1 over K when K > 1)
  at::Tensor kept_NK;     // bool, false where capacity dropped it
};

Routing Route(const at::Tensor& x_ND, const at::Tensor& router_ED, const at::Tensor& bias_E,
              const MoeConfig& config);

// x_ND: tokens; real_N: bool, false for padding (excluded from routing
// statistics and losses; padding still flows through, with its output 0).
// `linear` may be nullptr (at::linear); sites are prefix + "experts.E.w1" etc.
// With `exchange` (E a multiple of its size), this rank computes only its
// block of experts, over every rank's tokens for them; the collectives run
// in the forward pass and again in the backward pass. The expert weights
// then hold every expert or only this rank's block (E / size of them).
MoeOutput MoeForward(const at::Tensor& x_ND, const at::Tensor& real_N, const at::Tensor& router_ED,
                     const at::Tensor& bias_E, const at::Tensor& w1_EFD, const at::Tensor& w3_EFD,
                     const at::Tensor& w2_EDF, const MoeConfig& config, LinearOverride* linear,
                     const std::string& prefix, ExpertExchange* exchange = nullptr);

// Cumulative group ends after padding each count to a multiple of `align`
// (the offsets a grouped product takes); `starts` gets each group's first
// row when not null.
std::vector<int64_t> PaddedGroupEnds(const std::vector<int64_t>& counts, int64_t align,
                                     std::vector<int64_t>* starts = nullptr);

// Auxiliary-loss-free balancing: each expert's selection bias moves by
// `rate` toward balance (up when it got fewer than the mean, down when more).
void NudgeBias(at::Tensor& bias_E, const std::vector<int64_t>& tokens_per_expert, double rate);

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_MOE_H_
