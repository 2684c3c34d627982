// FP8 training: linear layers that compute in FP8 with FP32 accumulation.
//
// Design. Forward: input and weight are scaled, clamped to the format's
// finite range and cast to E4M3; backward: the output gradient is cast to
// E5M2. All three products (output, input gradient, weight gradient) take
// FP8 operands and accumulate in FP32; master weights and optimizer state
// stay FP32. Each tensor (input, weight, gradient) of each layer has its own
// per-tensor scale:
// - delayed (Transformer Engine's recipe): scale = max / (amax x 2^margin)
//   with amax the maximum (or the most recent) of an amax history that
//   advances once per optimizer step, not per micro-batch; the first step,
//   with no history yet, scales from the tensor itself;
// - current: scale from the tensor's own amax at every use.
// A zero or non-finite amax leaves the scale unchanged (never infinite).
// Values beyond the range are clamped before the cast (LibTorch turns
// |x| > 448 into NaN when casting to E4M3) and counted as overflows;
// nonzero values that round to zero are counted as underflows.
//
// CPU: the same quantize/dequantize numerics, with FP32 matrix products, so
// CPU tests check what the GPU computes up to accumulation order. CUDA:
// at::_scaled_mm on the FP8 operands (the second column-major, dimensions
// multiples of 16); a shape it cannot take runs in BF16 and is counted.
//
// Not thread-safe: one trainer owns it. Embeddings, norms, softmax and the
// output head never come here.
#ifndef TALLY_WORKER_PRECISION_FP8_H_
#define TALLY_WORKER_PRECISION_FP8_H_

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/model/transformer.h"

namespace tally::precision {

enum class Fp8Format { kE4M3, kE5M2 };
double Fp8Max(Fp8Format format);  // 448 and 57344
at::ScalarType Fp8Dtype(Fp8Format format);

struct QuantStats {
  int64_t overflows = 0;   // |x * scale| beyond the format's range
  int64_t underflows = 0;  // nonzero x that became 0
  int64_t elements = 0;
  // Counts still on the device, [overflows, underflows] (int64): the FP8
  // linears read them once per step, not once per product. The functions
  // below leave none.
  at::Tensor pending;
};

// The FP8 value of x * scale (clamped), as FP32 and not yet divided back.
at::Tensor QuantizeScaled(const at::Tensor& x, double scale, Fp8Format format,
                          QuantStats* stats);
// x through FP8 and back: QuantizeScaled(x) / scale.
at::Tensor QuantizeDequantize(const at::Tensor& x, double scale, Fp8Format format,
                              QuantStats* stats);
// x through FP8 and back with one scale per slice along `dim` (the amax
// over `dim` of each slice, e.g. dim 1 of [M, K]: a scale per row); a zero
// slice keeps scale 1. `scales` gets them (the shape of amax with keepdim).
at::Tensor QuantizeDequantizeAlong(const at::Tensor& x, int64_t dim, Fp8Format format, int margin,
                                   QuantStats* stats, at::Tensor* scales = nullptr);
// max / (amax x 2^margin); `previous` when amax is zero or not finite.
double ScaleForAmax(double amax, Fp8Format format, int margin, double previous);

// kRowwise: current scaling per row instead of per tensor (each token's
// input row, each weight's output row; the backward pass rescales along
// the other axis where a product needs it), as torchao's row-wise recipe.
enum class Recipe { kDelayed, kCurrent, kRowwise };

struct RecipeConfig {
  Recipe recipe = Recipe::kDelayed;
  int history_len = 16;
  int margin = 0;
  bool history_max = true;  // false: the most recent amax
  // MoE expert products (per-tensor recipes): on CUDA each weight's forward
  // product over all experts is one at::_scaled_grouped_mm (E4M3 operands,
  // each expert's per-tensor scales spread over its rows and output
  // channels); the backward pass runs each expert's two products with
  // _scaled_mm. The first grouped product of a run is checked against the
  // per-expert products, and a mismatch or a refusal turns grouping off
  // for the run (grouped_off()). false: a loop over experts throughout.
  bool grouped_experts = true;
  // Tests: the grouped path on CPU too, the grouped product emulated in
  // FP32 from the same FP8 operands and scales.
  bool grouped_on_cpu = false;
  // Tests only (forced overflows, per-tensor recipes): in training passes,
  // this fraction of each linear's input values (every round(1/f)-th) is
  // set beyond the format's range once the input's scale is chosen (amax
  // histories never see it), so it is clamped and counted as an overflow.
  // 0: off.
  double test_overflow_fraction = 0;
};

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

// How many values the FP8 bookkeeping has read back from the device in this
// process (each one a host sync on a GPU): for tests.
int64_t Fp8HostReads();

struct Fp8Stats {
  int64_t overflows = 0;
  int64_t underflows = 0;
  int64_t elements = 0;
  int64_t fp8_products = 0;    // matrix products computed in FP8
  int64_t total_products = 0;  // all products of the converted layers
  int64_t grouped_products = 0;  // expert products run inside grouped ones
  // Latest amax per tensor group: "attention.input", "ffn.grad", ...
  std::map<std::string, double> amax;
  // Still on the device while a step runs (TakeStats reads them, in one
  // go, into the fields above): [overflows, underflows], and amax by group.
  at::Tensor pending_counts;
  std::map<std::string, at::Tensor> pending_amax;
};

// The converter: swaps FP8 in for the transformer's block linears (attention
// projections and feed-forward weights) through model::LinearOverride.
class Fp8Linears final : public model::LinearOverride {
 public:
  explicit Fp8Linears(RecipeConfig config);
  ~Fp8Linears() override;
  at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const std::string& site) override;
  bool Groups(const at::Tensor& x, int64_t out, int64_t in) const override;
  at::Tensor GroupedLinear(const at::Tensor& x_RI, const std::vector<int64_t>& counts,
                           const std::vector<int64_t>& ends, const at::Tensor& w_EOI,
                           const std::vector<std::string>& sites) override;
  // Why grouped expert products were turned off for this run; empty while on.
  const std::string& grouped_off() const { return grouped_off_; }
  void TurnGroupedOff(std::string why);
  // True the first time only: that grouped product gets checked.
  bool FirstGroupedProduct() { return !std::exchange(grouped_checked_, true); }
  // Advances every tensor's amax history; call once per optimizer step.
  void OnOptimizerStep();
  // false while evaluating: products still run in FP8, but nothing is
  // recorded (amax, statistics).
  void SetTraining(bool training) { training_ = training; }
  // Statistics since the previous call (one read from the device).
  Fp8Stats TakeStats();
  // Data parallel: creates the layers of every site up front, so every rank
  // holds the same layers whichever sites its batches reached (an expert
  // with no tokens is never called); then the step's amax of every tensor,
  // in one fixed order, and back.
  void Declare(const std::vector<std::string>& sites);
  std::vector<double> StepAmax();
  void SetStepAmax(const std::vector<double>& amax);
  // Scaling state for checkpoints: (name, tensor) pairs, and back.
  std::vector<std::pair<std::string, at::Tensor>> State() const;
  bool LoadState(const std::map<std::string, at::Tensor>& tensors, std::string* missing);

  struct Layer;
  struct Context {
    Layer* layer;
    Fp8Stats* stats;
    const bool* training;
    const RecipeConfig* config;
  };

 private:
  Layer& LayerFor(const std::string& site);
  // Reads every tensor's amax still on the device, all in one go.
  void ResolvePending();
  RecipeConfig config_;
  std::map<std::string, std::unique_ptr<Layer>> layers_;
  std::map<std::string, Context> contexts_;  // stable addresses for autograd
  Fp8Stats stats_;
  bool training_ = true;
  std::string grouped_off_;
  bool grouped_checked_ = false;
};

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_FP8_H_
