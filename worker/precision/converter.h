// The FP8 converter: applies FP8 to a built model by swapping itself in for
// the transformer's block linears (attention projections and feed-forward
// weights) through model::LinearOverride, and for the MoE experts' products
// through its grouped hook (grouped.h). It owns the recipe (fp8_recipe.h),
// every FP8 tensor's scaling state (a ScalingTable on the model's device),
// the casts (each tensor's FP8 image: a weight's once per optimizer step, a
// shared input once), the statistics of every FP8 product, and carries the
// scaling state through checkpoints and across data-parallel ranks
// (torchtitan's Float8LinearConverter).
//
// Host reads: none while a step's products run; one per step for the
// statistics (TakeStats), none when the histories advance (OnOptimizerStep
// after TakeStats), one per checkpoint (State).
//
// Fused casts (kernels/fused_cast.h): the SwiGLU's into w2 (SwiGluLinear)
// where the scale is known ahead. Not yet the RMSNorm's into wq|wk|wv and
// w1|w3: that needs a model hook that hands over the norm's input and gain
// with the weight (the model calls Norm, then Linear), an autograd function
// whose backward runs the FP8 products and then the norm's backward from x
// and rstd (dx = rstd (g gain - x rstd^2 mean(g gain x)), dgain = the sum
// over rows of g x rstd), y_dtype FP32 (the FP8 linears cast at::rms_norm's
// FP32 output today), the unfused path where the scale is not known ahead,
// and none in MoE layers (their router reads the norm's output).
//
// Not thread-safe: one trainer owns it. Embeddings, norms, softmax and the
// output head never come here.
#ifndef TALLY_WORKER_PRECISION_CONVERTER_H_
#define TALLY_WORKER_PRECISION_CONVERTER_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/transformer.h"
#include "worker/precision/fp8_recipe.h"
#include "worker/precision/linear.h"
#include "worker/precision/scaling.h"

namespace tally::precision {

// FP8 for a built model's block linears and expert products, installed as
// its model::LinearOverride (and, for the experts' grouped products, its
// model::GroupedLinearOverride).
class Fp8Linears final : public model::LinearOverride, public model::GroupedLinearOverride {
 public:
  // The scaling state lives on `device` (the model's).
  explicit Fp8Linears(RecipeConfig config, at::Device device = at::kCPU);
  ~Fp8Linears() override;
  at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const std::string& site) override;
  // w1 and w3 as one FP8 product (Fp8GateUpLinear): one cast of x, one
  // product; the row-wise recipe takes the two products.
  at::Tensor GateUpLinear(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w3,
                          const std::string& site1, const std::string& site3) override;
  bool Groups(const at::Tensor& x, int64_t out, int64_t in) const override;
  at::Tensor GroupedLinear(const at::Tensor& x_RI, const std::vector<int64_t>& counts,
                           const std::vector<int64_t>& ends, const at::Tensor& w_EOI,
                           const std::vector<std::string>& sites) override;
  // The fused SwiGLU of y13 (w1|w3's output) into w2 (Fp8SwiGluLinear):
  // SwiGLU and the FP8 cast of its output in one pass where the scale is
  // known ahead, else the fused SwiGLU and w2's FP8 linear.
  at::Tensor SwiGluLinear(const at::Tensor& y13, const at::Tensor& w2,
                          const std::string& site) override;
  // Why grouped expert products were turned off for this run; empty while on.
  const std::string& grouped_off() const { return grouped_off_; }
  void TurnGroupedOff(std::string why);
  // True the first time only: that grouped product gets checked.
  bool FirstGroupedProduct() { return !std::exchange(grouped_checked_, true); }
  // Once per optimizer step: the recipe advances every tensor's scaling
  // (delayed: one kernel over every history) and the weights' FP8 images
  // are dropped (the weights are about to move).
  void OnOptimizerStep();
  // false while evaluating: products still run in FP8, but nothing is
  // recorded (amax, statistics).
  void SetTraining(bool training);
  // Creates the layers of these sites now (a model's LinearSites(), before
  // its first step), so every rank holds the same scaling state in the same
  // order whichever sites its batches reached; a site first seen later is
  // added then.
  void Declare(const std::vector<std::string>& sites);
  // Data parallel: every tensor's finite step amax, to be replaced in place
  // by its maximum over the ranks before TakeStats.
  at::Tensor& StepAmaxToReduce() { return table_.step_finite(); }
  // Statistics since the previous call, in one read from the device; the
  // delayed recipe learns from it which tensors now have a history.
  Fp8Stats TakeStats();
  // Scaling state for checkpoints: ("fp8.<site>.{input,weight,grad}",
  // Double [history_len + 3]) pairs in one read, and back; empty for a
  // recipe that keeps none.
  std::vector<std::pair<std::string, at::Tensor>> State();
  // Checks a checkpoint's "fp8.*" tensors against this model's sites and
  // recipe (names, shapes, values, steps at most `step`) before anything is
  // loaded: InvalidArgument naming the tensor.
  absl::Status CheckState(const std::map<std::string, at::Tensor>& tensors,
                          const std::vector<std::string>& sites, int64_t step) const;
  bool LoadState(const std::map<std::string, at::Tensor>& tensors, std::string* bad);

  const RecipeConfig& config() const { return config_; }
  // Whether the recipe scales per tensor (not row-wise).
  bool per_tensor() const { return recipe_->PerTensor(); }
  bool training() const { return training_; }

  // For the products (linear.cc, grouped.cc, rowwise_recipe.cc) only.
  Fp8Layer& LayerFor(const std::string& site);
  // x2's image as input of `layer` (E4M3): the one kept for this entry
  // when x2 is the input it was cast from (the same storage, view and
  // version; it is then handed over and no longer kept), else a new cast,
  // kept for the next reader of the entry only when `read_again` (w1 or
  // w3, the other of which reads it too). Nothing here keeps x2 itself
  // alive.
  Fp8Image InputImage(const Fp8Layer& layer, const at::Tensor& x2, bool read_again);
  // w's image (E4M3, row-major and transposed), cast at its first use in an
  // optimizer step and reused until the next.
  Fp8Image WeightImage(const Fp8Layer& layer, const at::Tensor& w);
  // w1's and w3's images for their joint product (linear.h
  // Fp8GateUpLinear): each cast under its own scale and cached as
  // WeightImage caches it, their row-major bytes the two row blocks of one
  // [2F, K] image `data` (CPU: `dequantized` likewise), and `inv_scale_row`
  // [1, 2F] FP32, each output channel's inverse scale.
  struct JointWeight {
    Fp8Image w1, w3;
    at::Tensor data, dequantized, inv_scale_row;
  };
  const JointWeight& JointWeightImage(const Fp8Layer& layer1, const at::Tensor& w1,
                                      const Fp8Layer& layer3, const at::Tensor& w3);
  // Whether SwiGluInputImage can cast `layer`'s input in the SwiGLU's own
  // pass: a per-tensor scale known ahead (delayed scaling once the entry
  // has a history), and no forced overflows.
  bool SwiGluCastAhead(const Fp8Layer& layer) const;
  // The image of silu(a) * b for y13 = [a | b] ([..., 2F], FP32 or BF16) as
  // `layer`'s input (E4M3, row-major and, on CUDA, transposed), computed
  // and cast in one pass (kernels/fused_cast.h SwiGluCast): what Cast
  // would make of the SwiGLU's output, with its statistics and amax. Only
  // where SwiGluCastAhead.
  Fp8Image SwiGluInputImage(const Fp8Layer& layer, const at::Tensor& y13);
  // An output gradient's image (E5M2, row-major and transposed).
  Fp8Image GradImage(const Fp8Layer& layer, const at::Tensor& g2);
  // Row-wise recipe: w's two row-wise images, cast at its first use in an
  // optimizer step and reused until the next.
  const internal::RowwiseWeight& RowwiseWeightImage(const Fp8Layer& layer, const at::Tensor& w);
  // Adds to the step's statistics (no-ops while evaluating): products, and
  // device counts and amax from a row-wise cast.
  void CountProducts(int64_t total, int64_t fp8, int64_t grouped = 0);
  void AddRowwise(const QuantStats& q);
  void ReportRowwiseAmax(const std::string& group, const at::Tensor& amax);

 private:
  // One cast of x2 for table entry t: rows/transposed as the products need.
  // `activation`: an input or a gradient (not a weight).
  // `rows_into`: where the row-major bytes go (CastFp8's).
  Fp8Image Cast(int64_t t, const at::Tensor& x2, bool force_overflows, bool activation,
                const at::Tensor& rows_into = {});
  // Whether a cache entry made from `cached` at `version` is w's.
  static bool Fresh(const at::Tensor& cached, int64_t version, const at::Tensor& w);
  void NoteUsed(int64_t t);
  RecipeConfig config_;
  std::unique_ptr<Fp8Recipe> recipe_;
  ScalingTable table_;
  std::map<std::string, std::unique_ptr<Fp8Layer>> layers_;  // stable addresses
  std::vector<std::string> groups_;  // by table entry: "ffn.input", ...
  std::vector<bool> used_;           // by table entry, this step
  // Counts of every cast this step, [clamped, flushed], on the device.
  at::Tensor counts_;
  Fp8Stats stats_;  // the host-side counts
  std::map<std::string, at::Tensor> rowwise_amax_;
  struct CachedWeight {
    at::Tensor weight;  // kept, so its address is not reused
    int64_t version = 0;
    Fp8Image image;
  };
  std::map<int64_t, CachedWeight> weights_;  // by weight entry
  struct CachedJointWeight {
    at::Tensor w1, w3;
    int64_t version1 = 0, version3 = 0;
    JointWeight image;
  };
  std::map<int64_t, CachedJointWeight> joint_weights_;  // by w1's weight entry
  struct CachedRowwiseWeight {
    at::Tensor weight;
    int64_t version = 0;
    internal::RowwiseWeight image;
  };
  std::map<int64_t, CachedRowwiseWeight> rowwise_weights_;  // by weight entry
  // By input entry, w1's (or w3's) input cast until the other takes it.
  // The input is known by a weak reference to its storage, its view and
  // its version, so a high-precision activation is never kept alive here;
  // what is kept is FP8 bytes, for the moment between the two products.
  struct KeptInput {
    c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::intrusive_ptr<c10::StorageImpl>()};
    int64_t offset = 0;
    std::vector<int64_t> sizes, strides;
    at::ScalarType dtype = at::kFloat;
    int64_t version = 0;
    Fp8Image image;
  };
  std::map<int64_t, KeptInput> kept_inputs_;
  bool training_ = true;
  std::string grouped_off_;
  bool grouped_checked_ = false;
};

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_CONVERTER_H_
