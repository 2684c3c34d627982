// The FP8 casts: the CPU reference against the formats' definitions and the
// hardware conversion, and the CUDA kernel against the reference (skipped
// where there is no GPU).
#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/float_bits.h"
#include "kernels/fp8_cast.h"
#include "kernels/testing.h"

#ifdef TALLY_HAVE_CUDA
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#endif

namespace tally::kernels {
namespace {

// The reference over x as one row: amax folded from 0 (written to *amax),
// counts added to `counts` when given.
void CastToE4M3Reference(const float* x, int64_t n, float scale, uint8_t* y, float* amax,
                         uint64_t* counts = nullptr) {
  *amax = 0;
  CastArgs a;
  a.x = x;
  a.rows = 1;
  a.cols = n;
  a.scale = &scale;
  a.out = y;
  a.amax = amax;
  a.counts = counts;
  CastReference(a);
}

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

TEST(Fp8CastReference, AmaxIsOfTheInputAndPropagatesNaNAndInf) {
  std::vector<float> x = {1.0f, -7.5f, 3.0f};
  std::vector<uint8_t> y(x.size());
  float amax = 0;
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
  const float nan_a = BitsFloat(0x7fc00001u), nan_b = BitsFloat(0xffc12345u);
  for (const std::vector<float>& v :
       {std::vector<float>{nan_a, 1.0f, 2.0f}, std::vector<float>{1.0f, 2.0f, nan_a},
        std::vector<float>{std::numeric_limits<float>::infinity(), nan_a, 5.0f}}) {
    y.resize(v.size());
    CastToE4M3Reference(v.data(), v.size(), 1.0f, y.data(), &amax);
    EXPECT_TRUE(std::isnan(amax));
    EXPECT_EQ(FloatBits(amax), 0x7fc00001u);
  }
  x = {nan_a, -3.0f, nan_b};
  uint64_t counts[2] = {0, 0};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax, counts);
  EXPECT_EQ(FloatBits(amax), 0x7fc12345u);
  EXPECT_EQ(y[0], 0x7f);
  EXPECT_EQ(y[2], 0x7f);
  EXPECT_EQ(counts[0], 0u);  // NaN is neither clamped
  EXPECT_EQ(counts[1], 0u);  // nor flushed

  // -0 and zeros: amax +0.
  x = {-0.0f, 0.0f};
  CastToE4M3Reference(x.data(), x.size(), 1.0f, y.data(), &amax);
  EXPECT_EQ(FloatBits(amax), 0u);
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

TEST(Fp8CastReference, E5M2KnownValuesSaturationAndTies) {
  const Fp8Kind k = Fp8Kind::kE5M2;
  EXPECT_EQ(FloatToFp8(1.0f, k), 0x3c);
  EXPECT_EQ(FloatToFp8(-2.0f, k), 0xc0);
  EXPECT_EQ(FloatToFp8(57344.0f, k), 0x7b);
  EXPECT_EQ(FloatToFp8(61440.0f, k), 0x7b);  // would round to Inf: saturates
  EXPECT_EQ(FloatToFp8(-1e30f, k), 0xfb);
  EXPECT_EQ(FloatToFp8(std::numeric_limits<float>::infinity(), k), 0x7b);
  EXPECT_EQ(FloatToFp8(std::ldexp(1.0f, -16), k), 0x01);  // smallest subnormal
  EXPECT_EQ(FloatToFp8(std::ldexp(1.0f, -17), k), 0x00);  // tie: to even (0)
  EXPECT_EQ(FloatToFp8(std::ldexp(3.0f, -17), k), 0x02);  // tie: to even (2)
  EXPECT_EQ(FloatToFp8(1.125f, k), 0x3c);  // halfway 1.0 / 1.25: even mantissa
  EXPECT_EQ(FloatToFp8(1.375f, k), 0x3e);  // halfway 1.25 / 1.5: even mantissa
  EXPECT_EQ(FloatToFp8(-0.0f, k), 0x80);
  EXPECT_EQ(FloatToFp8(std::nanf(""), k), 0x7f);
  EXPECT_EQ(Fp8ToFloat(0x7b, k), 57344.0f);
  EXPECT_EQ(Fp8ToFloat(0x7c, k), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0x7f, k)));
  for (int b = 0; b < 256; ++b) {
    const float v = Fp8ToFloat(static_cast<uint8_t>(b), k);
    if (std::isfinite(v)) EXPECT_EQ(FloatToFp8(v, k), b) << b;
  }
}

// One call gives both layouts, both amaxes and the counts, for both formats
// and both sources; the transposed bytes are the row-major ones transposed.
TEST(Fp8CastReference, WritesBothLayoutsFromEitherSource) {
  const int64_t rows = 70, cols = 45;
  std::vector<float> x = test_support::RandomNormal(rows * cols, 4, 30.0f);
  x[7] = std::numeric_limits<float>::infinity();
  x[100] = std::nanf("");
  std::vector<uint16_t> xb(x.size());
  std::vector<float> x_from_bf16(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = FloatToBf16(x[i]);
    x_from_bf16[i] = BitsFloat(static_cast<uint32_t>(xb[i]) << 16);
  }
  for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
    for (SourceKind source : {SourceKind::kFloat32, SourceKind::kBFloat16}) {
      const std::vector<float>& values = source == SourceKind::kFloat32 ? x : x_from_bf16;
      const float scale = kind == Fp8Kind::kE4M3 ? 7.0f : 900.0f;
      std::vector<uint8_t> out(x.size()), out_t(x.size());
      float amax = 0, finite = 0;
      uint64_t counts[2] = {0, 0};
      CastArgs a;
      a.x = source == SourceKind::kFloat32 ? static_cast<const void*>(x.data()) : xb.data();
      a.source = source;
      a.rows = rows;
      a.cols = cols;
      a.scale = &scale;
      a.format = kind;
      a.out = out.data();
      a.out_t = out_t.data();
      a.amax = &amax;
      a.amax_finite = &finite;
      a.counts = counts;
      CastReference(a);
      uint64_t over = 0, under = 0;
      float want_finite = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const float v = values[r * cols + c];
          const uint8_t q = FloatToFp8(v * scale, kind);
          ASSERT_EQ(out[r * cols + c], q);
          ASSERT_EQ(out_t[c * rows + r], q);
          over += std::fabs(v * scale) > OverflowBound(kind);
          under += v != 0 && (q & 0x7f) == 0;
          if (std::isfinite(v)) want_finite = std::max(want_finite, std::fabs(v));
        }
      }
      EXPECT_TRUE(std::isnan(amax));
      EXPECT_EQ(finite, want_finite);
      EXPECT_EQ(counts[0], over);
      EXPECT_GT(over, 0u);
      EXPECT_EQ(counts[1], under);
    }
  }
  // An amax alone: no scale, nothing written; it folds into what is there.
  float amax = 1000.0f, finite = 0;
  CastArgs only;
  only.x = x.data();
  only.rows = rows;
  only.cols = cols;
  only.amax = &amax;
  only.amax_finite = &finite;
  CastReference(only);
  EXPECT_TRUE(std::isnan(amax));
  std::vector<float> small = {1.0f, -2.0f};
  amax = 1000.0f;
  only.x = small.data();
  only.rows = 1;
  only.cols = 2;
  CastReference(only);
  EXPECT_EQ(amax, 1000.0f) << "folded: the larger stays";
}

#ifdef TALLY_HAVE_CUDA
// The kernel converts with __nv_cvt_float_to_fp8; cuda_fp8.hpp's host
// version of it is written to give the hardware conversion's result, so the
// reference is checked against it here, without a GPU, for both formats:
// every value within a few ulps of each FP8 value and of each midpoint
// between two, the saturation region, and a sweep of FP32 bit patterns.
// NaN: any FP8 NaN.
TEST(Fp8CastReference, MatchesCudasConversion) {
  for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
    const auto cuda_kind = kind == Fp8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2;
    std::vector<float> probes;
    std::vector<float> grid;
    for (int b = 0; b < 128; ++b) {
      const float v = Fp8ToFloat(static_cast<uint8_t>(b), kind);
      if (std::isfinite(v)) grid.push_back(v);
    }
    grid.push_back(2 * Fp8Max(kind));
    for (size_t i = 0; i + 1 < grid.size(); ++i) {
      for (float centre : {grid[i], (grid[i] + grid[i + 1]) / 2}) {
        float lo = centre, hi = centre;
        for (int k = 0; k < 4; ++k) {
          lo = std::nextafter(lo, -1e9f);
          hi = std::nextafter(hi, 1e9f);
        }
        for (float p = lo; p <= hi; p = std::nextafter(p, 1e9f)) probes.push_back(p);
      }
    }
    for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 4099) {
      probes.push_back(BitsFloat(static_cast<uint32_t>(bits)));
    }
    probes.push_back(std::numeric_limits<float>::infinity());
    probes.push_back(std::numeric_limits<float>::quiet_NaN());
    probes.push_back(std::numeric_limits<float>::denorm_min());
    ASSERT_GT(probes.size(), 1000000u);
    int mismatches = 0;
    for (float p : probes) {
      for (float x : {p, -p}) {
        const uint8_t want = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, cuda_kind);
        const uint8_t got = FloatToFp8(x, kind);
        const bool ok = std::isnan(x) ? std::isnan(Fp8ToFloat(want, kind)) &&
                                            std::isnan(Fp8ToFloat(got, kind))
                                      : got == want;
        if (!ok && ++mismatches <= 10) {
          ADD_FAILURE() << (kind == Fp8Kind::kE4M3 ? "E4M3" : "E5M2") << " x = " << x
                        << " (bits " << std::hex << FloatBits(x) << "): reference " << int{got}
                        << ", CUDA " << int{want};
        }
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}
#endif

#ifdef TALLY_HAVE_CUDA
using test_support::HaveGpu;

// Device memory for a test: filled from the host, read back, freed.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes, const void* from = nullptr) : bytes_(bytes) {
    if (cudaMalloc(&p_, bytes ? bytes : 1) != cudaSuccess) p_ = nullptr;
    if (p_ && from) cudaMemcpy(p_, from, bytes, cudaMemcpyHostToDevice);
    if (p_ && !from) cudaMemset(p_, 0, bytes);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  template <typename T>
  T* get() const { return static_cast<T*>(p_); }
  template <typename T>
  std::vector<T> Read() const {
    std::vector<T> v(bytes_ / sizeof(T));
    cudaMemcpy(v.data(), p_, bytes_, cudaMemcpyDeviceToHost);
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

struct CastResult {
  std::vector<uint8_t> out, out_t;
  float amax = 0, finite = 0;
  uint64_t counts[2] = {0, 0};
};

// The reference and the kernel on the same input (FP32, or its BF16 bits).
void CastBoth(const void* x, size_t x_bytes, SourceKind source, int64_t rows, int64_t cols,
              float scale, Fp8Kind kind, CastResult* want, CastResult* got) {
  const size_t n = rows * cols;
  want->out.assign(n, 0);
  want->out_t.assign(n, 0);
  CastArgs a;
  a.x = x;
  a.source = source;
  a.rows = rows;
  a.cols = cols;
  a.scale = &scale;
  a.format = kind;
  a.out = want->out.data();
  a.out_t = want->out_t.data();
  a.amax = &want->amax;
  a.amax_finite = &want->finite;
  a.counts = want->counts;
  CastReference(a);
  DeviceBuffer dx(x_bytes, x), ds(sizeof(float), &scale), dout(n), dout_t(n), damax(4),
      dfinite(4), dcounts(16);
  a.x = dx.get<void>();
  a.scale = ds.get<float>();
  a.out = dout.get<uint8_t>();
  a.out_t = dout_t.get<uint8_t>();
  a.amax = damax.get<float>();
  a.amax_finite = dfinite.get<float>();
  a.counts = dcounts.get<uint64_t>();
  ASSERT_EQ(CastCuda(a, nullptr), "");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  got->out = dout.Read<uint8_t>();
  got->out_t = dout_t.Read<uint8_t>();
  got->amax = damax.Read<float>()[0];
  got->finite = dfinite.Read<float>()[0];
  const auto c = dcounts.Read<uint64_t>();
  got->counts[0] = c[0];
  got->counts[1] = c[1];
}

// Bytes equal, except that a NaN may be any NaN of the format.
int ByteMismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                   Fp8Kind kind) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool nan = std::isnan(Fp8ToFloat(want[i], kind));
    const bool ok = nan ? std::isnan(Fp8ToFloat(got[i], kind)) : got[i] == want[i];
    if (!ok && ++bad <= 5) {
      ADD_FAILURE() << "byte " << i << ": kernel " << int{got[i]} << ", reference "
                    << int{want[i]};
    }
  }
  return bad;
}

// Shapes that are and are not multiples of the 32 x 128 tile and of the
// 16-value segment, both formats, both sources, with clamped values: every
// byte of both layouts, both amaxes and both counts equal.
TEST(Fp8CastGpu, MatchesTheReferenceBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1024, 4096}, {8192, 1408}, {77, 129},
                            {1, 1000}, {3000, 1}, {33, 48}, {96, 400}}) {
    std::vector<float> x = test_support::RandomNormal(rows * cols, 5, 3.0f);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]);
    for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
      for (SourceKind source : {SourceKind::kFloat32, SourceKind::kBFloat16}) {
        SCOPED_TRACE(testing::Message() << rows << " x " << cols << " format "
                                        << int(kind) << " source " << int(source));
        const float scale = kind == Fp8Kind::kE4M3 ? 37.5f : 5000.0f;
        CastResult want, got;
        if (source == SourceKind::kFloat32) {
          CastBoth(x.data(), x.size() * 4, source, rows, cols, scale, kind, &want, &got);
        } else {
          CastBoth(xb.data(), xb.size() * 2, source, rows, cols, scale, kind, &want, &got);
        }
        if (rows * cols > 100000) ASSERT_GT(want.counts[0], 0u) << "some values clamp";
        EXPECT_EQ(ByteMismatches(got.out, want.out, kind), 0);
        EXPECT_EQ(ByteMismatches(got.out_t, want.out_t, kind), 0);
        EXPECT_EQ(FloatBits(got.amax), FloatBits(want.amax));
        EXPECT_EQ(FloatBits(got.finite), FloatBits(want.finite));
        EXPECT_EQ(got.counts[0], want.counts[0]);
        EXPECT_EQ(got.counts[1], want.counts[1]);
      }
    }
  }
}

// Pointers that are not 16-byte aligned (one element into an allocation)
// take the scalar path: the same bytes.
TEST(Fp8CastGpu, UnalignedTensorsMatchTheReference) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  const int64_t rows = 96, cols = 256, n = rows * cols;
  const std::vector<float> x = test_support::RandomNormal(n + 1, 6, 3.0f);
  const float scale = 40.0f;
  std::vector<uint8_t> want(n + 1), want_t(n + 1);
  CastArgs a;
  a.x = x.data() + 1;
  a.rows = rows;
  a.cols = cols;
  a.scale = &scale;
  a.out = want.data() + 1;
  a.out_t = want_t.data() + 1;
  CastReference(a);
  DeviceBuffer dx((n + 1) * 4, x.data()), ds(4, &scale), dout(n + 1), dout_t(n + 1);
  a.x = dx.get<float>() + 1;
  a.scale = ds.get<float>();
  a.out = dout.get<uint8_t>() + 1;
  a.out_t = dout_t.get<uint8_t>() + 1;
  ASSERT_EQ(CastCuda(a, nullptr), "");
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ByteMismatches(dout.Read<uint8_t>(), want, Fp8Kind::kE4M3), 0);
  EXPECT_EQ(ByteMismatches(dout_t.Read<uint8_t>(), want_t, Fp8Kind::kE4M3), 0);
}

// NaN, infinities, the overflow bound and its neighbours, denormals, signed
// zeros, spread over many blocks: the amax (NaN included) and the counts
// bit for bit, the bytes bit for bit except that a NaN may be either FP8
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
  const int64_t rows = 1025, cols = 257;
  const int64_t n = rows * cols;
  std::vector<float> base = test_support::RandomNormal(n, 9, 2.0f);
  for (size_t i = 0; i < specials.size(); ++i) base[i * 997 + 5] = specials[i];
  std::vector<float> with_nan = base;
  with_nan[n - 3] = BitsFloat(0xffc12345u);
  with_nan[n / 2] = BitsFloat(0x7fc00001u);
  std::vector<float> finite = base;
  for (auto& v : finite) {
    if (!std::isfinite(v)) v = 1.0f;
  }
  for (const auto* x : {&with_nan, &base, &finite}) {
    CastResult want, got;
    CastBoth(x->data(), n * 4, SourceKind::kFloat32, rows, cols, 1.0f, Fp8Kind::kE4M3, &want,
             &got);
    EXPECT_EQ(FloatBits(got.amax), FloatBits(want.amax)) << got.amax << " vs " << want.amax;
    EXPECT_EQ(FloatBits(got.finite), FloatBits(want.finite));
    EXPECT_EQ(got.counts[0], want.counts[0]);
    EXPECT_EQ(got.counts[1], want.counts[1]);
    EXPECT_EQ(ByteMismatches(got.out, want.out, Fp8Kind::kE4M3), 0);
    EXPECT_EQ(ByteMismatches(got.out_t, want.out_t, Fp8Kind::kE4M3), 0);
  }
  // What the three runs were for.
  float amax = 0;
  std::vector<uint8_t> y(n);
  CastToE4M3Reference(with_nan.data(), n, 1.0f, y.data(), &amax);
  EXPECT_EQ(FloatBits(amax), 0x7fc12345u);
  CastToE4M3Reference(base.data(), n, 1.0f, y.data(), &amax);
  EXPECT_EQ(amax, inf);
  CastToE4M3Reference(finite.data(), n, 1.0f, y.data(), &amax);
  EXPECT_EQ(amax, 1e30f);
}
#endif

}  // namespace
}  // namespace tally::kernels
