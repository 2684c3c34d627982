// Builds without nvcc: the kernels are absent and say so.
#include "kernels/fp8_cast.h"
#include "kernels/fp8_scaling.h"

namespace tally::kernels {
namespace {

constexpr char kNoCuda[] = "this build has no CUDA kernels (nvcc was not found at configure time)";

}  // namespace

std::string CastCuda(const CastArgs&, void*) { return kNoCuda; }
std::string DelayedScalingStepCuda(const ScalingState&, const ScalingRecipe&, void*) {
  return kNoCuda;
}
std::string ScaleFromAmaxCuda(const float*, const uint8_t*, int64_t, int, float*, float*, void*) {
  return kNoCuda;
}

}  // namespace tally::kernels
