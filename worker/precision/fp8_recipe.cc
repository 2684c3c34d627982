#include "worker/precision/fp8_recipe.h"

namespace tally::precision {

std::unique_ptr<Fp8Recipe> MakeFp8Recipe(const RecipeConfig& config) {
  switch (config.recipe) {
    case Recipe::kCurrent:
      return MakeCurrentRecipe();
    case Recipe::kRowwise:
      return MakeRowwiseRecipe();
    case Recipe::kDelayed:
      break;
  }
  return MakeDelayedRecipe();
}

}  // namespace tally::precision
