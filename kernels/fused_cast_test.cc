// RMSNorm + cast and SwiGLU + cast: the shared arithmetic against the math
// library, the CPU references against their definitions (in FP64) and
// against the plain cast of their y, and the CUDA kernels against the
// references bit for bit (skipped where there is no GPU; cast_tile_test.cc
// runs the kernels' own per-thread code against the references on the CPU).
#include "kernels/fused_cast.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cast_math.h"
#include "kernels/float_bits.h"
#include "kernels/fp8_scaling.h"
#include "kernels/testing.h"

namespace tally::kernels {
namespace {

using test_support::RandomNormal;

int64_t Ulps(float a, float b) {
  return std::abs(static_cast<int64_t>(FloatBits(a)) - static_cast<int64_t>(FloatBits(b)));
}

TEST(CastMath, ExpIsWithinTwoUlps) {
  int64_t worst = 0;
  for (float x = -87.0f; x < 88.7f; x += 0.000731f) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x)));
    worst = std::max(worst, Ulps(cast_math::Exp(x), want));
  }
  EXPECT_LE(worst, 2);
  EXPECT_EQ(cast_math::Exp(0.0f), 1.0f);
  EXPECT_EQ(cast_math::Exp(89.0f), std::numeric_limits<float>::infinity());
  EXPECT_EQ(cast_math::Exp(-104.0f), 0.0f);
  EXPECT_TRUE(std::isnan(cast_math::Exp(std::nanf(""))));
  // Subnormal results are rounded, not flushed.
  EXPECT_GT(cast_math::Exp(-100.0f), 0.0f);
  EXPECT_LE(Ulps(cast_math::Exp(-100.0f), static_cast<float>(std::exp(-100.0))), 2);
}

TEST(CastMath, RoundingMatchesTheBf16AndScaleDefinitions) {
  const std::vector<float> x = RandomNormal(10000, 1, 1e3f);
  for (float v : x) ASSERT_EQ(cast_math::RoundBf16(v), Bf16ToFloat(FloatToBf16(v))) << v;
  EXPECT_EQ(FloatBits(cast_math::RoundBf16(std::nanf(""))), 0x7fff0000u);
  EXPECT_EQ(FloatToBf16(cast_math::FromBits(cast_math::kCanonicalNan)), 0x7fff);
  for (float amax : {2.0f, 3.0f, 1e-30f, 1e-45f, 1e38f, 0.0f, -1.0f, std::nanf(""),
                     std::numeric_limits<float>::infinity()}) {
    for (int margin : {0, 1, 3}) {
      for (Fp8Kind k : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
        EXPECT_EQ(FloatBits(cast_math::RowScale(amax, Fp8Max(k), margin)),
                  FloatBits(ScaleForAmax(amax, k, margin, 1.0f)))
            << amax << " margin " << margin;
      }
    }
  }
}

// Host buffers for one fused call: y in its dtype, the FP8 outputs and
// sinks.
struct Outputs {
  Outputs(int64_t rows, int64_t cols, Dtype y_dtype)
      : y32(y_dtype == Dtype::kFloat32 ? rows * cols : 0),
        y16(y_dtype == Dtype::kBFloat16 ? rows * cols : 0),
        out(rows * cols),
        out_t(rows * cols) {}
  void* y() { return y32.empty() ? static_cast<void*>(y16.data()) : y32.data(); }
  Fp8Out Sinks(const float* scale, Fp8Kind kind) {
    Fp8Out o;
    o.scale = scale;
    o.format = kind;
    o.out = out.data();
    o.out_t = out_t.data();
    o.amax = &amax;
    o.amax_finite = &finite;
    o.counts = counts;
    return o;
  }
  std::vector<float> y32;
  std::vector<uint16_t> y16;
  std::vector<uint8_t> out, out_t;
  float amax = 0, finite = 0;
  uint64_t counts[2] = {0, 0};
};

// The plain cast of y (FP32 or BF16) must give what the fused call gave.
void ExpectTheCastOfY(Outputs& o, Dtype y_dtype, int64_t rows, int64_t cols, float scale,
                      Fp8Kind kind) {
  Outputs c(rows, cols, y_dtype);
  CastArgs a;
  a.x = o.y();
  a.source = y_dtype == Dtype::kFloat32 ? SourceKind::kFloat32 : SourceKind::kBFloat16;
  a.rows = rows;
  a.cols = cols;
  a.scale = &scale;
  a.format = kind;
  a.out = c.out.data();
  a.out_t = c.out_t.data();
  a.amax = &c.amax;
  a.amax_finite = &c.finite;
  a.counts = c.counts;
  CastReference(a);
  EXPECT_EQ(o.out, c.out);
  EXPECT_EQ(o.out_t, c.out_t);
  EXPECT_EQ(FloatBits(o.amax), FloatBits(c.amax));
  EXPECT_EQ(FloatBits(o.finite), FloatBits(c.finite));
  EXPECT_EQ(o.counts[0], c.counts[0]);
  EXPECT_EQ(o.counts[1], c.counts[1]);
}

TEST(RmsNormCastReference, NormalisesEachRowAndCastsWhatItWrites) {
  const int64_t rows = 37, cols = 300;  // cols: a partial 8-element chunk per lane
  const std::vector<float> x = RandomNormal(rows * cols, 2, 3.0f);
  const std::vector<float> gain = RandomNormal(cols, 3, 1.0f);
  for (Dtype y_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
    Outputs o(rows, cols, y_dtype);
    std::vector<float> rstd(rows);
    const float scale = 100.0f;
    RmsNormCastArgs a;
    a.x = x.data();
    a.rows = rows;
    a.cols = cols;
    a.gain = gain.data();
    a.eps = 1e-5f;
    a.y_dtype = y_dtype;
    a.y = o.y();
    a.rstd = rstd.data();
    a.fp8 = o.Sinks(&scale, Fp8Kind::kE4M3);
    RmsNormCastReference(a);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t c = 0; c < cols; ++c) ss += double{x[r * cols + c]} * x[r * cols + c];
      const double want_rstd = 1 / std::sqrt(ss / cols + 1e-5);
      ASSERT_NEAR(rstd[r], want_rstd, 1e-6 * want_rstd) << r;
      for (int64_t c = 0; c < cols; ++c) {
        const double want = x[r * cols + c] * want_rstd * gain[c];
        const float got =
            y_dtype == Dtype::kFloat32 ? o.y32[r * cols + c] : Bf16ToFloat(o.y16[r * cols + c]);
        const double tol = y_dtype == Dtype::kFloat32 ? 1e-5 : 8e-3;
        ASSERT_NEAR(got, want, tol * (std::abs(want) + 1e-3)) << r << ", " << c;
      }
    }
    EXPECT_GT(o.counts[0], 0u) << "some values clamp at this scale";
    ExpectTheCastOfY(o, y_dtype, rows, cols, scale, Fp8Kind::kE4M3);
  }
}

TEST(RmsNormCastReference, BF16InputsNaNRowsAndAMeasureOnlyCall) {
  const int64_t rows = 5, cols = 64;
  std::vector<float> xf = RandomNormal(rows * cols, 4, 1.0f);
  xf[2 * cols + 7] = std::nanf("");
  std::vector<uint16_t> x(xf.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = FloatToBf16(xf[i]);
  const std::vector<float> gain(cols, 1.0f);
  Outputs o(rows, cols, Dtype::kBFloat16);
  const float scale = 1.0f;
  RmsNormCastArgs a;
  a.x = x.data();
  a.x_dtype = Dtype::kBFloat16;
  a.rows = rows;
  a.cols = cols;
  a.gain = gain.data();
  a.y = o.y();
  a.fp8 = o.Sinks(&scale, Fp8Kind::kE4M3);
  RmsNormCastReference(a);
  // A NaN poisons its row (and only its row), as the canonical NaN.
  for (int64_t c = 0; c < cols; ++c) {
    EXPECT_EQ(o.y16[2 * cols + c], 0x7fff) << c;
    EXPECT_NE(o.y16[1 * cols + c], 0x7fff) << c;
  }
  EXPECT_EQ(FloatBits(o.amax), 0x7fff0000u);
  EXPECT_TRUE(std::isfinite(o.finite));
  ExpectTheCastOfY(o, Dtype::kBFloat16, rows, cols, scale, Fp8Kind::kE4M3);
  // Neither y nor bytes: only the amax of y, folded into what is there.
  float amax = 0;
  RmsNormCastArgs m = a;
  m.y = nullptr;
  m.fp8 = Fp8Out{};
  m.fp8.amax = &amax;
  RmsNormCastReference(m);
  EXPECT_EQ(FloatBits(amax), FloatBits(o.amax));
}

TEST(SwiGluCastReference, IsSwiGluThenTheCast) {
  const int64_t rows = 29, f = 70;
  const std::vector<float> x = RandomNormal(rows * 2 * f, 5, 4.0f);
  std::vector<float> want(rows * f);
  SwiGluForwardReference(x.data(), Dtype::kFloat32, rows, f, want.data());
  for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
    for (Dtype y_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
      Outputs o(rows, f, y_dtype);
      const float scale = kind == Fp8Kind::kE4M3 ? 30.0f : 4000.0f;
      SwiGluCastArgs a;
      a.x13 = x.data();
      a.x_dtype = Dtype::kFloat32;
      a.rows = rows;
      a.cols = f;
      a.y_dtype = y_dtype;
      a.y = o.y();
      a.fp8 = o.Sinks(&scale, kind);
      SwiGluCastReference(a);
      for (int64_t i = 0; i < rows * f; ++i) {
        if (y_dtype == Dtype::kFloat32) {
          // exp differs from the library's by at most 2 ulps.
          ASSERT_LE(Ulps(o.y32[i], want[i]), 8) << i;
        } else {
          ASSERT_LE(std::abs(int{o.y16[i]} - int{FloatToBf16(want[i])}), 1) << i;
        }
      }
      ExpectTheCastOfY(o, y_dtype, rows, f, scale, kind);
    }
  }
}

#ifdef TALLY_HAVE_CUDA
using test_support::Download;
using test_support::HaveGpu;
using test_support::Upload;

// Bytes equal, except that a NaN may be any NaN of the format.
int Fp8Mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, Fp8Kind kind) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const bool nan = std::isnan(Fp8ToFloat(want[i], kind));
    bad += nan ? !std::isnan(Fp8ToFloat(got[i], kind)) : got[i] != want[i];
  }
  return bad;
}

// The kernel's outputs, read back, beside the reference's.
void ExpectSame(Outputs& got, Outputs& want, Fp8Kind kind) {
  EXPECT_EQ(got.y32, want.y32);
  EXPECT_EQ(got.y16, want.y16);
  EXPECT_EQ(Fp8Mismatches(got.out, want.out, kind), 0);
  EXPECT_EQ(Fp8Mismatches(got.out_t, want.out_t, kind), 0);
  EXPECT_EQ(FloatBits(got.amax), FloatBits(want.amax));
  EXPECT_EQ(FloatBits(got.finite), FloatBits(want.finite));
  EXPECT_EQ(got.counts[0], want.counts[0]);
  EXPECT_EQ(got.counts[1], want.counts[1]);
}

// Device copies of an Outputs' buffers and back.
struct DeviceOutputs {
  explicit DeviceOutputs(Outputs& h)
      : y32(Upload(h.y32)),
        y16(Upload(h.y16)),
        out(Upload(h.out)),
        out_t(Upload(h.out_t)),
        amax(Upload(std::vector<float>{0})),
        finite(Upload(std::vector<float>{0})),
        counts(Upload(std::vector<uint64_t>{0, 0})) {}
  ~DeviceOutputs() {
    for (void* p : std::vector<void*>{y32, y16, out, out_t, amax, finite, counts}) cudaFree(p);
  }
  void* y(const Outputs& h) { return h.y32.empty() ? static_cast<void*>(y16) : y32; }
  Fp8Out Sinks(const float* scale, Fp8Kind kind) {
    Fp8Out o;
    o.scale = scale;
    o.format = kind;
    o.out = out;
    o.out_t = out_t;
    o.amax = amax;
    o.amax_finite = finite;
    o.counts = counts;
    return o;
  }
  void Read(Outputs* h) {
    h->y32 = Download(y32, h->y32.size());
    h->y16 = Download(y16, h->y16.size());
    h->out = Download(out, h->out.size());
    h->out_t = Download(out_t, h->out_t.size());
    h->amax = Download(amax, 1)[0];
    h->finite = Download(finite, 1)[0];
    const auto c = Download(counts, 2);
    h->counts[0] = c[0];
    h->counts[1] = c[1];
  }
  float* y32;
  uint16_t* y16;
  uint8_t *out, *out_t;
  float *amax, *finite;
  uint64_t* counts;
};

// x as FP32 or its BF16 bits, with special values spread through it.
std::vector<float> WithSpecials(int64_t n, uint32_t seed) {
  std::vector<float> x = RandomNormal(n, seed, 3.0f);
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> specials = {0.0f, -0.0f, 1e-30f, -1e-41f, 1e30f, inf, -inf};
  for (size_t i = 0; i < specials.size() && i * 331 + 9 < x.size(); ++i) {
    x[i * 331 + 9] = specials[i];
  }
  return x;
}

TEST(FusedCastGpu, RmsNormCastMatchesTheReferenceBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{4096, 2048}, {1000, 3072}, {77, 129}, {33, 1000}, {1, 16}}) {
    const std::vector<float> x = RandomNormal(rows * cols, 6, 2.0f);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]);
    const std::vector<float> gain = RandomNormal(cols, 7, 1.0f);
    float* dgain = Upload(gain);
    float* dx32 = Upload(x);
    uint16_t* dx16 = Upload(xb);
    for (Dtype x_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
      for (Dtype y_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
        SCOPED_TRACE(testing::Message()
                     << rows << " x " << cols << " x " << int(x_dtype) << " y " << int(y_dtype));
        const float scale = 50.0f;
        Outputs want(rows, cols, y_dtype), got(rows, cols, y_dtype);
        std::vector<float> rstd(rows);
        RmsNormCastArgs a;
        a.x = x_dtype == Dtype::kFloat32 ? static_cast<const void*>(x.data()) : xb.data();
        a.x_dtype = x_dtype;
        a.rows = rows;
        a.cols = cols;
        a.gain = gain.data();
        a.y_dtype = y_dtype;
        a.y = want.y();
        a.rstd = rstd.data();
        a.fp8 = want.Sinks(&scale, Fp8Kind::kE4M3);
        RmsNormCastReference(a);
        DeviceOutputs d(got);
        float* dscale = Upload(std::vector<float>{scale});
        float* drstd = Upload(rstd);
        a.x = x_dtype == Dtype::kFloat32 ? static_cast<const void*>(dx32) : dx16;
        a.gain = dgain;
        a.y = d.y(got);
        a.rstd = drstd;
        a.fp8 = d.Sinks(dscale, Fp8Kind::kE4M3);
        ASSERT_EQ(RmsNormCastCuda(a, nullptr), "");
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        d.Read(&got);
        ExpectSame(got, want, Fp8Kind::kE4M3);
        EXPECT_EQ(Download(drstd, rows), rstd);
        cudaFree(dscale);
        cudaFree(drstd);
      }
    }
    cudaFree(dgain);
    cudaFree(dx32);
    cudaFree(dx16);
  }
}

TEST(FusedCastGpu, SwiGluCastMatchesTheReferenceBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  for (auto [rows, f] :
       {std::pair<int64_t, int64_t>{4096, 5632}, {513, 1408}, {77, 129}, {3, 16}}) {
    const std::vector<float> x = WithSpecials(rows * 2 * f, 8);
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]);
    float* dx32 = Upload(x);
    uint16_t* dx16 = Upload(xb);
    for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
      for (Dtype x_dtype : {Dtype::kFloat32, Dtype::kBFloat16}) {
        const Dtype y_dtype = x_dtype;
        SCOPED_TRACE(testing::Message()
                     << rows << " x " << f << " format " << int(kind) << " dtype " << int(x_dtype));
        const float scale = kind == Fp8Kind::kE4M3 ? 20.0f : 3000.0f;
        Outputs want(rows, f, y_dtype), got(rows, f, y_dtype);
        SwiGluCastArgs a;
        a.x13 = x_dtype == Dtype::kFloat32 ? static_cast<const void*>(x.data()) : xb.data();
        a.x_dtype = x_dtype;
        a.rows = rows;
        a.cols = f;
        a.y_dtype = y_dtype;
        a.y = want.y();
        a.fp8 = want.Sinks(&scale, kind);
        SwiGluCastReference(a);
        DeviceOutputs d(got);
        float* dscale = Upload(std::vector<float>{scale});
        a.x13 = x_dtype == Dtype::kFloat32 ? static_cast<const void*>(dx32) : dx16;
        a.y = d.y(got);
        a.fp8 = d.Sinks(dscale, kind);
        ASSERT_EQ(SwiGluCastCuda(a, nullptr), "");
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        d.Read(&got);
        ExpectSame(got, want, kind);
        cudaFree(dscale);
      }
    }
    cudaFree(dx32);
    cudaFree(dx16);
  }
}
#endif

}  // namespace
}  // namespace tally::kernels
