// Delayed scaling (Transformer Engine's recipe): a tensor's scale comes from
// the amax history of the optimizer steps before this one (its maximum, or
// its newest entry), so it is known before the tensor is seen and the cast
// records the amax as it goes; the first step, with no history yet, scales
// each tensor from itself. The histories advance once per optimizer step,
// not per micro-batch, and live in checkpoints.
#include "worker/precision/fp8_recipe.h"

namespace tally::precision {
namespace {

class DelayedRecipe final : public Fp8Recipe {
 public:
  Recipe kind() const override { return Recipe::kDelayed; }
  bool KeepsState() const override { return true; }
  bool PerTensor() const override { return true; }
  Scale ScaleFor(ScalingTable* table, int64_t t, const at::Tensor& x2, bool record,
                 bool* cast_records) const override {
    if (table->has_history(t)) {
      *cast_records = record;
      return table->scale(t);
    }
    *cast_records = false;
    return table->ScaleFromItself(t, x2, record);
  }
  bool ScaleKnownAhead(const ScalingTable& table, int64_t t) const override {
    return table.has_history(t);
  }
  void OnOptimizerStep(ScalingTable* table) const override { table->StepDelayed(); }
};

}  // namespace

std::unique_ptr<Fp8Recipe> MakeDelayedRecipe() { return std::make_unique<DelayedRecipe>(); }

}  // namespace tally::precision
