// FP8 scaling: the recipe (RecipeConfig) and each tensor's scale under it
// (TensorScaling). Each tensor (input, weight, gradient) of each layer has
// its own per-tensor scale:
// - delayed (Transformer Engine's recipe): scale = max / (amax x 2^margin)
//   with amax the maximum (or the most recent) of an amax history that
//   advances once per optimizer step, not per micro-batch; the first step,
//   with no history yet, scales from the tensor itself;
// - current: scale from the tensor's own amax at every use;
// - row-wise: current scaling per row (quantize.h's QuantizeDequantizeAlong),
//   with no state here.
// A zero or non-finite amax leaves the scale unchanged (never infinite).
// The scaling state goes into checkpoints (TensorScaling::State). Not
// thread-safe: one trainer owns it.
#ifndef TALLY_WORKER_PRECISION_SCALING_H_
#define TALLY_WORKER_PRECISION_SCALING_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "worker/precision/quantize.h"
#include "worker/precision/recipe.h"

namespace tally::precision {

// max / (amax x 2^margin); `previous` when amax is zero or not finite.
double ScaleForAmax(double amax, Fp8Format format, int margin, double previous);



// One tensor's scaling state.
class TensorScaling {
 public:
  TensorScaling(Fp8Format format, const RecipeConfig& config);
  // The scale to use for `x` now; with `record`, x's amax counts for this
  // step (evaluation passes do not record, so they never move the scales).
  double ScaleFor(const at::Tensor& x, bool record = true);
  // Once per optimizer step: the step's amax joins the history.
  void Step();
  Fp8Format format() const { return format_; }
  double scale() const { return scale_; }
  // The latest and the step's amax as read so far: with amax recorded on
  // the device (below) they hold only once Resolve has run.
  double last_amax() const { return last_amax_; }
  // The largest amax recorded since the last Step(); data-parallel ranks
  // replace it with the maximum over ranks before stepping.
  double step_amax() const { return step_amax_; }
  // Delayed scaling with a history: the scale is fixed before the tensor is
  // seen, so nothing needs the amax now. ScaleFor then records it on the
  // device without reading it, and a cast that computes it in the same
  // pass hands it over here.
  bool ScaleKnownAhead() const;
  void RecordAmax(const at::Tensor& amax);  // a one-element tensor, any device
  void set_step_amax(double amax) { step_amax_ = amax; }
  // The amax recorded on the device and not yet read: the latest, and the
  // step's largest finite one (undefined when none).
  const at::Tensor& pending_last() const { return pending_last_; }
  const at::Tensor& pending_step() const { return pending_step_; }
  // Takes those two values, read by the caller, and clears them.
  void Resolve(double last, double step);
  // history (history_len), then scale, step amax, steps: for checkpoints.
  at::Tensor State() const;
  bool LoadState(const at::Tensor& state);

 private:
  Fp8Format format_;
  RecipeConfig config_;
  std::vector<double> history_;  // newest last
  double scale_ = 1.0;
  double step_amax_ = 0;
  double last_amax_ = 0;
  at::Tensor pending_last_, pending_step_;
  int64_t steps_ = 0;
};

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_SCALING_H_
