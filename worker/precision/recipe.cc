#include "worker/precision/recipe.h"

#include "absl/strings/str_cat.h"

namespace tally::precision {

const char* RecipeName(Recipe recipe) {
  switch (recipe) {
    case Recipe::kDelayed:
      return "delayed";
    case Recipe::kCurrent:
      return "current";
    case Recipe::kRowwise:
      return "rowwise";
  }
  return "unknown";
}

std::vector<std::string> RecipeProblems(const RecipeConfig& c) {
  std::vector<std::string> problems;
  if (!(c.history_len >= 1 && c.history_len <= 1024)) {
    problems.push_back("fp8_recipe.history_len: must be between 1 and 1024");
  }
  if (!(c.margin >= 0 && c.margin <= 8)) {
    problems.push_back("fp8_recipe.margin: must be between 0 and 8");
  }
  const double overflow = c.test_overflow_fraction;
  if (!(overflow >= 0 && overflow <= 1)) {
    problems.push_back(absl::StrCat(
        "fp8_recipe.test_overflow_fraction: must be between 0 and 1, got ", overflow));
  } else if (overflow > 0 && c.recipe == Recipe::kRowwise) {
    problems.push_back(
        "fp8_recipe.test_overflow_fraction: cannot force overflows with the rowwise recipe "
        "(each row is scaled from its own values); use the delayed or current recipe");
  }
  return problems;
}

}  // namespace tally::precision
