// Current scaling: every cast scales its tensor from that tensor's own amax
// (an amax pass, then the scale, both on the device). Nothing carries from
// one step to the next.
#include "worker/precision/fp8_recipe.h"

namespace tally::precision {
namespace {

class CurrentRecipe final : public Fp8Recipe {
 public:
  Recipe kind() const override { return Recipe::kCurrent; }
  bool KeepsState() const override { return true; }
  bool PerTensor() const override { return true; }
  Scale ScaleFor(ScalingTable* table, int64_t t, const at::Tensor& x2, bool record,
                 bool* cast_records) const override {
    *cast_records = false;
    return table->ScaleFromItself(t, x2, record);
  }
  void OnOptimizerStep(ScalingTable* table) const override { table->StepCurrent(); }
};

}  // namespace

std::unique_ptr<Fp8Recipe> MakeCurrentRecipe() { return std::make_unique<CurrentRecipe>(); }

}  // namespace tally::precision
