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

// The LibTorch-free reference in kernels/ (the CUDA kernel's oracle, and
// the trainer's CPU cast) agrees with LibTorch's own cast of the clamped
// value, value for value, in both formats.
TEST(QuantizeTest, KernelReferenceAgreesWithLibTorch) {
  at::manual_seed(4);
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const double max = Fp8Max(f);
    at::Tensor x = at::cat({at::randn({20000}) * (max / 7), at::randn({5000}) * 1e-2,
                            at::randn({5000}) * (f == Fp8Format::kE4M3 ? 1e-3 : 1e-5),
                            at::tensor({static_cast<float>(max), static_cast<float>(-max),
                                        static_cast<float>(3 * max), 0.0f, -0.0f})});
    at::Tensor bits = x.clamp(-max, max).to(Fp8Dtype(f)).view(at::kByte);
    const auto kind = f == Fp8Format::kE4M3 ? kernels::Fp8Kind::kE4M3 : kernels::Fp8Kind::kE5M2;
    const float* xs = x.data_ptr<float>();
    const uint8_t* want = bits.data_ptr<uint8_t>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      ASSERT_EQ(kernels::FloatToFp8(xs[i], kind), want[i]) << xs[i];
    }
  }
}

// CastFp8 on the CPU (the fused cast's reference, which the CUDA kernel is
// held to bit for bit in kernels/fp8_cast_test.cc, and the trainer's CPU
// cast) against LibTorch's clamp-and-cast where the two could part: NaN,
// infinities, |x * scale| at the overflow bound and a few ulps either side
// (directly and through scales whose product rounds), denormals, signed
// zeros, BF16 inputs. The same bytes (any NaN for a NaN), the same clamped
// and flushed counts, and the amax ATen's max gives: NaN when any value is
// NaN, else +Inf when any is infinite; the finite amax without them.
TEST(QuantizeTest, FusedCastAgreesWithLibTorch) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
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
  at::manual_seed(7);
  at::Tensor r = at::randn({4096}) * 3;
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const float bound = f == Fp8Format::kE4M3 ? kernels::kE4M3OverflowBound
                                              : kernels::kE5M2OverflowBound;
    const float max = static_cast<float>(Fp8Max(f));
    std::vector<Case> cases;
    cases.push_back({"the bound, scale 1", around(bound, 20), 1.0f});
    cases.push_back({"max, scale 1", around(max, 3), 1.0f});
    cases.push_back({"the bound, scale 3", around(bound / 3, 20), 3.0f});
    cases.push_back({"the bound, scale 0.7", around(bound / 0.7f, 20), 0.7f});
    cases.push_back({"specials",
                     {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -1e-40f,
                      std::ldexp(1.0f, -10), std::ldexp(1.0f, -9), std::ldexp(1.0f, -17),
                      1e30f, -1e30f, inf, -inf, 2.5f},
                     1.0f});
    cases.push_back({"NaN among them", {1.0f, nan, -inf, 3.0f, -nan, 1e-40f}, 1.0f});
    cases.push_back({"NaN only", {nan}, 1.0f});
    cases.push_back({"random, scale 37.5",
                     std::vector<float>(r.data_ptr<float>(), r.data_ptr<float>() + r.numel()),
                     37.5f});
    for (const Case& c : cases) {
      for (bool bf16 : {false, true}) {
        SCOPED_TRACE(testing::Message() << c.name << (f == Fp8Format::kE4M3 ? " E4M3" : " E5M2")
                                        << (bf16 ? " from BF16" : ""));
        at::Tensor x = at::tensor(c.x).reshape({1, -1});
        if (bf16) x = x.to(at::kBFloat16);
        at::Tensor amax = at::zeros({1}), finite = at::zeros({1});
        at::Tensor counts = at::zeros({2}, at::kLong);
        const Fp8Cast cast =
            CastFp8(x, at::full({1}, c.scale), f, true, true, {amax, finite, counts});
        QuantStats stats;
        at::Tensor want = QuantizeScaled(x.to(at::kFloat), c.scale, f, &stats)
                              .to(Fp8Dtype(f))
                              .view(at::kByte)
                              .reshape({-1});
        const at::Tensor xf = x.to(at::kFloat).reshape({-1});
        EXPECT_EQ(counts[0].item<int64_t>(), stats.overflows);
        EXPECT_EQ(counts[1].item<int64_t>(), stats.underflows);
        const float want_amax = xf.abs().max().item<float>();  // ATen's max
        if (std::isnan(want_amax)) {
          EXPECT_TRUE(std::isnan(amax.item<float>()));
        } else {
          EXPECT_EQ(amax.item<float>(), want_amax);
        }
        const at::Tensor finite_values = xf.abs().masked_select(at::isfinite(xf));
        EXPECT_EQ(finite.item<float>(),
                  finite_values.numel() ? finite_values.max().item<float>() : 0.0f);
        const at::Tensor got = cast.data.view(at::kByte).reshape({-1});
        const at::Tensor got_t = cast.data_t.view(at::kByte).reshape({-1});
        for (int64_t i = 0; i < xf.numel(); ++i) {
          const uint8_t g = got[i].item<uint8_t>(), w = want[i].item<uint8_t>();
          EXPECT_EQ(g, got_t[i].item<uint8_t>()) << "one row: its transpose is itself";
          if (std::isnan(xf[i].item<float>())) {
            EXPECT_EQ(g & 0x7f, 0x7f) << i;
          } else {
            EXPECT_EQ(g, w) << "x = " << xf[i].item<float>() << " x " << c.scale;
          }
        }
      }
    }
    // The cases reach both sides of the bound.
    QuantStats near;
    QuantizeScaled(at::tensor(around(bound, 20)), 1.0, f, &near);
    EXPECT_EQ(near.overflows, 40);  // 20 ulps above, each sign
  }
}

// The transposed bytes are x's transpose; a BF16 input casts as its FP32
// value; a measuring call writes nothing; refusals name what is wrong.
TEST(QuantizeTest, FusedCastWritesTheTransposeAndRefusesBadSinks) {
  at::manual_seed(8);
  const at::Tensor x = at::randn({37, 19}) * 20;
  const Fp8Cast c = CastFp8(x, at::full({1}, 3.0f), Fp8Format::kE4M3, true, true, {});
  EXPECT_TRUE(at::equal(c.data.view(at::kByte).t(), c.data_t.view(at::kByte)));
  EXPECT_EQ(c.data.scalar_type(), at::kFloat8_e4m3fn);
  const Fp8Cast b = CastFp8(x.to(at::kBFloat16), at::full({1}, 3.0f), Fp8Format::kE5M2, true,
                            false, {});
  const Fp8Cast f = CastFp8(x.to(at::kBFloat16).to(at::kFloat), at::full({1}, 3.0f),
                            Fp8Format::kE5M2, true, false, {});
  EXPECT_TRUE(at::equal(b.data.view(at::kByte), f.data.view(at::kByte)));
  EXPECT_FALSE(b.data_t.defined());
  at::Tensor amax = at::zeros({1});
  const Fp8Cast m = CastFp8(x, {}, Fp8Format::kE4M3, false, false, {amax, {}, {}});
  EXPECT_FALSE(m.data.defined());
  EXPECT_EQ(amax.item<float>(), x.abs().max().item<float>());
  EXPECT_THROW(CastFp8(x, {}, Fp8Format::kE4M3, true, false, {}), c10::Error);
  EXPECT_THROW(CastFp8(x, at::full({1}, 1.0f), Fp8Format::kE4M3, true, false,
                       {at::zeros({1}, at::kDouble), {}, {}}),
               c10::Error);
  EXPECT_THROW(CastFp8(x.reshape({-1}), at::full({1}, 1.0f), Fp8Format::kE4M3, true, false, {}),
               c10::Error);
}

}  // namespace
}  // namespace tally::precision
