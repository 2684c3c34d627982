#include "worker/model/moe.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>
#include <limits>

#include "worker/model/transformer.h"

// Where a MoE layer (and expert parallelism) waits for the host. On a GPU
// each of these is a device-to-host read that stalls the stream; CUDA's
// sync-debug mode (the device script's sync audit, TrainConfig::
// test_sync_check) reports each with its source line, to be checked against
// this table. Host-to-device copies are not listed: every one goes through
// Upload (pinned memory, non-blocking), which does not wait.
//
//   file:line          what                              how often
//   moe.cc:324         the layer's counts (ReadCountsOnce  1 per MoE layer per micro-batch,
//                      at moe.cc:90), with the counts the  forward only: FP8 experts
//                      other ranks send here under expert  (grouped or the loop), the
//                      parallelism                         loop over experts, expert
//                                                          parallelism
//   grouped.cc:133     the first FP8 grouped product       1 per run (CUDA)
//                      against the per-expert ones
//   converter.cc:280   Fp8Linears::TakeStats               1 per step (FP8 statistics)
//   scaling.cc:115     StepDelayed without TakeStats       never in the trainer
//   moe.cc:392         ReadMoeStats                        tests and tools only
//
// Not here: BF16/FP32 grouped experts on one process read nothing (counts,
// layout and offsets stay on the device); the trainer's one read per step
// of every layer's routing statistics with the losses (worker/train/
// step.cc) feeds NudgeBias, whose update goes up with Upload. Expert
// parallelism's counts exchange (ExchangeCounts) stays on the device and is
// read with the local counts in the one read above; its row exchange is
// sized from those host values.
//
// So an FP8 MoE step waits for the host once per MoE layer per micro-batch
// (MoE layers x micro-batches), with or without expert parallelism, plus
// the step's own reads. Once per step in all would need the FP8 experts'
// casts and products sized on the device (per-row scales from an expert
// index built there, grouped products on device offsets), and a grouped
// backward that torch 2.11's _scaled_grouped_mm cannot run with E5M2
// gradients (it takes E4M3 operands only).

namespace tally::model {

Routing Route(const at::Tensor& x_ND, const at::Tensor& router_ED, const at::Tensor& bias_E,
              const MoeConfig& c) {
  Routing r;
  // The router runs in FP32 whatever the compute precision (inputs cast
  // explicitly, so autocast leaves the product in FP32).
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  r.logits_NE = at::matmul(x_ND.to(at::kFloat), router_ED.to(at::kFloat).t());
  r.scores_NE = c.sigmoid_router ? at::sigmoid(r.logits_NE) : at::softmax(r.logits_NE, -1);
  at::Tensor choose_NE = r.scores_NE.detach();
  if (bias_E.defined()) choose_NE = choose_NE + bias_E.to(choose_NE.device());
  if (c.test_forced_expert >= 0 && c.test_forced_expert < choose_NE.size(1)) {
    // Infinite: chosen whatever the scores and the balancing biases.
    choose_NE = choose_NE.index_fill(
        1, at::tensor({c.test_forced_expert}, choose_NE.options().dtype(at::kLong)),
        std::numeric_limits<double>::infinity());
  }
  r.expert_NK = std::get<1>(at::topk(choose_NE, c.top_k, -1));
  at::Tensor picked_NK = r.scores_NE.gather(1, r.expert_NK);
  // Top-1 keeps the raw score as its gate (Switch Transformer): normalised,
  // it would be 1 and the router would learn nothing from the model's loss.
  r.gate_NK = c.top_k == 1 ? picked_NK : picked_NK / picked_NK.sum(-1, true).clamp_min(1e-9);
  r.kept_NK = at::ones_like(r.expert_NK, at::kBool);
  if (c.capacity_factor > 0) {
    const int64_t N = x_ND.size(0), E = router_ED.size(0);
    const int64_t capacity = static_cast<int64_t>(
        std::ceil(c.capacity_factor * static_cast<double>(N * c.top_k) / static_cast<double>(E)));
    // Position of each assignment in its expert's queue, in token order.
    at::Tensor one_hot = at::one_hot(r.expert_NK.reshape({-1}), E);  // [N*K, E]
    at::Tensor position = (one_hot.cumsum(0) - 1).mul(one_hot).sum(-1);
    r.kept_NK = position.lt(capacity).reshape({N, c.top_k});
  }
  return r;
}

namespace {

thread_local int64_t host_reads = 0;

// The one host read of a MoE layer: `t`'s int64 values (a few, on any
// device), counted.
std::vector<int64_t> ReadCountsOnce(const at::Tensor& t) {
  ++host_reads;
  const at::Tensor h = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
}

at::Tensor ExpertLinear(const at::Tensor& x, const at::Tensor& w, LinearOverride* linear,
                        const std::string& site) {
  return linear == nullptr ? at::linear(x, w) : linear->Linear(x, w, site);
}

at::Tensor RunExpert(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3,
                     const at::Tensor& w2, LinearOverride* linear, const std::string& site) {
  at::Tensor h = at::silu(ExpertLinear(x, w1, linear, site + "w1")) *
                 ExpertLinear(x, w3, linear, site + "w3");
  return ExpertLinear(h, w2, linear, site + "w2");
}

// Whether `g` (an override's grouped products, if it has them) takes both
// shapes of an expert's products.
bool GroupsBoth(const GroupedLinearOverride* g, const at::Tensor& x, int64_t D, int64_t F) {
  return g != nullptr && g->Groups(x, F, D) && g->Groups(x, D, F);
}

// The grouped product wants rows of 16 bytes' multiples (both d_model and
// the expert width, in the dtype it runs in); other shapes take the loop.
bool GroupedShapesFit(int64_t D, int64_t F, bool cuda) {
  const int64_t per16 = cuda ? 8 : 4;  // BF16 on CUDA, FP32 on CPU
  return D % per16 == 0 && F % per16 == 0;
}

}  // namespace

int64_t MoeHostReads() { return host_reads; }

at::Tensor Upload(const std::vector<int64_t>& values, at::Device device) {
  const at::Tensor h = at::tensor(values, at::kLong);
  return device.is_cuda() ? h.pin_memory().to(device, /*non_blocking=*/true) : h.to(device);
}

at::Tensor Upload(const std::vector<float>& values, at::Device device) {
  const at::Tensor h = at::tensor(values, at::kFloat);
  return device.is_cuda() ? h.pin_memory().to(device, /*non_blocking=*/true) : h.to(device);
}

std::vector<int64_t> PaddedGroupEnds(const std::vector<int64_t>& counts, int64_t align,
                                     std::vector<int64_t>* starts) {
  std::vector<int64_t> ends;
  int64_t rows = 0;
  for (int64_t n : counts) {
    if (starts) starts->push_back(rows);
    rows += align > 1 ? (n + align - 1) / align * align : n;
    ends.push_back(rows);
  }
  return ends;
}

namespace {

// The grouped middle of MoeForward: `rows_SD` are the kept assignments'
// inputs sorted by expert, counts[e] per expert; returns the experts'
// outputs for them, in the same order.
at::Tensor GroupedExperts(const at::Tensor& rows_SD, const std::vector<int64_t>& counts,
                          const at::Tensor& w1_EFD, const at::Tensor& w3_EFD,
                          const at::Tensor& w2_EDF, const MoeConfig& c, LinearOverride* linear,
                          const std::string& prefix, int64_t first_expert = 0) {
  const bool cuda = rows_SD.is_cuda();
  const int64_t align = c.group_align > 0 ? c.group_align : (cuda ? 16 : 1);
  const int64_t kept = rows_SD.size(0);
  std::vector<int64_t> starts;
  const std::vector<int64_t> ends = PaddedGroupEnds(counts, align, &starts);
  const int64_t rows = ends.empty() ? 0 : ends.back();
  // Destination row of each sorted assignment: its place plus the padding
  // of the groups before its expert's (built on the device from E values).
  at::Tensor dest_S;
  if (rows != kept) {
    std::vector<int64_t> shift;
    int64_t first = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      shift.push_back(starts[e] - first);
      first += counts[e];
    }
    const at::Device device = rows_SD.device();
    dest_S = at::arange(kept, at::TensorOptions().dtype(at::kLong).device(device)) +
             at::repeat_interleave(Upload(shift, device), Upload(counts, device), 0, kept);
  }
  // BF16 on CUDA (what its grouped kernels take); FP32 on CPU.
  const auto dtype = cuda ? at::kBFloat16 : at::kFloat;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  at::Tensor xs = rows_SD.to(dtype);
  at::Tensor x_RD = rows == kept ? xs
                                 : at::zeros({rows, rows_SD.size(1)}, xs.options()).index_copy(
                                       0, dest_S, xs);
  // The group ends on the device, for at::_grouped_mm only (FP8's grouped
  // product takes them from the host).
  at::Tensor offs;
  if (linear == nullptr) offs = Upload(ends, rows_SD.device()).to(at::kInt);
  auto grouped = [&](const at::Tensor& a, const at::Tensor& w, const char* name) {
    if (linear != nullptr) {  // FP8: the override's own grouped product
      std::vector<std::string> sites;
      for (size_t e = 0; e < counts.size(); ++e) {
        sites.push_back(prefix + "experts." + std::to_string(first_expert + e) + "." + name);
      }
      // MoeForward chose grouped products: the override takes them.
      return dynamic_cast<GroupedLinearOverride&>(*linear)
          .GroupedLinear(a, counts, ends, w, sites)
          .to(dtype);
    }
    return at::_grouped_mm(a, w.to(dtype).transpose(1, 2), offs);
  };
  at::Tensor h_RF = at::silu(grouped(x_RD, w1_EFD, "w1")) * grouped(x_RD, w3_EFD, "w3");
  at::Tensor y_RD = grouped(h_RF, w2_EDF, "w2");
  at::Tensor ys = rows == kept ? y_RD : y_RD.index_select(0, dest_S);
  return ys.to(rows_SD.scalar_type());
}

// The grouped products of MoeForward without a host read: every one of the
// A = N x K assignments, sorted by expert with the unused ones (padding,
// over capacity) last, is placed on the device at its expert's padded group
// (the layout PaddedGroupEnds gives, computed from the device counts), the
// unused ones beyond the last group where no product reads them; each
// weight is one at::_grouped_mm with the group ends on the device. Returns
// the experts' outputs by sorted assignment, zero for unused ones.
at::Tensor GroupedExpertsOnDevice(const at::Tensor& xs_AD, const at::Tensor& expert_sorted_A,
                                  const at::Tensor& counts_E, const at::Tensor& w1_EFD,
                                  const at::Tensor& w3_EFD, const at::Tensor& w2_EDF,
                                  const MoeConfig& c) {
  const bool cuda = xs_AD.is_cuda();
  const int64_t align = c.group_align > 0 ? c.group_align : (cuda ? 16 : 1);
  const int64_t A = xs_AD.size(0), E = counts_E.size(0), D = xs_AD.size(1);
  const auto longs = counts_E.options();
  // Group layout: padded counts, their ends and starts, and where each
  // expert's first sorted assignment lands (its start less the assignments
  // before it). The unused assignments (expert E) follow the last group.
  const at::Tensor padded_E = (counts_E + (align - 1)).div(align, "floor") * align;
  const at::Tensor ends_E = padded_E.cumsum(0);
  const at::Tensor before_E = counts_E.cumsum(0) - counts_E;
  const at::Tensor total = ends_E.narrow(0, E - 1, 1);
  const at::Tensor kept = counts_E.sum().reshape({1});
  const at::Tensor shift = at::cat({ends_E - padded_E - before_E, total - kept});
  const at::Tensor dest_A = at::arange(A, longs) + shift.index_select(0, expert_sorted_A);
  const at::Tensor valid_A = expert_sorted_A.lt(E);
  // BF16 on CUDA (what its grouped kernels take); FP32 on CPU.
  const auto dtype = cuda ? at::kBFloat16 : at::kFloat;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const int64_t rows = A + E * (align - 1);  // the most the groups can take
  const at::Tensor x_RD =
      at::zeros({rows, D}, xs_AD.options().dtype(dtype))
          .index_copy(0, dest_A, at::where(valid_A.unsqueeze(1), xs_AD.to(dtype), 0));
  const at::Tensor offs = ends_E.to(at::kInt);
  auto grouped = [&](const at::Tensor& a, const at::Tensor& w) {
    return at::_grouped_mm(a, w.to(dtype).transpose(1, 2), offs);
  };
  const at::Tensor h_RF = at::silu(grouped(x_RD, w1_EFD)) * grouped(x_RD, w3_EFD);
  const at::Tensor y_RD = grouped(h_RF, w2_EDF);
  // Rows past the last group are never written by the products: select,
  // don't multiply, so nothing there reaches a token.
  return at::where(valid_A.unsqueeze(1), y_RD.index_select(0, dest_A), 0).to(xs_AD.scalar_type());
}

// The experts first_expert .. first_expert + counts.size() - 1 over rows_SD
// (sorted by expert, counts[m] rows for each), with weights holding every
// expert or just that block: grouped products or a loop. What an
// ExpertsHook computes here.
at::Tensor LocalExperts(const at::Tensor& rows_SD, const std::vector<int64_t>& counts,
                        int64_t first_expert, const at::Tensor& w1_EFD, const at::Tensor& w3_EFD,
                        const at::Tensor& w2_EDF, int64_t E, const MoeConfig& c, bool grouped,
                        LinearOverride* linear, const std::string& prefix) {
  const int64_t M = static_cast<int64_t>(counts.size());
  auto block = [&](const at::Tensor& w) {
    return w.size(0) == E ? w.narrow(0, first_expert, M) : w;
  };
  if (grouped) {
    return GroupedExperts(rows_SD, counts, block(w1_EFD), block(w3_EFD), block(w2_EDF), c,
                          linear, prefix, first_expert);
  }
  const at::Tensor w1 = block(w1_EFD), w3 = block(w3_EFD), w2 = block(w2_EDF);
  std::vector<at::Tensor> out;
  int64_t start = 0;
  for (int64_t m = 0; m < M; ++m) {
    if (counts[m] == 0) continue;
    out.push_back(RunExpert(rows_SD.narrow(0, start, counts[m]), w1[m], w3[m], w2[m], linear,
                            prefix + "experts." + std::to_string(first_expert + m) + "."));
    start += counts[m];
  }
  return at::cat(out);
}

}  // namespace

MoeOutput MoeForward(const at::Tensor& x_ND, const at::Tensor& real_N, const at::Tensor& router_ED,
                     const at::Tensor& bias_E, const at::Tensor& w1_EFD, const at::Tensor& w3_EFD,
                     const at::Tensor& w2_EDF, const MoeConfig& c, LinearOverride* linear,
                     const std::string& prefix, ExpertsHook* experts) {
  const int64_t N = x_ND.size(0), E = router_ED.size(0), K = c.top_k;
  Routing r = Route(x_ND, router_ED, bias_E, c);
  at::Tensor real = real_N.defined() ? real_N.to(at::kBool) : at::ones({N}, x_ND.options().dtype(at::kBool));
  at::Tensor use_NK = r.kept_NK.logical_and(real.unsqueeze(1));

  // Sort assignments by expert, the unused ones (padding, over capacity)
  // last; run each expert once over its tokens. Counted on the device with
  // a scatter (no data-dependent sizes, so nothing waits for the device).
  at::Tensor expert_A = r.expert_NK.reshape({-1});
  at::Tensor token_A = at::arange(N, r.expert_NK.options()).unsqueeze(1).expand({N, K}).reshape({-1});
  at::Tensor gate_A = r.gate_NK.reshape({-1});
  at::Tensor use_A = use_NK.reshape({-1});
  at::Tensor masked_A = expert_A.masked_fill(use_A.logical_not(), E);
  at::Tensor order = at::argsort(masked_A, /*stable=*/true);
  at::Tensor counts_E = at::zeros({E + 1}, expert_A.options())
                            .scatter_add_(0, masked_A, at::ones_like(masked_A))
                            .narrow(0, 0, E);

  at::Tensor y_ND = at::zeros_like(x_ND);
  const bool across_ranks = experts != nullptr && experts->ranks() > 1;
  TORCH_CHECK(w1_EFD.size(0) == E || (across_ranks && w1_EFD.size(0) * experts->ranks() == E),
              "MoeForward: ", w1_EFD.size(0), " experts' weights here for ", E,
              " experts, and no experts hook that holds the rest");
  const int64_t D = x_ND.size(1), F = w1_EFD.size(1);
  const bool grouped =
      c.grouped_mm && (linear == nullptr
                           ? GroupedShapesFit(D, F, x_ND.is_cuda())
                           : GroupsBoth(dynamic_cast<GroupedLinearOverride*>(linear), x_ND,
                                        D, F));
  if (grouped && linear == nullptr && !across_ranks) {
    // Every assignment at once, on the device.
    at::Tensor tok = token_A.index_select(0, order);
    at::Tensor ye = GroupedExpertsOnDevice(x_ND.index_select(0, tok), masked_A.index_select(0, order),
                                           counts_E, w1_EFD, w3_EFD, w2_EDF, c);
    ye = ye * gate_A.index_select(0, order).unsqueeze(1).to(ye.scalar_type());
    y_ND = y_ND.index_add(0, tok, ye.to(y_ND.scalar_type()));
  } else {
    // The loop over experts, FP8's grouped products (each expert's own
    // scales) and the exchange between ranks take the counts on the host:
    // the layer's one read, with what the other ranks send here.
    at::Tensor received_P;
    if (across_ranks) received_P = experts->ExchangeCounts(counts_E);
    std::vector<int64_t> counts = ReadCountsOnce(
        across_ranks ? at::cat({counts_E, received_P.to(counts_E.dtype())}) : counts_E);
    const std::vector<int64_t> received(counts.begin() + E, counts.end());
    counts.resize(E);
    int64_t kept = 0;
    for (int64_t n : counts) kept += n;
    // (With no kept assignment at all, the loop below has nothing to do; the
    // hook must still run, as every rank joins its exchanges.)
    if (across_ranks || (grouped && kept > 0)) {
      // All kept assignments at once, sorted by expert.
      at::Tensor idx = order.narrow(0, 0, kept);
      at::Tensor tok = token_A.index_select(0, idx);
      at::Tensor xs = x_ND.index_select(0, tok);
      at::Tensor ye;
      if (across_ranks) {
        ye = experts->Run(xs, counts, received,
                          [&](const at::Tensor& rows_SD, const std::vector<int64_t>& block,
                              int64_t first) {
                            return LocalExperts(rows_SD, block, first, w1_EFD, w3_EFD, w2_EDF,
                                                E, c, grouped, linear, prefix);
                          });
      } else {
        ye = GroupedExperts(xs, counts, w1_EFD, w3_EFD, w2_EDF, c, linear, prefix);
      }
      ye = ye * gate_A.index_select(0, idx).unsqueeze(1).to(ye.scalar_type());
      y_ND = y_ND.index_add(0, tok, ye.to(y_ND.scalar_type()));
    } else {
      int64_t start = 0;
      for (int64_t e = 0; e < E; ++e) {
        if (counts[e] == 0) continue;
        at::Tensor idx = order.narrow(0, start, counts[e]);
        start += counts[e];
        at::Tensor tok = token_A.index_select(0, idx);
        at::Tensor ye = RunExpert(x_ND.index_select(0, tok), w1_EFD[e], w3_EFD[e], w2_EDF[e],
                                  linear, prefix + "experts." + std::to_string(e) + ".");
        ye = ye * gate_A.index_select(0, idx).unsqueeze(1).to(ye.scalar_type());
        y_ND = y_ND.index_add(0, tok, ye.to(y_ND.scalar_type()));
      }
    }
  }

  MoeOutput out;
  out.y_ND = y_ND;
  // Losses and statistics over real tokens only, on the device.
  at::Tensor probs_NE = c.sigmoid_router ? r.scores_NE / r.scores_NE.sum(-1, true) : r.scores_NE;
  at::Tensor realf = real.to(at::kFloat).unsqueeze(1);
  const at::Tensor num_real = real.sum().to(at::kFloat).clamp_min(1);  // a count: exact
  at::Tensor assigned_NE = at::zeros({N, E}, probs_NE.options())
                               .scatter_add(1, r.expert_NK, use_NK.to(at::kFloat));
  at::Tensor f_E = assigned_NE.sum(0) / (num_real * K);
  at::Tensor p_E = (probs_NE * realf).sum(0) / num_real;
  out.aux_loss = static_cast<double>(E) * (f_E.detach() * p_E).sum();
  at::Tensor lse_N = at::logsumexp(r.logits_NE, -1);
  out.z_loss = (lse_N.pow(2) * realf.squeeze(1)).sum() / num_real;

  out.stats.tokens_per_expert = counts_E;
  out.stats.assignments = real.sum() * K;
  out.stats.dropped = out.stats.assignments - counts_E.sum();
  at::Tensor ent_N = -(probs_NE.detach() * probs_NE.detach().clamp_min(1e-12).log()).sum(-1);
  out.stats.router_entropy = (ent_N * realf.squeeze(1)).sum() / num_real;
  return out;
}

MoeStatsHost ReadMoeStats(const MoeStats& s) {
  const at::Tensor v = at::cat({s.tokens_per_expert.to(at::kDouble),
                                s.assignments.reshape({1}).to(at::kDouble),
                                s.dropped.reshape({1}).to(at::kDouble),
                                s.router_entropy.reshape({1}).to(at::kDouble)})
                           .cpu();
  const double* d = v.data_ptr<double>();
  const int64_t E = s.tokens_per_expert.numel();
  MoeStatsHost h;
  for (int64_t e = 0; e < E; ++e) h.tokens_per_expert.push_back(static_cast<int64_t>(d[e]));
  h.assignments = static_cast<int64_t>(d[E]);
  h.dropped = static_cast<int64_t>(d[E + 1]);
  h.router_entropy = d[E + 2];
  return h;
}

void NudgeBias(at::Tensor& bias_E, const std::vector<int64_t>& tokens_per_expert, double rate) {
  double mean = 0;
  for (int64_t n : tokens_per_expert) mean += static_cast<double>(n);
  mean /= static_cast<double>(tokens_per_expert.size());
  std::vector<float> delta(tokens_per_expert.size());
  for (size_t e = 0; e < delta.size(); ++e) {
    const double n = static_cast<double>(tokens_per_expert[e]);
    delta[e] = static_cast<float>(n < mean ? rate : n > mean ? -rate : 0.0);
  }
  at::NoGradGuard no_grad;
  bias_E.add_(Upload(delta, bias_E.device()));
}

}  // namespace tally::model
