// Builds without nvcc: the kernels are absent and say so.
#include "kernels/moe_permute.h"

namespace tally::kernels {

std::string PermuteCuda(const int32_t*, int32_t, int32_t, int32_t, int32_t*, int32_t*, void*) {
  return "this build has no CUDA kernels (nvcc was not found at configure time)";
}
std::string UnpermuteCuda(const float*, const float*, const int32_t*, int32_t, int32_t, int32_t,
                          float*, void*) {
  return "this build has no CUDA kernels (nvcc was not found at configure time)";
}

}  // namespace tally::kernels
