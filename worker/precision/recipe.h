// The FP8 scaling recipes, apart from the code that applies them, so that a
// training configuration can name one without ATen.
#ifndef TALLY_WORKER_PRECISION_RECIPE_H_
#define TALLY_WORKER_PRECISION_RECIPE_H_

namespace tally::precision {

// kDelayed: per-tensor scales from a history of amax values (the previous
// steps'); kCurrent: per-tensor scales from this product's own amax;
// kRowwise: current scaling per row instead of per tensor (each token's
// input row, each weight's output row; the backward pass rescales along
// the other axis where a product needs it), as torchao's row-wise recipe.
enum class Recipe { kDelayed, kCurrent, kRowwise };

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_RECIPE_H_
