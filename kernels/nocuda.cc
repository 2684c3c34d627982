// Builds without nvcc: the kernels are absent and say so (their CPU
// references are in the *_reference.cc files).
#include "kernels/elementwise.h"
#include "kernels/fp8_cast.h"
#include "kernels/fp8_scaling.h"
#include "kernels/fused_cast.h"
#include "kernels/rowwise_cast.h"

namespace tally::kernels {
namespace {

constexpr char kNoCuda[] = "this build has no CUDA kernels (nvcc was not found at configure time)";

}  // namespace

std::string CastCuda(const CastArgs&, void*) { return kNoCuda; }
std::string RmsNormCastCuda(const RmsNormCastArgs&, void*) { return kNoCuda; }
std::string SwiGluCastCuda(const SwiGluCastArgs&, void*) { return kNoCuda; }
std::string RowwiseCastCuda(const RowwiseCastArgs&, void*) { return kNoCuda; }
std::string DelayedScalingStepCuda(const ScalingState&, const ScalingRecipe&, void*) {
  return kNoCuda;
}
std::string ScaleFromAmaxCuda(const float*, const uint8_t*, int64_t, int, float*, float*, void*) {
  return kNoCuda;
}
std::string SwiGluForwardCuda(const void*, Dtype, int64_t, int64_t, void*, void*) {
  return kNoCuda;
}
std::string SwiGluBackwardCuda(const void*, const void*, Dtype, int64_t, int64_t, void*, void*) {
  return kNoCuda;
}
std::string RopeForwardCuda(const RopeArgs&, const void*, void*, void*, void*, void*) {
  return kNoCuda;
}
std::string RopeBackwardCuda(const RopeArgs&, const void*, const void*, const void*, void*,
                             void*) {
  return kNoCuda;
}

}  // namespace tally::kernels
