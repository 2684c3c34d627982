// What kernels/' tests share: random inputs, and, where CUDA is, whether a
// GPU is present and device copies of host vectors.
#ifndef TALLY_KERNELS_TESTING_H_
#define TALLY_KERNELS_TESTING_H_

#include <cstdint>
#include <random>
#include <vector>

#ifdef TALLY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tally::kernels::test_support {

// n values from N(0, sigma^2), the same for the same seed.
inline std::vector<float> RandomNormal(int64_t n, uint32_t seed, float sigma) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  for (auto& x : v) x = d(rng);
  return v;
}

#ifdef TALLY_HAVE_CUDA
inline bool HaveGpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

// A device copy of v (one byte more, so that an empty vector still gets a
// pointer); the caller frees it with cudaFree.
template <typename T>
T* Upload(const std::vector<T>& v) {
  T* p = nullptr;
  cudaMalloc(&p, v.size() * sizeof(T) + 1);
  cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return p;
}

template <typename T>
std::vector<T> Download(const T* p, size_t n) {
  std::vector<T> v(n);
  cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
  return v;
}
#endif

}  // namespace tally::kernels::test_support

#endif  // TALLY_KERNELS_TESTING_H_
