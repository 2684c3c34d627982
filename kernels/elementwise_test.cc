// SwiGLU and RoPE: the CPU references against their definitions in FP64,
// and the CUDA kernels against the references (skipped where there is no
// GPU).
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/float_bits.h"
#include "kernels/testing.h"

namespace tally::kernels {
namespace {

using test_support::RandomNormal;
#ifdef TALLY_HAVE_CUDA
using test_support::Download;
using test_support::HaveGpu;
using test_support::Upload;
#endif

std::vector<uint16_t> ToBf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = FloatToBf16(v[i]);
  return out;
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to even (1).
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
  EXPECT_EQ(Bf16ToFloat(FloatToBf16(-INFINITY)), -INFINITY);
}

TEST(SwiGluReference, MatchesItsDefinition) {
  const int64_t n = 37, f = 29;
  const std::vector<float> x = RandomNormal(n * 2 * f, 1, 3.0f), dy = RandomNormal(n * f, 2, 1.0f);
  std::vector<float> y(n * f), dx(n * 2 * f);
  SwiGluForwardReference(x.data(), Dtype::kFloat32, n, f, y.data());
  SwiGluBackwardReference(x.data(), dy.data(), Dtype::kFloat32, n, f, dx.data());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t i = 0; i < f; ++i) {
      const double a = x[r * 2 * f + i], b = x[r * 2 * f + f + i], g = dy[r * f + i];
      const double s = 1 / (1 + std::exp(-a));
      const double want_y = a * s * b;
      const double want_da = g * b * (s + a * s * (1 - s)), want_db = g * a * s;
      EXPECT_NEAR(y[r * f + i], want_y, 1e-6 * (1 + std::abs(want_y)));
      EXPECT_NEAR(dx[r * 2 * f + i], want_da, 1e-6 * (1 + std::abs(want_da)));
      EXPECT_NEAR(dx[r * 2 * f + f + i], want_db, 1e-6 * (1 + std::abs(want_db)));
    }
  }
  // BF16: the FP32 arithmetic of the BF16 inputs, rounded once.
  const std::vector<uint16_t> xb = ToBf16(x);
  std::vector<uint16_t> yb(n * f);
  SwiGluForwardReference(xb.data(), Dtype::kBFloat16, n, f, yb.data());
  std::vector<float> xr(x.size()), yr(n * f);
  for (size_t i = 0; i < x.size(); ++i) xr[i] = Bf16ToFloat(xb[i]);
  SwiGluForwardReference(xr.data(), Dtype::kFloat32, n, f, yr.data());
  for (int64_t i = 0; i < n * f; ++i) ASSERT_EQ(yb[i], FloatToBf16(yr[i])) << i;
}

// The rotation is orthogonal: the backward (rotation by minus the angle)
// of the forward gives q and k back, v is copied both ways, and each pair
// keeps its length.
TEST(RopeReference, RotatesPairsAndTheBackwardUndoesIt) {
  RopeArgs a;
  a.n = 11;
  a.h = 3;
  a.k = 8;
  a.in = a.out = Dtype::kFloat32;
  std::vector<float> cos(a.n * a.k / 2), sin(cos.size());
  for (int64_t t = 0; t < a.n; ++t) {
    for (int64_t i = 0; i < a.k / 2; ++i) {
      const double angle = t * std::pow(10000.0, -2.0 * i / a.k);
      cos[t * a.k / 2 + i] = static_cast<float>(std::cos(angle));
      sin[t * a.k / 2 + i] = static_cast<float>(std::sin(angle));
    }
  }
  a.cos = cos.data();
  a.sin = sin.data();
  const std::vector<float> qkv = RandomNormal(a.n * 3 * a.h * a.k, 3, 1.0f);
  std::vector<float> q(a.n * a.h * a.k), k(q.size()), v(q.size()), back(qkv.size());
  RopeForwardReference(a, qkv.data(), q.data(), k.data(), v.data());
  const int64_t half = a.k / 2;
  for (int64_t t = 0; t < a.n; ++t) {
    for (int64_t h = 0; h < a.h; ++h) {
      for (int64_t i = 0; i < half; ++i) {
        const double c = cos[t * half + i], s = sin[t * half + i];
        const int64_t in = ((t * 3) * a.h + h) * a.k + i, out = (t * a.h + h) * a.k + i;
        EXPECT_NEAR(q[out], qkv[in] * c - qkv[in + half] * s, 1e-6);
        EXPECT_NEAR(q[out + half], qkv[in] * s + qkv[in + half] * c, 1e-6);
        EXPECT_EQ(v[out], qkv[((t * 3 + 2) * a.h + h) * a.k + i]);
      }
    }
  }
  RopeBackwardReference(a, q.data(), k.data(), v.data(), back.data());
  for (size_t i = 0; i < qkv.size(); ++i) EXPECT_NEAR(back[i], qkv[i], 1e-6) << i;
}

#ifdef TALLY_HAVE_CUDA

// SwiGLU: FP32 within 4 units in the last place (expf differs between the
// host's library and CUDA's by an ulp or two), BF16 within one BF16 ulp.
TEST(ElementwiseGpu, SwiGluMatchesTheReference) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  const int64_t n = 1031, f = 1408;
  const std::vector<float> x = RandomNormal(n * 2 * f, 4, 3.0f), dy = RandomNormal(n * f, 5, 1.0f);
  std::vector<float> y(n * f), dx(n * 2 * f);
  SwiGluForwardReference(x.data(), Dtype::kFloat32, n, f, y.data());
  SwiGluBackwardReference(x.data(), dy.data(), Dtype::kFloat32, n, f, dx.data());
  float *dx_in = Upload(x), *ddy = Upload(dy), *dy_out = Upload(y), *ddx = Upload(dx);
  ASSERT_EQ(SwiGluForwardCuda(dx_in, Dtype::kFloat32, n, f, dy_out, nullptr), "");
  ASSERT_EQ(SwiGluBackwardCuda(dx_in, ddy, Dtype::kFloat32, n, f, ddx, nullptr), "");
  const auto gy = Download(dy_out, y.size()), gdx = Download(ddx, dx.size());
  int bad = 0;
  auto ulps = [](float a, float b) {
    return std::abs(static_cast<int64_t>(FloatBits(a)) - static_cast<int64_t>(FloatBits(b)));
  };
  for (size_t i = 0; i < y.size(); ++i) bad += ulps(gy[i], y[i]) > 4;
  for (size_t i = 0; i < dx.size(); ++i) bad += ulps(gdx[i], dx[i]) > 4;
  EXPECT_EQ(bad, 0);
  for (void* p : std::vector<void*>{dx_in, ddy, dy_out, ddx}) cudaFree(p);

  const std::vector<uint16_t> xb = ToBf16(x), dyb = ToBf16(dy);
  std::vector<uint16_t> yb(n * f), dxb(n * 2 * f);
  SwiGluForwardReference(xb.data(), Dtype::kBFloat16, n, f, yb.data());
  SwiGluBackwardReference(xb.data(), dyb.data(), Dtype::kBFloat16, n, f, dxb.data());
  uint16_t *bx = Upload(xb), *bdy = Upload(dyb), *by = Upload(yb), *bdx = Upload(dxb);
  ASSERT_EQ(SwiGluForwardCuda(bx, Dtype::kBFloat16, n, f, by, nullptr), "");
  ASSERT_EQ(SwiGluBackwardCuda(bx, bdy, Dtype::kBFloat16, n, f, bdx, nullptr), "");
  const auto gyb = Download(by, yb.size()), gdxb = Download(bdx, dxb.size());
  bad = 0;
  for (size_t i = 0; i < yb.size(); ++i) bad += std::abs(int(gyb[i]) - int(yb[i])) > 1;
  for (size_t i = 0; i < dxb.size(); ++i) bad += std::abs(int(gdxb[i]) - int(dxb[i])) > 1;
  EXPECT_EQ(bad, 0);
  for (void* p : std::vector<void*>{bx, bdy, by, bdx}) cudaFree(p);
}

// RoPE: bit for bit, BF16 in and out as the trainer runs it.
TEST(ElementwiseGpu, RopeMatchesTheReferenceBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  RopeArgs a;
  a.n = 4099;
  a.h = 16;
  a.k = 128;
  a.in = a.out = Dtype::kBFloat16;
  const std::vector<float> cos = RandomNormal(a.n * a.k / 2, 6, 0.7f), sin = RandomNormal(a.n * a.k / 2, 7, 0.7f);
  const std::vector<uint16_t> qkv = ToBf16(RandomNormal(a.n * 3 * a.h * a.k, 8, 2.0f));
  const size_t m = a.n * a.h * a.k;
  a.cos = cos.data();
  a.sin = sin.data();
  std::vector<uint16_t> q(m), k(m), v(m), back(qkv.size());
  RopeForwardReference(a, qkv.data(), q.data(), k.data(), v.data());
  RopeBackwardReference(a, q.data(), k.data(), v.data(), back.data());
  float *dc = Upload(cos), *ds = Upload(sin);
  uint16_t *dqkv = Upload(qkv), *dq = Upload(q), *dk = Upload(k), *dv = Upload(v), *dback = Upload(back);
  RopeArgs d = a;
  d.cos = dc;
  d.sin = ds;
  ASSERT_EQ(RopeForwardCuda(d, dqkv, dq, dk, dv, nullptr), "");
  EXPECT_EQ(Download(dq, m), q);
  EXPECT_EQ(Download(dk, m), k);
  EXPECT_EQ(Download(dv, m), v);
  ASSERT_EQ(RopeBackwardCuda(d, dq, dk, dv, dback, nullptr), "");
  EXPECT_EQ(Download(dback, back.size()), back);
  for (void* p : std::vector<void*>{dc, ds, dqkv, dq, dk, dv, dback}) cudaFree(p);
}
#endif

}  // namespace
}  // namespace tally::kernels
