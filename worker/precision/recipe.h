// The FP8 scaling recipes and their settings (RecipeConfig), apart from the
// code that applies them (fp8_recipe.h), so that a training configuration
// can hold one without ATen.
//
// Adding a recipe: an enum value here (with its name in recipe.cc) and one
// file implementing precision::Fp8Recipe (fp8_recipe.h), registered in
// MakeFp8Recipe.
#ifndef TALLY_WORKER_PRECISION_RECIPE_H_
#define TALLY_WORKER_PRECISION_RECIPE_H_

#include <string>
#include <vector>

namespace tally::precision {

// kDelayed: per-tensor scales from a history of amax values (the previous
// steps'); kCurrent: per-tensor scales from this product's own amax;
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
  // Tests (CPU): the emulation rounds as CUDA's path does: activations and
  // gradients reach their casts in BF16 (autocast's dtype), and every FP8
  // product writes BF16 (at::_scaled_mm's and _scaled_grouped_mm's output),
  // so a CPU reference has CUDA's intermediate precision.
  bool emulate_bf16_intermediates = false;
  // Tests only (forced overflows, per-tensor recipes): in training passes,
  // this fraction of each linear's input values (every round(1/f)-th) is
  // set beyond the format's range once the input's scale is chosen (amax
  // histories never see it), so it is clamped and counted as an overflow.
  // 0: off.
  double test_overflow_fraction = 0;
};

// "delayed", "current", "rowwise": what the spec, fingerprints and reports
// call it.
const char* RecipeName(Recipe recipe);

// What is wrong with `c` for an FP8 run, each naming its field
// ("fp8_recipe.history_len: must be between 1 and 1024"); empty when fine.
std::vector<std::string> RecipeProblems(const RecipeConfig& c);

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_RECIPE_H_
