#include "worker/precision/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/fp8_cast.h"

namespace tally::precision {
namespace {

// Every finite value of a format, from its 256 bit patterns.
std::vector<double> Grid(Fp8Format f) {
  at::Tensor bits = at::arange(256, at::kInt).to(at::kByte);
  at::Tensor v = bits.view(Fp8Dtype(f)).to(at::kDouble);
  std::vector<double> out;
  for (int i = 0; i < 256; ++i) {
    const double x = v[i].item<double>();
    if (std::isfinite(x)) out.push_back(x);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Round to nearest; ties to the value whose bit pattern is even.
double Reference(double x, Fp8Format f, const std::vector<double>& grid) {
  const double max = Fp8Max(f);
  x = std::clamp(x, -max, max);
  auto hi = std::lower_bound(grid.begin(), grid.end(), x);
  if (hi == grid.end()) return grid.back();
  if (*hi == x || hi == grid.begin()) return *hi;
  const double a = *(hi - 1), b = *hi;
  if (x - a < b - x) return a;
  if (b - x < x - a) return b;
  auto even = [&](double v) {
    const uint8_t byte =
        at::tensor(v, at::kDouble).to(Fp8Dtype(f)).view(at::kByte).item<uint8_t>();
    return (byte & 1) == 0;
  };
  return even(a) ? a : b;
}

class QuantizeTest : public ::testing::TestWithParam<Fp8Format> {};

TEST_P(QuantizeTest, MatchesTheReferenceWithinHalfAnUlp) {
  const Fp8Format f = GetParam();
  const auto grid = Grid(f);
  at::manual_seed(1);
  // Across the range: normals, subnormals, values at the edges.
  at::Tensor x = at::cat({at::randn({4000}) * (f == Fp8Format::kE4M3 ? 100 : 10000),
                          at::randn({1000}) * 1e-3, at::tensor({0.0f, -0.0f})});
  QuantStats stats;
  at::Tensor q = QuantizeScaled(x, 1.0, f, &stats).to(at::kDouble);
  const int mantissa_bits = f == Fp8Format::kE4M3 ? 3 : 2;
  const double min_normal = f == Fp8Format::kE4M3 ? std::ldexp(1.0, -6) : std::ldexp(1.0, -14);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xi = x[i].item<double>(), qi = q[i].item<double>();
    ASSERT_EQ(qi, Reference(xi, f, grid)) << "x=" << xi;
    const double ax = std::min(std::abs(xi), Fp8Max(f));
    // Half a unit in the last place: relative for normals, absolute below.
    const double half_ulp = ax >= min_normal
                                ? std::ldexp(1.0, static_cast<int>(std::floor(std::log2(ax))) -
                                                      mantissa_bits - 1)
                                : std::ldexp(min_normal, -mantissa_bits - 1);
    ASSERT_LE(std::abs(qi - std::clamp(xi, -Fp8Max(f), Fp8Max(f))), half_ulp) << xi;
  }
  EXPECT_EQ(stats.elements, x.numel());
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizeTest,
                         ::testing::Values(Fp8Format::kE4M3, Fp8Format::kE5M2),
                         [](const auto& i) {
                           return std::string(i.param == Fp8Format::kE4M3 ? "E4M3" : "E5M2");
                         });

TEST(QuantizeTest, ClampsInsteadOfNaNAndCountsOverAndUnderflow) {
  QuantStats s;
  at::Tensor q = QuantizeScaled(at::tensor({1000.0f, -1e9f, 1e-12f, 0.0f}), 1.0,
                                Fp8Format::kE4M3, &s);
  EXPECT_EQ(q[0].item<float>(), 448.0f);
  EXPECT_EQ(q[1].item<float>(), -448.0f);
  EXPECT_FALSE(at::isnan(q).any().item<bool>());
  EXPECT_EQ(s.overflows, 2);
  EXPECT_EQ(s.underflows, 1);  // 1e-12 became 0; a true 0 is not an underflow
  at::Tensor back = QuantizeDequantize(at::tensor({3.0f}), 100.0, Fp8Format::kE4M3, nullptr);
  EXPECT_NEAR(back.item<float>(), 3.0f, 3.0 / 16);
}

// The LibTorch-free reference in kernels/ (the CUDA kernel's oracle) agrees
// with LibTorch's own cast, value for value.
TEST(QuantizeTest, KernelReferenceAgreesWithLibTorch) {
  at::manual_seed(4);
  at::Tensor x = at::cat({at::randn({20000}) * 60, at::randn({5000}) * 1e-2,
                          at::tensor({448.0f, -448.0f, 1e4f, 0.0f})});
  at::Tensor bits = x.clamp(-448, 448).to(at::kFloat8_e4m3fn).view(at::kByte);
  for (int64_t i = 0; i < x.numel(); ++i) {
    ASSERT_EQ(kernels::FloatToE4M3(x[i].item<float>()), bits[i].item<uint8_t>())
        << x[i].item<float>();
  }
}

// The fused cast's reference (what the CUDA kernel is held to, bit for bit,
// in kernels/fp8_cast_test.cc) against the trainer's CPU path where the two
// could part: NaN, infinities, |x * scale| at the overflow bound and a few
// ulps either side (directly and through scales whose product rounds),
// denormals, signed zeros. The same E4M3 bytes (any NaN for a NaN), the same
// clamped and flushed counts, and the amax ATen's max gives: NaN when any
// value is NaN, else +Inf when any is infinite.
TEST(QuantizeTest, FusedCastReferenceAgreesWithTheCpuPath) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float bound = kernels::kE4M3OverflowBound;
  auto around = [](float centre, int ulps) {
    std::vector<float> v;
    float lo = centre;
    for (int i = 0; i < ulps; ++i) lo = std::nextafter(lo, 0.0f);
    for (int i = 0; i <= 2 * ulps; ++i, lo = std::nextafter(lo, 1e9f)) {
      v.push_back(lo);
      v.push_back(-lo);
    }
    return v;
  };
  struct Case {
    std::string name;
    std::vector<float> x;
    float scale;
  };
  std::vector<Case> cases;
  cases.push_back({"the bound, scale 1", around(bound, 20), 1.0f});
  cases.push_back({"448, scale 1", around(448.0f, 3), 1.0f});
  cases.push_back({"the bound, scale 3", around(bound / 3, 20), 3.0f});
  cases.push_back({"the bound, scale 0.7", around(bound / 0.7f, 20), 0.7f});
  cases.push_back({"specials",
                   {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -1e-40f,
                    std::ldexp(1.0f, -10), std::ldexp(1.0f, -9), 1e30f, -1e30f, inf, -inf, 2.5f},
                   1.0f});
  cases.push_back({"NaN among them", {1.0f, nan, -inf, 3.0f, -nan, 1e-40f}, 1.0f});
  cases.push_back({"NaN only", {nan}, 1.0f});
  at::manual_seed(7);
  at::Tensor r = at::randn({4096}) * 3;
  cases.push_back({"random, scale 37.5",
                   std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + r.numel()),
                   37.5f});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const int64_t n = static_cast<int64_t>(c.x.size());
    std::vector<uint8_t> y(n);
    float amax = 0;
    uint64_t counts[2] = {0, 0};
    kernels::CastToE4M3Reference(c.x.data(), n, c.scale, y.data(), &amax, counts);

    at::Tensor x = at::tensor(c.x);
    QuantStats stats;
    at::Tensor bytes =
        QuantizeScaled(x, c.scale, Fp8Format::kE4M3, &stats).to(at::kFloat8_e4m3fn).view(at::kByte);
    const float want_amax = x.abs().max().item<float>();  // as ScaleFor takes it
    EXPECT_EQ(counts[0], static_cast<uint64_t>(stats.overflows));
    EXPECT_EQ(counts[1], static_cast<uint64_t>(stats.underflows));
    if (std::isnan(want_amax)) {
      EXPECT_TRUE(std::isnan(amax)) << amax;
    } else {
      EXPECT_EQ(amax, want_amax);
    }
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t want = bytes[i].item<uint8_t>();
      if (std::isnan(c.x[i])) {
        EXPECT_EQ(y[i] & 0x7f, 0x7f) << i;
        EXPECT_EQ(want & 0x7f, 0x7f) << i;
      } else {
        EXPECT_EQ(y[i], want) << "x = " << c.x[i] << " x " << c.scale;
      }
    }
  }
  // The cases reach both sides of the bound.
  QuantStats near;
  QuantizeScaled(at::tensor(around(bound, 20)), 1.0, Fp8Format::kE4M3, &near);
  EXPECT_EQ(near.overflows, 40);  // 20 ulps above, each sign
}

}  // namespace
}  // namespace tally::precision
