// FP8 scaling state on the device: ScalingTable holds every FP8 tensor's
// scale, inverse scale, amax history and this step's amax in a few device
// arrays (the layout of kernels/fp8_scaling.h), so casts read their scale
// from device memory, fold their amax in as they run, and one launch per
// optimizer step advances every history. The host keeps only what it knows
// without asking the device: each tensor's format, group and step count,
// and whether its history holds an amax yet (learnt from the step's one
// statistics read, ObserveStep).
//
// Tensors are added as the FP8 layers are declared (all of a model's up
// front; a new one later grows the arrays, copying them on the device).
// Views into the arrays (scale(t), ...) are taken when used, not kept
// across an Add. Not thread-safe: one trainer owns it.
#ifndef TALLY_WORKER_PRECISION_SCALING_H_
#define TALLY_WORKER_PRECISION_SCALING_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

#include "worker/precision/quantize.h"
#include "worker/precision/recipe.h"

namespace tally::precision {

// max / (amax x 2^margin) rounded to FP32; `previous` when amax is zero or
// not finite, or FP32 cannot hold the scale (kernels::ScaleForAmax).
double ScaleForAmax(double amax, Fp8Format format, int margin, double previous);

// The scale a cast uses and the inverse its product dequantizes with: one
// FP32 value each, on the device.
struct Scale {
  at::Tensor scale, inv_scale;
};

class ScalingTable {
 public:
  ScalingTable(const RecipeConfig& config, at::Device device);

  // A new tensor (scale 1, empty history); its index.
  int64_t Add(Fp8Format format);
  int64_t size() const { return static_cast<int64_t>(formats_.size()); }
  Fp8Format format(int64_t t) const { return formats_[t]; }
  at::Device device() const { return device_; }

  // One-element views of tensor t's entries.
  Scale scale(int64_t t) const;
  at::Tensor step_amax(int64_t t) const { return step_amax_.narrow(0, t, 1); }
  at::Tensor step_finite(int64_t t) const { return step_finite_.narrow(0, t, 1); }
  // Every tensor's amax this step: raw (NaN wins) and finite; data-parallel
  // ranks replace the finite one with its maximum over the ranks (in place)
  // before the step's statistics are read.
  const at::Tensor& step_amax() const { return step_amax_; }
  at::Tensor& step_finite() { return step_finite_; }

  // The scale a cast of x2 (tensor t) uses when the scale comes from x2
  // itself (current scaling, and delayed scaling before a history exists):
  // x2's amax, then max / amax (the tensor's stored scale where that gives
  // none), both on the device. With `record`, x2's amax joins the step's.
  Scale ScaleFromItself(int64_t t, const at::Tensor& x2, bool record);

  // Whether tensor t's history holds an amax (so its delayed scale is
  // known before its cast).
  bool has_history(int64_t t) const { return has_history_[t]; }
  // The step's finite amax of every tensor, read by the caller once the
  // ranks agree on it: a tensor that saw a nonzero value gets a history at
  // the next Step (delayed scaling).
  void ObserveStep(const std::vector<double>& step_finite);
  bool observed() const { return observed_; }
  // Delayed scaling, once per optimizer step: every history advances and
  // every scale follows (one kernel), the step's amax is zeroed. Reads the
  // step's amax first (one read) unless ObserveStep did.
  void StepDelayed();
  // Current scaling: the step's amax is zeroed; the scales never move.
  void StepCurrent();

  // Checkpoint state of tensor t, as checkpoints have always held it:
  // Double [history_len + 3]: the history (oldest first, left-aligned),
  // then the scale, the history's length and the steps taken. All tensors
  // in one read.
  std::vector<at::Tensor> State() const;
  // Takes tensor t's state back; false when it is not of that shape, or
  // holds a length or scale no run could have written.
  bool LoadState(int64_t t, const at::Tensor& state);
  // Why `state` is not a valid scaling state for a run of this recipe at
  // checkpoint step `step` (empty when it is).
  std::string Check(const at::Tensor& state, int64_t step) const;

 private:
  void Grow();
  RecipeConfig config_;
  at::Device device_;
  std::vector<Fp8Format> formats_;
  std::vector<bool> has_history_, seen_;
  std::vector<int64_t> steps_;
  bool observed_ = false;
  // [T, H], [T] int32, [T] x 4 FP32, [T] uint8: kernels/fp8_scaling.h.
  at::Tensor history_, count_, scale_, inv_scale_, step_amax_, step_finite_, format_codes_;
};

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_SCALING_H_
