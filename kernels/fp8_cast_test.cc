// The FP8 cast: the CPU reference against the format's definition, and the
// CUDA kernel against the reference (skipped where there is no GPU).
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/fp8_cast.h"

#ifdef TALLY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tally::kernels {
namespace {

TEST(Fp8CastReference, KnownValuesSaturationAndTies) {
  EXPECT_EQ(FloatToE4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToE4M3(-2.0f), 0xc0);
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4M3(1000.0f), 0x7e);   // saturates, never NaN
  EXPECT_EQ(FloatToE4M3(-1e30f), 0xfe);
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(FloatToE4M3(std::ldexp(0.5f, -9)), 0x00);  // tie: to even (0)
  EXPECT_EQ(FloatToE4M3(std::ldexp(1.5f, -9)), 0x02);  // tie: to even (2)
  EXPECT_EQ(FloatToE4M3(1.0625f), 0x38);   // halfway 1.0 / 1.125: even mantissa
  EXPECT_EQ(FloatToE4M3(1.1875f), 0x3a);   // halfway 1.125 / 1.25: even mantissa
  EXPECT_EQ(FloatToE4M3(std::nanf("")), 0x7f);
  EXPECT_TRUE(std::isnan(E4M3ToFloat(0x7f)));
  EXPECT_EQ(E4M3ToFloat(0x7e), 448.0f);
}

TEST(Fp8CastReference, CountsClampedAndFlushedValues) {
  const std::vector<float> x = {1.0f, 500.0f, -1000.0f, 448.0f, 1e-6f, 0.0f, -2e-7f};
  std::vector<uint8_t> y(x.size());
  float amax = 0;
  uint64_t counts[2] = {0, 0};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax, counts);
  EXPECT_EQ(amax, 1000.0f);
  EXPECT_EQ(counts[0], 2u);  // 500 and -1000 clamp; 448 is the max itself
  EXPECT_EQ(counts[1], 2u);  // 1e-6 and -2e-7 flush to zero; 0 is not counted
}

TEST(Fp8CastReference, EveryValueRoundTripsAndRoundingIsNearest) {
  std::vector<float> grid;
  for (int b = 0; b < 256; ++b) {
    const float v = E4M3ToFloat(static_cast<uint8_t>(b));
    if (std::isnan(v)) continue;
    if (v != 0.0f || b == 0) EXPECT_EQ(FloatToE4M3(v), b) << b;
    grid.push_back(v);
  }
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 50.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = dist(rng) * (i % 3 == 0 ? 1e-3f : 1.0f);
    const float q = E4M3ToFloat(FloatToE4M3(x));
    float best = 1e30f;
    for (float g : grid) best = std::min(best, std::fabs(g - std::clamp(x, -448.0f, 448.0f)));
    ASSERT_EQ(std::fabs(q - std::clamp(x, -448.0f, 448.0f)), best) << x;
  }
}

TEST(Fp8CastReference, AmaxIgnoresNaNAndIsOfTheInput) {
  std::vector<float> x = {1.0f, -7.5f, std::nanf(""), 3.0f};
  std::vector<uint8_t> y(x.size());
  float amax = -1;
  CastToE4M3Reference(x.data(), x.size(), 100.0f, y.data(), &amax);
  EXPECT_EQ(amax, 7.5f);
  EXPECT_EQ(y[1], FloatToE4M3(-750.0f));
  EXPECT_EQ(y[1], 0xfe);  // -750 saturates
}

#ifdef TALLY_HAVE_CUDA
TEST(Fp8CastGpu, MatchesTheReferenceBitForBit) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    GTEST_SKIP() << "needs a GPU (none here)";
  }
  const int64_t n = (1 << 20) + 37;
  std::vector<float> x(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (auto& v : x) v = dist(rng);
  std::vector<uint8_t> want(n), got(n);
  float want_amax = 0, got_amax = 0;
  uint64_t want_counts[2] = {0, 0}, got_counts[2] = {0, 0};
  CastToE4M3Reference(x.data(), n, 37.5f, want.data(), &want_amax, want_counts);
  ASSERT_GT(want_counts[0], 0u);  // 37.5 x 3 sigma passes 448: some clamp
  float *dx = nullptr, *damax = nullptr;
  uint8_t* dy = nullptr;
  uint64_t* dcounts = nullptr;
  ASSERT_EQ(cudaMalloc(&dcounts, 2 * sizeof(uint64_t)), cudaSuccess);
  cudaMemset(dcounts, 0, 2 * sizeof(uint64_t));
  ASSERT_EQ(cudaMalloc(&dx, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dy, n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&damax, sizeof(float)), cudaSuccess);
  cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemset(damax, 0, sizeof(float));
  ASSERT_EQ(CastToE4M3Cuda(dx, n, 37.5f, dy, damax, nullptr, dcounts), "");
  cudaMemcpy(got_counts, dcounts, 2 * sizeof(uint64_t), cudaMemcpyDeviceToHost);
  cudaFree(dcounts);
  cudaMemcpy(got.data(), dy, n, cudaMemcpyDeviceToHost);
  cudaMemcpy(&got_amax, damax, sizeof(float), cudaMemcpyDeviceToHost);
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(damax);
  EXPECT_EQ(got, want);
  EXPECT_EQ(got_amax, want_amax);
  EXPECT_EQ(got_counts[0], want_counts[0]);
  EXPECT_EQ(got_counts[1], want_counts[1]);
}
#endif

}  // namespace
}  // namespace tally::kernels
