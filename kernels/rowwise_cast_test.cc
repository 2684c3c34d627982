// Row-wise FP8 casts: the CPU reference against its definition (a scale
// per row from the row's amax, the plain cast under it; per column equal
// to per row of the transpose), and the CUDA kernel against the reference
// bit for bit (skipped where there is no GPU; cast_tile_test.cc runs the
// kernel's per-thread code against the reference on the CPU).
#include "kernels/rowwise_cast.h"

#include <cmath>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/float_bits.h"
#include "kernels/fp8_scaling.h"
#include "kernels/testing.h"

namespace tally::kernels {
namespace {

using test_support::RandomNormal;

struct Result {
  std::vector<uint8_t> out;
  std::vector<float> scale, inv_scale;
  float amax = 0;
  uint64_t counts[2] = {0, 0};
};

Result RunReference(const void* x, SourceKind source, int64_t rows, int64_t cols, RowwiseAxis axis,
                    Fp8Kind kind, int margin) {
  Result r;
  const int64_t n = axis == RowwiseAxis::kRows ? rows : cols;
  r.out.assign(rows * cols, 0);
  r.scale.assign(n, 0);
  r.inv_scale.assign(n, 0);
  RowwiseCastArgs a;
  a.x = x;
  a.source = source;
  a.rows = rows;
  a.cols = cols;
  a.axis = axis;
  a.format = kind;
  a.margin = margin;
  a.out = r.out.data();
  a.scale = r.scale.data();
  a.inv_scale = r.inv_scale.data();
  a.amax = &r.amax;
  a.counts = r.counts;
  RowwiseCastReference(a);
  return r;
}

TEST(RowwiseCastReference, EachRowIsCastUnderItsOwnScale) {
  const int64_t rows = 23, cols = 41;
  std::vector<float> x = RandomNormal(rows * cols, 1, 2.0f);
  for (int64_t c = 0; c < cols; ++c) x[3 * cols + c] = 0.0f;  // a zero row: scale 1
  x[5 * cols + 2] = std::nanf("");                            // a NaN row: scale 1
  x[7 * cols + 9] = std::numeric_limits<float>::infinity();   // an Inf row: scale 1
  for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
    const int margin = kind == Fp8Kind::kE4M3 ? 0 : 1;
    const Result r =
        RunReference(x.data(), SourceKind::kFloat32, rows, cols, RowwiseAxis::kRows, kind, margin);
    for (int64_t i = 0; i < rows; ++i) {
      float amax = 0;
      for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[i * cols + c]));
      const bool special = i == 3 || i == 5 || i == 7;
      EXPECT_EQ(r.scale[i], special ? 1.0f : ScaleForAmax(amax, kind, margin, 1.0f)) << i;
      EXPECT_EQ(r.inv_scale[i], static_cast<float>(1.0 / r.scale[i]));
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(r.out[i * cols + c], FloatToFp8(x[i * cols + c] * r.scale[i], kind));
      }
      if (!special) {
        // The row's largest value lands at the format's limit / 2^margin.
        float biggest = 0;
        for (int64_t c = 0; c < cols; ++c) {
          biggest = std::max(biggest, std::fabs(Fp8ToFloat(r.out[i * cols + c], kind)));
        }
        EXPECT_NEAR(biggest, Fp8Max(kind) / (1 << margin), Fp8Max(kind) / 8) << i;
      }
    }
    EXPECT_TRUE(std::isnan(r.amax));
    EXPECT_EQ(r.counts[0], 1u) << "only the Inf (under scale 1) clamps";
  }
}

// Per column is per row of the transpose, written transposed.
TEST(RowwiseCastReference, ColumnsAreTheRowsOfTheTranspose) {
  const int64_t rows = 19, cols = 33;
  const std::vector<float> x = RandomNormal(rows * cols, 2, 5.0f);
  std::vector<float> xt(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) xt[c * rows + r] = x[r * cols + c];
  }
  const Result by_col = RunReference(x.data(), SourceKind::kFloat32, rows, cols,
                                     RowwiseAxis::kColumns, Fp8Kind::kE5M2, 0);
  const Result by_row = RunReference(xt.data(), SourceKind::kFloat32, cols, rows,
                                     RowwiseAxis::kRows, Fp8Kind::kE5M2, 0);
  EXPECT_EQ(by_col.out, by_row.out);
  EXPECT_EQ(by_col.scale, by_row.scale);
  EXPECT_EQ(by_col.inv_scale, by_row.inv_scale);
  EXPECT_EQ(FloatBits(by_col.amax), FloatBits(by_row.amax));
  EXPECT_EQ(by_col.counts[1], by_row.counts[1]);
}

// BF16 sources read as their FP32 values.
TEST(RowwiseCastReference, Bf16IsItsFloatValue) {
  const int64_t rows = 8, cols = 24;
  const std::vector<float> x = RandomNormal(rows * cols, 3, 1.0f);
  std::vector<uint16_t> xb(x.size());
  std::vector<float> xr(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = FloatToBf16(x[i]);
    xr[i] = Bf16ToFloat(xb[i]);
  }
  for (RowwiseAxis axis : {RowwiseAxis::kRows, RowwiseAxis::kColumns}) {
    const Result b =
        RunReference(xb.data(), SourceKind::kBFloat16, rows, cols, axis, Fp8Kind::kE4M3, 0);
    const Result f =
        RunReference(xr.data(), SourceKind::kFloat32, rows, cols, axis, Fp8Kind::kE4M3, 0);
    EXPECT_EQ(b.out, f.out);
    EXPECT_EQ(b.scale, f.scale);
  }
}

#ifdef TALLY_HAVE_CUDA
using test_support::Download;
using test_support::HaveGpu;
using test_support::Upload;

TEST(RowwiseCastGpu, MatchesTheReferenceBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "needs a GPU (none here)";
  for (auto [rows, cols] :
       {std::pair<int64_t, int64_t>{8192, 2048}, {2048, 5632}, {77, 129}, {1, 1000}, {3000, 1}}) {
    std::vector<float> x = RandomNormal(rows * cols, 4, 3.0f);
    x[rows * cols / 2] = std::numeric_limits<float>::infinity();
    x[rows * cols / 3] = 0.0f;
    std::vector<uint16_t> xb(x.size());
    for (size_t i = 0; i < x.size(); ++i) xb[i] = FloatToBf16(x[i]);
    float* dx32 = Upload(x);
    uint16_t* dx16 = Upload(xb);
    for (RowwiseAxis axis : {RowwiseAxis::kRows, RowwiseAxis::kColumns}) {
      for (SourceKind source : {SourceKind::kFloat32, SourceKind::kBFloat16}) {
        for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
          SCOPED_TRACE(testing::Message() << rows << " x " << cols << " axis " << int(axis)
                                          << " source " << int(source) << " format " << int(kind));
          const void* hx =
              source == SourceKind::kFloat32 ? static_cast<const void*>(x.data()) : xb.data();
          const Result want = RunReference(hx, source, rows, cols, axis, kind, 0);
          const int64_t n = want.scale.size();
          uint8_t* out = Upload(std::vector<uint8_t>(rows * cols));
          float* scale = Upload(std::vector<float>(n));
          float* inv = Upload(std::vector<float>(n));
          float* amax = Upload(std::vector<float>{0});
          uint64_t* counts = Upload(std::vector<uint64_t>{0, 0});
          RowwiseCastArgs a;
          a.x = source == SourceKind::kFloat32 ? static_cast<const void*>(dx32) : dx16;
          a.source = source;
          a.rows = rows;
          a.cols = cols;
          a.axis = axis;
          a.format = kind;
          a.out = out;
          a.scale = scale;
          a.inv_scale = inv;
          a.amax = amax;
          a.counts = counts;
          ASSERT_EQ(RowwiseCastCuda(a, nullptr), "");
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          EXPECT_EQ(Download(out, rows * cols), want.out);
          EXPECT_EQ(Download(scale, n), want.scale);
          EXPECT_EQ(Download(inv, n), want.inv_scale);
          EXPECT_EQ(FloatBits(Download(amax, 1)[0]), FloatBits(want.amax));
          const auto c = Download(counts, 2);
          EXPECT_EQ(c[0], want.counts[0]);
          EXPECT_EQ(c[1], want.counts[1]);
          for (void* p : std::vector<void*>{out, scale, inv, amax, counts}) cudaFree(p);
        }
      }
    }
    cudaFree(dx32);
    cudaFree(dx16);
  }
}
#endif

}  // namespace
}  // namespace tally::kernels
