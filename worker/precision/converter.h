// The FP8 converter: applies FP8 to a built model by swapping itself in for
// the transformer's block linears (attention projections and feed-forward
// weights) through model::LinearOverride, and for the MoE experts' products
// through its grouped hook (grouped.h). It owns each site's scaling state
// (Fp8Layer, linear.h), created on first use, advances the amax histories
// once per optimizer step, collects the statistics of every FP8 product and
// carries the scaling state through checkpoints and across data-parallel
// ranks (torchtitan's Float8LinearConverter).
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

#include "worker/model/transformer.h"
#include "worker/precision/linear.h"
#include "worker/precision/scaling.h"

namespace tally::precision {

// FP8 for a built model's block linears and expert products, installed as
// its model::LinearOverride (and, for the experts' grouped products, its
// model::GroupedLinearOverride).
class Fp8Linears final : public model::LinearOverride, public model::GroupedLinearOverride {
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

  using Layer = Fp8Layer;
  using Context = Fp8Context;

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

#endif  // TALLY_WORKER_PRECISION_CONVERTER_H_
