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
// layout and the permutation built on the device from ATen ops, from counts
// taken on the device, so autograd carries it in every dtype and nothing
// waits for the host), and each weight runs as one grouped product over all
// experts (at::_grouped_mm with int32 group ends on the device; BF16 on
// CUDA, FP32 on CPU); the results are gathered back and combined with their
// gates. (The loop over experts, FP8's grouped products and expert
// parallelism read the counts on the host, once per layer and micro-batch,
// with the counts other processes send under expert parallelism: they size
// their calls. Nothing else in a layer waits for the host; moe.cc lists
// every read.) With FP8 (a
// LinearOverride that is also a GroupedLinearOverride) the override's
// GroupedLinear takes each weight's grouped product where its Groups()
// allows (at::_scaled_grouped_mm on CUDA), and each expert runs once over
// its tokens in a loop elsewhere.
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
#include <functional>
#include <string>
#include <vector>

#include "worker/model/config.h"

namespace tally::model {

class LinearOverride;

// A LinearOverride that also takes the experts' grouped products (FP8:
// at::_scaled_grouped_mm) implements this too; MoeForward then uses it
// where Groups() says so, and otherwise runs the experts in a loop of the
// override's Linear.
class GroupedLinearOverride {
 public:
  virtual ~GroupedLinearOverride() = default;
  // Whether GroupedLinear takes every expert's product at once for inputs
  // like x with weights [E, out, in].
  virtual bool Groups(const at::Tensor& x, int64_t out, int64_t in) const = 0;
  // x_RI holds the experts' rows group after group: expert e's counts[e]
  // rows start where group e - 1 ends (ends[e - 1]), and the rest of its
  // group, up to ends[e], is zero padding. w_EOI: one weight per expert;
  // sites[e] names expert e's. Returns y_RO (padding rows zero).
  virtual at::Tensor GroupedLinear(const at::Tensor& x_RI, const std::vector<int64_t>& counts,
                                   const std::vector<int64_t>& ends, const at::Tensor& w_EOI,
                                   const std::vector<std::string>& sites) = 0;
};

// The experts hook: what computes the experts' outputs for a layer's kept
// assignments. MoeForward runs every expert here by default; a hook wraps
// that from outside the model (dist/expert_parallel.h spreads the experts
// over ranks), so the model itself knows no parallelism.
class ExpertsHook {
 public:
  // Computes a block of consecutive experts held here: rows_SD sorted by
  // expert, counts[m] rows for expert first_expert + m (counts.size()
  // experts); their outputs in the same order.
  using LocalExperts = std::function<at::Tensor(
      const at::Tensor& rows_SD, const std::vector<int64_t>& counts, int64_t first_expert)>;
  virtual ~ExpertsHook() = default;
  // How many processes the experts are spread over (1: all here). With
  // more, the expert weights here may hold every expert or only this
  // process's block of E / ranks().
  virtual int ranks() const = 0;
  // What every process sends this one: from this process's counts_E [E]
  // (int64, on the device), the rows each process p routes to each expert m
  // this one holds, [ranks() * E / ranks()] (p-major) on the same device.
  // A collective every process joins; nothing is read back, so MoeForward
  // reads these with its own counts in one read.
  virtual at::Tensor ExchangeCounts(const at::Tensor& counts_E) = 0;
  // rows_SD: this process's kept assignments' inputs sorted by expert,
  // counts[e] for each of the E experts; received: ExchangeCounts' values
  // on the host. Returns the experts' outputs for them, in the same order,
  // computing this process's share with `local`.
  virtual at::Tensor Run(const at::Tensor& rows_SD, const std::vector<int64_t>& counts,
                         const std::vector<int64_t>& received, const LocalExperts& local) = 0;
};


// A layer's routing statistics, on the device: nothing is read back while a
// step runs (the trainer reads every layer's, with the step's losses, in
// one read at its end).
struct MoeStats {
  at::Tensor tokens_per_expert;  // [E] int64: assignments kept, per expert
  at::Tensor assignments;        // [] int64: real tokens x K
  at::Tensor dropped;            // [] int64: over capacity
  at::Tensor router_entropy;     // [] FP32: mean over real tokens, nats
};

// The same on the host, in one read (tests, tools).
struct MoeStatsHost {
  std::vector<int64_t> tokens_per_expert;
  int64_t assignments = 0;
  int64_t dropped = 0;
  double router_entropy = 0;
};
MoeStatsHost ReadMoeStats(const MoeStats& stats);

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
// With `experts` (a hook over several ranks), the kept assignments go to it
// and it computes this rank's block through the model's own expert code.
MoeOutput MoeForward(const at::Tensor& x_ND, const at::Tensor& real_N, const at::Tensor& router_ED,
                     const at::Tensor& bias_E, const at::Tensor& w1_EFD, const at::Tensor& w3_EFD,
                     const at::Tensor& w2_EDF, const MoeConfig& config, LinearOverride* linear,
                     const std::string& prefix, ExpertsHook* experts = nullptr);

// Cumulative group ends after padding each count to a multiple of `align`
// (the offsets a grouped product takes); `starts` gets each group's first
// row when not null.
std::vector<int64_t> PaddedGroupEnds(const std::vector<int64_t>& counts, int64_t align,
                                     std::vector<int64_t>* starts = nullptr);

// Auxiliary-loss-free balancing: each expert's selection bias moves by
// `rate` toward balance (up when it got fewer than the mean, down when more).
// The step's counts come from the host (its one read); the nudge reaches
// the device without waiting (Upload).
void NudgeBias(at::Tensor& bias_E, const std::vector<int64_t>& tokens_per_expert, double rate);

// Small host values on `device` without waiting for it: on a GPU copied from
// pinned memory, queued on the current stream (the pinned block is held
// until the copy is done); as they are elsewhere. int64 or FP32.
at::Tensor Upload(const std::vector<int64_t>& values, at::Device device);
at::Tensor Upload(const std::vector<float>& values, at::Device device);

// How many times MoE layers and expert parallelism have read values back
// from the device on this thread (each a wait for the device on a GPU),
// for tests: the table at the top of moe.cc lists every such read.
int64_t MoeHostReads();

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_MOE_H_
