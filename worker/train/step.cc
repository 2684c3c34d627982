#include "worker/train/step.h"

#include <ATen/core/Reduction.h>
#if defined(TALLY_WITH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace tally::train {

DeviceBatch ToDevice(const data::MicroBatch& b, at::Device device) {
  // On CUDA from pinned memory without waiting: the copies queue on the
  // stream ahead of the passes that read them (the caching host allocator
  // keeps each pinned buffer until its copy is done).
  auto up = [&](at::Tensor t) {
    return device.is_cuda() ? t.pin_memory().to(device, /*non_blocking=*/true) : t;
  };
  auto longs = [&](const std::vector<int64_t>& v, bool shaped) {
    at::Tensor t = at::tensor(v, at::kLong);
    if (shaped) t = t.view({b.rows, b.width});
    return up(t);
  };
  DeviceBatch d;
  d.input.tokens_BT = longs(b.tokens, true);
  d.input.positions_BT = longs(b.positions, true);
  d.input.segments_BT = longs(b.segment_ids, true);
  d.input.cu_seqlens_S = up(at::tensor(b.cu_seqlens, at::kInt));
  d.input.max_seqlen = b.max_seqlen;
  d.input.real_BT = up(at::tensor(std::vector<int64_t>(b.real.begin(), b.real.end()), at::kLong)
                           .view({b.rows, b.width})
                           .to(at::kBool));
  d.targets_N = longs(b.targets, false);
  return d;
}

Losses LossSum(const model::Transformer& m, const DeviceBatch& d, model::AttentionKernel kernel) {
  model::ForwardOutput out = m.Run(d.input, kernel);
  at::Tensor logits_BTV = out.logits_BTV;
  at::Tensor logits_NV = logits_BTV.reshape({-1, logits_BTV.size(-1)});
  return {at::cross_entropy_loss(logits_NV.to(at::kFloat), d.targets_N, {}, at::Reduction::Sum,
                                 data::kIgnoreTarget),
          logits_NV, out.aux_loss, out.z_loss, std::move(out.moe)};
}

at::Tensor DistillKlSum(const at::Tensor& student_NV, const at::Tensor& teacher_NV,
                        const at::Tensor& targets_N, double temperature) {
  // A mask rather than a selection of rows: nothing here waits for the
  // device.
  const at::Tensor has_target_N = targets_N.ne(data::kIgnoreTarget).to(at::kFloat);
  const at::Tensor log_s = at::log_softmax(student_NV.to(at::kFloat) / temperature, -1);
  const at::Tensor log_t =
      at::log_softmax(teacher_NV.detach().to(at::kFloat) / temperature, -1);
  const at::Tensor kl_N = (log_t.exp() * (log_t - log_s)).sum(-1);
  return (kl_N * has_target_N).sum();
}

StepBatch NextStepBatch(const TrainConfig& c, int64_t micro_per_step,
                        const data::Dataset& train, data::RowStream* rows) {
  StepBatch b;
  for (int64_t i = 0; i < micro_per_step; ++i) {
    std::vector<data::Row> next = rows->Next(c.micro_batch_rows);
    for (const data::Row& r : next) {
      for (const data::Segment& seg : r.segments) {
        b.targets += std::max<int32_t>(0, seg.length - 1);
        b.attended_keys += 0.5 * seg.length * (seg.length + 1.0);
      }
    }
    if (i % c.parallel.world_size != c.parallel.rank) continue;
    b.micro.push_back(data::BuildMicroBatch(train, next, c.data.seq_len, c.data.packing));
    b.real_tokens += b.micro.back().real_tokens;
    b.padding_tokens += b.micro.back().padding_tokens;
  }
  return b;
}

namespace {

// CUDA's sync-debug mode set to error while it lives (and put back after):
// a call that waits for the device throws, naming itself.
class SyncCheck {
 public:
  explicit SyncCheck(bool on) : on_(on) {
#if defined(TALLY_WITH_CUDA)
    if (on_) {
      previous_ = c10::cuda::warning_state().get_sync_debug_mode();
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
    }
#endif
  }
  ~SyncCheck() {
#if defined(TALLY_WITH_CUDA)
    if (on_) c10::cuda::warning_state().set_sync_debug_mode(previous_);
#endif
  }

 private:
  bool on_;
#if defined(TALLY_WITH_CUDA)
  c10::cuda::SyncDebugMode previous_ = c10::cuda::SyncDebugMode::L_DISABLED;
#endif
};

}  // namespace

std::optional<StepTotals> ForwardBackward(const TrainConfig& c, int64_t micro_per_step,
                                          const StepBatch& batch, const StepModel& m,
                                          const std::function<bool()>& stop_now) {
  StepTotals t;
  t.real_tokens = batch.real_tokens;
  t.padding_tokens = batch.padding_tokens;
  // Summed on the device (losses in FP64) and read once the step's passes
  // are done: nothing in the passes waits for the host.
  at::Tensor loss_acc = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(m.device));
  at::Tensor aux_acc = at::zeros_like(loss_acc);
  at::Tensor kl_acc = at::zeros_like(loss_acc);
  struct LayerSums {
    at::Tensor tokens_per_expert, assignments, dropped, router_entropy;
  };
  std::map<int64_t, LayerSums> moe;  // by layer
  // The step's batches, all on their way to the device before the first
  // pass (from pinned memory, without waiting, on CUDA).
  std::vector<DeviceBatch> on_device;
  for (const data::MicroBatch& mb : batch.micro) on_device.push_back(ToDevice(mb, m.device));
  {
    const SyncCheck check(m.sync_check && m.device.is_cuda());
    for (size_t mi = 0; mi < batch.micro.size(); ++mi) {
      // The last backward of the step all-reduces buckets as they finish.
      if (m.sync && mi + 1 == batch.micro.size()) m.sync->Arm();
      if (stop_now()) return std::nullopt;
      Losses l = LossSum(*m.model, on_device[mi], m.kernel);
      loss_acc = loss_acc + l.ce_sum.detach().to(at::kDouble);
      const double targets = static_cast<double>(std::max<int64_t>(1, batch.targets));
      at::Tensor loss = l.ce_sum / targets;
      if (m.teacher != nullptr) {
        at::Tensor teacher_NV;
        {
          at::NoGradGuard no_grad;  // inference only: no graph, no gradients
          teacher_NV = m.teacher->Forward(on_device[mi].input, m.kernel);
        }
        teacher_NV = teacher_NV.reshape({-1, teacher_NV.size(-1)});
        const at::Tensor kl = DistillKlSum(l.logits_NV, teacher_NV, on_device[mi].targets_N,
                                           m.temperature);
        kl_acc = kl_acc + kl.detach().to(at::kDouble);
        loss = loss * (1.0 - m.alpha) + kl * (m.alpha * m.temperature * m.temperature / targets);
      }
      if (l.aux.defined()) {
        // The MoE losses are means already: one share per micro-batch.
        const double share = 1.0 / static_cast<double>(micro_per_step);
        loss = loss + (c.optimizer.moe_aux_loss_coef * share) * l.aux +
               (c.optimizer.moe_z_loss_coef * share) * l.z;
        aux_acc = aux_acc + l.aux.detach().to(at::kDouble) * share;
        for (const auto& ls : l.moe) {
          LayerSums& sums = moe[ls.layer];
          const model::MoeStats& st = ls.stats;
          const at::Tensor entropy = st.router_entropy.detach().to(at::kDouble) * share;
          if (!sums.tokens_per_expert.defined()) {
            sums = {st.tokens_per_expert, st.assignments, st.dropped, entropy};
          } else {
            sums = {sums.tokens_per_expert + st.tokens_per_expert,
                    sums.assignments + st.assignments, sums.dropped + st.dropped,
                    sums.router_entropy + entropy};
          }
        }
      }
      loss.backward();
    }
  }
  // One read: the losses, then per MoE layer its counts, assignments,
  // drops and entropy.
  std::vector<at::Tensor> parts = {loss_acc.reshape({1}), aux_acc.reshape({1}),
                                   kl_acc.reshape({1})};
  for (const auto& [layer, sums] : moe) {
    parts.push_back(sums.tokens_per_expert.to(at::kDouble));
    parts.push_back(sums.assignments.to(at::kDouble).reshape({1}));
    parts.push_back(sums.dropped.to(at::kDouble).reshape({1}));
    parts.push_back(sums.router_entropy.reshape({1}));
  }
  const at::Tensor host = at::cat(parts).cpu();
  const double* v = host.data_ptr<double>();
  t.loss_sum = v[0];
  t.aux_loss_sum = v[1];
  t.distill_kl_sum = v[2];
  size_t at = 3;
  for (const auto& [layer, sums] : moe) {
    dist::MoeLayerLoad& load = t.moe[layer];
    const int64_t E = sums.tokens_per_expert.numel();
    for (int64_t e = 0; e < E; ++e) load.tokens_per_expert.push_back(static_cast<int64_t>(v[at++]));
    load.assignments = static_cast<int64_t>(v[at++]);
    load.dropped = static_cast<int64_t>(v[at++]);
    load.router_entropy = v[at++];
  }
  return t;
}

double ShardedGradSquareSum(const std::vector<model::Parameter>& params) {
  std::vector<at::Tensor> squares;
  for (const auto& p : params) {
    if (p.sharded && p.value.grad().defined()) {
      squares.push_back(p.value.grad().to(at::kDouble).square().sum());
    }
  }
  return squares.empty() ? 0.0 : at::stack(squares).sum().item<double>();  // one read
}

void ReportMoeLoads(const std::map<int64_t, dist::MoeLayerLoad>& moe, StepMetrics* m) {
  for (const auto& [layer, load] : moe) {
    StepMetrics::MoeLayer out;
    out.layer = layer;
    out.tokens_per_expert = load.tokens_per_expert;
    out.router_entropy = load.router_entropy;
    int64_t total = 0, max = 0;
    for (int64_t n : out.tokens_per_expert) total += n, max = std::max(max, n);
    const double mean = static_cast<double>(total) / out.tokens_per_expert.size();
    out.max_over_mean_load = mean > 0 ? max / mean : 0;
    out.dropped_fraction =
        load.assignments ? static_cast<double>(load.dropped) / load.assignments : 0;
    m->moe_max_over_mean_load = std::max(m->moe_max_over_mean_load, out.max_over_mean_load);
    m->moe.push_back(std::move(out));
  }
}

Fp8Health Fp8Report(const precision::Fp8Stats& st, StepMetrics* m) {
  m->fp8_overflows = st.overflows;
  m->fp8_underflows = st.underflows;
  m->fp8_values = st.elements;
  m->fp8_product_fraction =
      st.total_products ? static_cast<double>(st.fp8_products) / st.total_products : 0;
  Fp8Health h;
  for (const auto& [group, amax] : st.amax) {
    m->fp8_amax.emplace_back(group, amax);
    h.amax_finite = h.amax_finite && std::isfinite(amax);
  }
  h.overflow_fraction = st.elements ? static_cast<double>(st.overflows) / st.elements : 0;
  return h;
}

}  // namespace tally::train
