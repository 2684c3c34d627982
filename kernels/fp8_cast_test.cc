// The FP8 cast: the CPU reference against the format's definition, and the
// CUDA kernel against the reference (skipped where there is no GPU).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/fp8_cast.h"

#ifdef TALLY_HAVE_CUDA
#include <cuda_fp8.h>
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

float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint32_t Bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

TEST(Fp8CastReference, AmaxIsOfTheInputAndPropagatesNaNAndInf) {
  std::vector<float> x = {1.0f, -7.5f, 3.0f};
  std::vector<uint8_t> y(x.size());
  float amax = -1;
  CastToE4M3Reference(x.data(), x.size(), 100.0f, y.data(), &amax);
  EXPECT_EQ(amax, 7.5f);  // before scaling
  EXPECT_EQ(y[1], FloatToE4M3(-750.0f));
  EXPECT_EQ(y[1], 0xfe);  // -750 saturates

  // Any infinity (no NaN): +Inf, as ATen's max of |x|.
  x = {1.0f, -std::numeric_limits<float>::infinity(), 3.0f};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax);
  EXPECT_EQ(amax, std::numeric_limits<float>::infinity());
  EXPECT_EQ(y[1], 0xfe);  // saturates, never NaN

  // A NaN anywhere, even beside an infinity, first or last: NaN. Of two
  // NaNs the largest bit pattern, sign cleared (what the kernel's atomicMax
  // on bits leaves).
  const float nan_a = FromBits(0x7fc00001u), nan_b = FromBits(0xffc12345u);
  for (const std::vector<float>& v :
       {std::vector<float>{nan_a, 1.0f, 2.0f}, std::vector<float>{1.0f, 2.0f, nan_a},
        std::vector<float>{std::numeric_limits<float>::infinity(), nan_a, 5.0f}}) {
    y.resize(v.size());
    CastToE4M3Reference(v.data(), v.size(), 1.0f, y.data(), &amax);
    EXPECT_TRUE(std::isnan(amax));
    EXPECT_EQ(Bits(amax), 0x7fc00001u);
  }
  x = {nan_a, -3.0f, nan_b};
  uint64_t counts[2] = {0, 0};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax, counts);
  EXPECT_EQ(Bits(amax), 0x7fc12345u);
  EXPECT_EQ(y[0], 0x7f);
  EXPECT_EQ(y[2], 0x7f);
  EXPECT_EQ(counts[0], 0u);  // NaN is neither clamped
  EXPECT_EQ(counts[1], 0u);  // nor flushed

  // -0 and zeros: amax +0.
  x = {-0.0f, 0.0f};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax);
  EXPECT_EQ(Bits(amax), 0u);
}

TEST(Fp8CastReference, OverflowBoundIsTheTrainersAndExact) {
  // 448 x (1 + 1e-6) in double, rounded to FP32: 448 + 15 ulps (an ulp at
  // 448 is 2^-15).
  EXPECT_EQ(kE4M3OverflowBound, 448.0f + 15 * std::ldexp(1.0f, -15));
  EXPECT_EQ(kE4M3OverflowBound, static_cast<float>(448.0 * (1 + 1e-6)));
  const float at = kE4M3OverflowBound;
  const float below = std::nextafter(at, 0.0f), above = std::nextafter(at, 1e9f);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {448.0f, below, at, above, -above, -at, inf, -inf};
  std::vector<uint8_t> y(x.size());
  float amax = 0;
  uint64_t counts[2] = {0, 0};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax, counts);
  EXPECT_EQ(counts[0], 4u);  // above, -above, Inf, -Inf: the bound itself is not
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(y[i] & 0x7f, 0x7e) << x[i];
  // The same through the scale: the FP32 product is what is compared.
  const std::vector<float> half = {at / 2, above / 2};
  counts[0] = counts[1] = 0;
  CastToE4M3Reference(half.data(), half.size(), 2.0f, y.data(), &amax, counts);
  EXPECT_EQ(counts[0], 1u);
}

TEST(Fp8CastReference, DenormalInputsAreFlushedAndCounted) {
  const float denormal = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {denormal, -1e-40f, std::ldexp(1.0f, -10), std::ldexp(1.0f, -9)};
  std::vector<uint8_t> y(x.size());
  float amax = 0;
  uint64_t counts[2] = {0, 0};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax, counts);
  EXPECT_EQ(y[0], 0x00);
  EXPECT_EQ(y[1], 0x80);
  EXPECT_EQ(y[2], 0x00);  // half the smallest subnormal: a tie, to even (0)
  EXPECT_EQ(y[3], 0x01);
  EXPECT_EQ(counts[1], 3u);
  EXPECT_EQ(amax, std::ldexp(1.0f, -9));
}

#ifdef TALLY_HAVE_CUDA
// The kernel converts with __nv_cvt_float_to_fp8; cuda_fp8.hpp's host
// version of it is written to give the hardware conversion's result, so the
// reference is checked against it here, without a GPU: every value within
// a few ulps of each E4M3 value and of each midpoint between two, the
// saturation region, and a sweep of FP32 bit patterns. NaN: any E4M3 NaN.
TEST(Fp8CastReference, MatchesCudasConversion) {
  std::vector<float> probes;
  for (int b = 0; b < 127; ++b) {
    const float v = E4M3ToFloat(static_cast<uint8_t>(b));
    const float next = b < 126 ? E4M3ToFloat(static_cast<uint8_t>(b + 1)) : 480.0f;
    for (float centre : {v, (v + next) / 2}) {
      float lo = centre, hi = centre;
      for (int k = 0; k < 4; ++k) {
        lo = std::nextafter(lo, -1e9f);
        hi = std::nextafter(hi, 1e9f);
      }
      for (float p = lo; p <= hi; p = std::nextafter(p, 1e9f)) probes.push_back(p);
    }
  }
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 4099) {
    probes.push_back(FromBits(static_cast<uint32_t>(bits)));
  }
  probes.push_back(std::numeric_limits<float>::infinity());
  probes.push_back(std::numeric_limits<float>::quiet_NaN());
  ASSERT_GT(probes.size(), 1000000u);
  int mismatches = 0;
  for (float p : probes) {
    for (float x : {p, -p}) {
      const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
      const uint8_t got = FloatToE4M3(x);
      const bool ok = std::isnan(x) ? (want & 0x7f) == 0x7f && (got & 0x7f) == 0x7f : got == want;
      if (!ok && ++mismatches <= 10) {
        ADD_FAILURE() << "x = " << x << " (bits " << std::hex << Bits(x) << "): reference "
                      << int{got} << ", CUDA " << int{want};
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}
#endif

#ifdef TALLY_HAVE_CUDA
bool HaveGpu() {
  int devices = 0;
  return cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

// The kernel over x on the GPU; "" or what failed.
std::string CastOnGpu(const std::vector<float>& x, float scale, std::vector<uint8_t>* y,
                      float* amax, uint64_t counts[2]) {
  const int64_t n = static_cast<int64_t>(x.size());
  y->assign(n, 0);
  float *dx = nullptr, *damax = nullptr;
  uint8_t* dy = nullptr;
  uint64_t* dcounts = nullptr;
  std::string err;
  auto check = [&](cudaError_t e, const char* what) {
    if (e != cudaSuccess && err.empty()) err = std::string(what) + ": " + cudaGetErrorString(e);
  };
  check(cudaMalloc(&dx, n * sizeof(float)), "cudaMalloc x");
  check(cudaMalloc(&dy, n), "cudaMalloc y");
  check(cudaMalloc(&damax, sizeof(float)), "cudaMalloc amax");
  check(cudaMalloc(&dcounts, 2 * sizeof(uint64_t)), "cudaMalloc counts");
  if (err.empty()) {
    check(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice), "copy x");
    check(cudaMemset(damax, 0, sizeof(float)), "zero amax");
    check(cudaMemset(dcounts, 0, 2 * sizeof(uint64_t)), "zero counts");
  }
  if (err.empty()) {
    err = CastToE4M3Cuda(dx, n, scale, dy, damax, nullptr, dcounts);
    check(cudaDeviceSynchronize(), "kernel");
  }
  if (err.empty()) {
    check(cudaMemcpy(y->data(), dy, n, cudaMemcpyDeviceToHost), "copy y");
    check(cudaMemcpy(amax, damax, sizeof(float), cudaMemcpyDeviceToHost), "copy amax");
    check(cudaMemcpy(counts, dcounts, 2 * sizeof(uint64_t), cudaMemcpyDeviceToHost),
          "copy counts");
  }
  cudaFree(dx);
  cudaFree(dy);
  cudaFree(damax);
  cudaFree(dcounts);
  return err;
}

TEST(Fp8CastGpu, MatchesTheReferenceBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  const int64_t n = (1 << 20) + 37;
  std::vector<float> x(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  for (auto& v : x) v = dist(rng);
  std::vector<uint8_t> want(n), got;
  float want_amax = 0, got_amax = 0;
  uint64_t want_counts[2] = {0, 0}, got_counts[2] = {0, 0};
  CastToE4M3Reference(x.data(), n, 37.5f, want.data(), &want_amax, want_counts);
  ASSERT_GT(want_counts[0], 0u);  // 37.5 x 3 sigma passes 448: some clamp
  ASSERT_EQ(CastOnGpu(x, 37.5f, &got, &got_amax, got_counts), "");
  EXPECT_EQ(got, want);
  EXPECT_EQ(Bits(got_amax), Bits(want_amax));
  EXPECT_EQ(got_counts[0], want_counts[0]);
  EXPECT_EQ(got_counts[1], want_counts[1]);
}

// NaN, infinities, the overflow bound and its neighbours, denormals, signed
// zeros, spread over many blocks: the amax (NaN included) and the counts
// bit for bit, the bytes bit for bit except that a NaN may be either E4M3
// NaN. Three runs: with a NaN far into the tensor, with infinities and no
// NaN, with neither.
TEST(Fp8CastGpu, SpecialValuesMatchTheReference) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  const float inf = std::numeric_limits<float>::infinity();
  const float bound = kE4M3OverflowBound;
  const std::vector<float> specials = {
      0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -1e-40f, std::ldexp(1.0f, -10),
      448.0f, std::nextafter(bound, 0.0f), bound, std::nextafter(bound, inf), -bound,
      -std::nextafter(bound, inf), inf, -inf, 1e30f, -3.0f};
  const int64_t n = (1 << 18) + 11;
  std::vector<float> base(n);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (auto& v : base) v = dist(rng);
  for (size_t i = 0; i < specials.size(); ++i) base[i * 997 + 5] = specials[i];
  std::vector<float> with_nan = base;
  with_nan[n - 3] = FromBits(0xffc12345u);
  with_nan[n / 2] = FromBits(0x7fc00001u);
  std::vector<float> finite = base;
  for (auto& v : finite) {
    if (!std::isfinite(v)) v = 1.0f;
  }
  for (const auto* x : {&with_nan, &base, &finite}) {
    std::vector<uint8_t> want(n), got;
    float want_amax = 0, got_amax = 0;
    uint64_t want_counts[2] = {0, 0}, got_counts[2] = {0, 0};
    CastToE4M3Reference(x->data(), n, 1.0f, want.data(), &want_amax, want_counts);
    ASSERT_EQ(CastOnGpu(*x, 1.0f, &got, &got_amax, got_counts), "");
    EXPECT_EQ(Bits(got_amax), Bits(want_amax)) << got_amax << " vs " << want_amax;
    EXPECT_EQ(got_counts[0], want_counts[0]);
    EXPECT_EQ(got_counts[1], want_counts[1]);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool ok = std::isnan((*x)[i]) ? (got[i] & 0x7f) == 0x7f : got[i] == want[i];
      if (!ok && ++bad <= 10) {
        ADD_FAILURE() << "x[" << i << "] = " << (*x)[i] << ": kernel " << int{got[i]}
                      << ", reference " << int{want[i]};
      }
    }
    EXPECT_EQ(bad, 0);
  }
  // What the three runs were for.
  float amax = 0;
  std::vector<uint8_t> y(n);
  CastToE4M3Reference(with_nan.data(), n, 1.0f, y.data(), &amax);
  EXPECT_EQ(Bits(amax), 0x7fc12345u);
  CastToE4M3Reference(base.data(), n, 1.0f, y.data(), &amax);
  EXPECT_EQ(amax, inf);
  CastToE4M3Reference(finite.data(), n, 1.0f, y.data(), &amax);
  EXPECT_EQ(amax, 1e30f);
}
#endif

}  // namespace
}  // namespace tally::kernels
