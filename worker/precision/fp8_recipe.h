// An FP8 recipe: how each FP8 tensor's scale is chosen, when it moves and
// whether it lives in checkpoints. The converter (converter.h) asks its
// recipe for a scale before every per-tensor cast and tells it when an
// optimizer step ends; the products themselves are the FP8 linear's
// (linear.h): tensor-wise for per-tensor recipes, row-wise for the row-wise
// one. One file per recipe (delayed_recipe.cc, current_recipe.cc,
// rowwise_recipe.cc), built by MakeFp8Recipe.
#ifndef TALLY_WORKER_PRECISION_FP8_RECIPE_H_
#define TALLY_WORKER_PRECISION_FP8_RECIPE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>

#include "worker/precision/recipe.h"
#include "worker/precision/scaling.h"

namespace tally::precision {

class Fp8Recipe {
 public:
  virtual ~Fp8Recipe() = default;
  virtual Recipe kind() const = 0;
  // Whether checkpoints carry the scaling state (amax histories, scales).
  virtual bool KeepsState() const = 0;
  // One scale per tensor (ScaleFor); false: the row-wise products, which
  // scale every row from itself and keep nothing.
  virtual bool PerTensor() const = 0;
  // The scale a cast of x2 (table tensor t) uses now, on the device, with
  // nothing read by the host. With `record`, x2's amax counts for this
  // step: *cast_records says whether the cast must fold it into the table
  // (the scale was known ahead) or it has been taken already.
  virtual Scale ScaleFor(ScalingTable* table, int64_t t, const at::Tensor& x2, bool record,
                         bool* cast_records) const = 0;
  // Whether tensor t's scale is known before the tensor is seen (so a
  // cast fused into the op that makes the tensor can take it): ScaleFor
  // then reads nothing of x2.
  virtual bool ScaleKnownAhead(const ScalingTable& table, int64_t t) const { return false; }
  // Once per optimizer step, after the step's amax are final.
  virtual void OnOptimizerStep(ScalingTable* table) const = 0;
};

std::unique_ptr<Fp8Recipe> MakeDelayedRecipe();
std::unique_ptr<Fp8Recipe> MakeCurrentRecipe();
std::unique_ptr<Fp8Recipe> MakeRowwiseRecipe();
std::unique_ptr<Fp8Recipe> MakeFp8Recipe(const RecipeConfig& config);

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_FP8_RECIPE_H_
