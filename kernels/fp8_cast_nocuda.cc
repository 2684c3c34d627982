// Builds without nvcc: the kernel is absent and says so.
#include "kernels/fp8_cast.h"

namespace tally::kernels {

std::string CastToE4M3Cuda(const float*, int64_t, float, uint8_t*, float*, void*, uint64_t*) {
  return "this build has no CUDA kernels (nvcc was not found at configure time)";
}

}  // namespace tally::kernels
