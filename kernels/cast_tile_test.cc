// The cast kernels' own per-thread code (kernels/cast_tile.h) run on the
// CPU: each kernel's loops as its .cu file writes them, every thread of a
// block one after another between what would be its barriers, and the
// warp reductions as their definitions. Against the CPU references, bit
// for bit, over shapes and offsets that take the vector paths, the scalar
// tails and the unaligned fallbacks. What this cannot check (and the GPU
// tests do): the barriers themselves, shuffles, atomics and the launch.
//
// Keep each Emulate* in step with its kernel.
#ifdef TALLY_HAVE_CUDA

#include "kernels/cast_tile.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/float_bits.h"
#include "kernels/fused_cast.h"
#include "kernels/rowwise_cast.h"
#include "kernels/testing.h"

namespace tally::kernels {
namespace {

using namespace cast_tile;  // NOLINT: the code under test

struct SharedTile {
  alignas(16) uint8_t bytes[kTileRows][kTileStride];
};

Target TargetOf(const Fp8Out& o, int64_t rows, int64_t cols) {
  Target t;
  t.rows = rows;
  t.cols = cols;
  t.out = o.out;
  t.out_t = o.out_t;
  t.format = Interpretation(o.format);
  t.bound = OverflowBound(o.format);
  t.cast = o.out != nullptr || o.out_t != nullptr || o.counts != nullptr;
  return t;
}

// Fold: the sinks take the tallies as the atomics would.
void Fold(const Tally& t, float* amax, float* finite, uint64_t* counts) {
  if (amax != nullptr) *amax = BitsFloat(std::max(FloatBits(*amax), t.amax));
  if (finite != nullptr) *finite = BitsFloat(std::max(FloatBits(*finite), t.finite));
  if (counts != nullptr) {
    counts[0] += t.over;
    counts[1] += t.under;
  }
}

// One tile: every thread's row-major phase, then (a barrier) every
// thread's transposed phase.
template <class Producer, class ScaleOf>
void Tile(const Producer& p, const ScaleOf& scale_of, const Target& t, int64_t r0, int64_t c0,
          SharedTile* tile, Tally* tally) {
  for (int th = 0; th < kThreads; ++th) {
    RowMajorPhase(th, p, scale_of, t, r0, c0, tile->bytes, tally);
  }
  if (WritesTranspose(t)) {
    for (int th = 0; th < kThreads; ++th) TransposedPhase(th, t, r0, c0, tile->bytes);
  }
}

float ScaleFrom(const Target& t, const float* scale) {
  return t.cast && scale != nullptr ? *scale : 1.0f;
}

// fp8_cast.cu's CastKernel.
template <typename Src>
void EmulateCast(const CastArgs& a) {
  Target t;
  t.rows = a.rows;
  t.cols = a.cols;
  t.out = a.out;
  t.out_t = a.out_t;
  t.format = Interpretation(a.format);
  t.bound = OverflowBound(a.format);
  t.cast = a.out != nullptr || a.out_t != nullptr || a.counts != nullptr;
  const UniformScale scale{ScaleFrom(t, a.scale)};
  const SourceProducer<Src> source{static_cast<const Src*>(a.x), t.cols};
  const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = tiles_c * ((t.rows + kTileRows - 1) / kTileRows);
  SharedTile tile;
  Tally tally;
  for (int64_t k = 0; k < tiles; ++k) {
    Tile(source, scale, t, (k / tiles_c) * kTileRows, (k % tiles_c) * kTileCols, &tile, &tally);
  }
  Fold(tally, a.amax, a.amax_finite, a.counts);
}

// fused_cast.cu's RmsNormCastKernel.
template <typename Src, typename Out>
void EmulateRmsNormCast(const RmsNormCastArgs& a) {
  const Target t = TargetOf(a.fp8, a.rows, a.cols);
  const UniformScale scale{ScaleFrom(t, a.fp8.scale)};
  const auto* x = static_cast<const Src*>(a.x);
  const int64_t strips = (t.rows + kTileRows - 1) / kTileRows;
  const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
  SharedTile tile;
  float rstd[kTileRows];
  Tally tally;
  for (int64_t s = 0; s < strips; ++s) {
    const int64_t r0 = s * kTileRows;
    for (int i = 0; i < kTileRows && r0 + i < t.rows; ++i) {
      float lane[32];
      for (int l = 0; l < 32; ++l) lane[l] = SumSquares(x, t.cols, r0 + i, l);
      for (int d = 16; d > 0; d /= 2) {  // __shfl_xor_sync, all lanes at once
        float next[32];
        for (int l = 0; l < 32; ++l) next[l] = cast_math::Add(lane[l], lane[l ^ d]);
        std::memcpy(lane, next, sizeof(lane));
      }
      rstd[i] = cast_math::Rstd(lane[0], t.cols, a.eps);
      if (a.rstd != nullptr) a.rstd[r0 + i] = rstd[i];
    }
    const NormProducer<Src, Out> norm{x, t.cols, a.gain, rstd, r0, static_cast<Out*>(a.y)};
    for (int64_t c = tiles_c - 1; c >= 0; --c) {
      Tile(norm, scale, t, r0, c * kTileCols, &tile, &tally);
    }
  }
  Fold(tally, a.fp8.amax, a.fp8.amax_finite, a.fp8.counts);
}

// fused_cast.cu's SwiGluCastKernel.
template <typename Src, typename Out>
void EmulateSwiGluCast(const SwiGluCastArgs& a) {
  const Target t = TargetOf(a.fp8, a.rows, a.cols);
  const UniformScale scale{ScaleFrom(t, a.fp8.scale)};
  const SwiGluProducer<Src, Out> swiglu{static_cast<const Src*>(a.x13), t.cols,
                                        static_cast<Out*>(a.y)};
  const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = tiles_c * ((t.rows + kTileRows - 1) / kTileRows);
  SharedTile tile;
  Tally tally;
  for (int64_t k = 0; k < tiles; ++k) {
    Tile(swiglu, scale, t, (k / tiles_c) * kTileRows, (k % tiles_c) * kTileCols, &tile, &tally);
  }
  Fold(tally, a.fp8.amax, a.fp8.amax_finite, a.fp8.counts);
}

struct RowScales {
  const float* scale;
  float operator()(int i) const { return scale[i]; }
};

// rowwise_cast.cu's RowsKernel and ColumnsKernel.
template <typename Src>
void EmulateRowwise(const RowwiseCastArgs& a) {
  const auto* x = static_cast<const Src*>(a.x);
  Target t;
  t.rows = a.rows;
  t.cols = a.cols;
  (a.axis == RowwiseAxis::kRows ? t.out : t.out_t) = a.out;
  t.format = Interpretation(a.format);
  t.bound = OverflowBound(a.format);
  const float max = Fp8Max(a.format);
  Tally tally;
  if (a.axis == RowwiseAxis::kRows) {
    const int64_t strips = (t.rows + kTileRows - 1) / kTileRows;
    const int64_t tiles_c = (t.cols + kTileCols - 1) / kTileCols;
    const SourceProducer<Src> source{x, t.cols};
    SharedTile tile;
    float scale[kTileRows];
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t r0 = s * kTileRows;
      for (int i = 0; i < kTileRows && r0 + i < t.rows; ++i) {
        unsigned int m = 0;
        for (int l = 0; l < 32; ++l) m = MaxU(m, AbsMaxBits(x, t.cols, r0 + i, l, &tally));
        scale[i] = cast_math::RowScale(FromBits(m), max, a.margin);
        a.scale[r0 + i] = scale[i];
        a.inv_scale[r0 + i] = cast_math::Inverse(scale[i]);
      }
      for (int64_t c = tiles_c - 1; c >= 0; --c) {
        Tile(source, RowScales{scale}, t, r0, c * kTileCols, &tile, &tally);
      }
    }
  } else {
    const int64_t strips = (t.cols + kStripCols - 1) / kStripCols;
    const int64_t tiles_r = (t.rows + kStripRows - 1) / kStripRows;
    struct {
      alignas(16) uint8_t bytes[kStripRows][kStripStride];
    } strip;
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t c0 = s * kStripCols;
      unsigned int col_max[kStripCols] = {};
      for (int th = 0; th < kThreads; ++th) {
        unsigned int mine[kStripCols] = {};
        for (int64_t k = 0; k < tiles_r; ++k) {
          ColumnAmaxPhase(th, x, t.rows, t.cols, k * kStripRows, c0, mine, &tally);
        }
        for (int k = 0; k < kStripCols; ++k) col_max[k] = MaxU(col_max[k], mine[k]);
      }
      float scale[kStripCols];
      for (int k = 0; k < kStripCols; ++k) {
        scale[k] = 1.0f;
        if (c0 + k >= t.cols) continue;
        scale[k] = cast_math::RowScale(FromBits(col_max[k]), max, a.margin);
        a.scale[c0 + k] = scale[k];
        a.inv_scale[c0 + k] = cast_math::Inverse(scale[k]);
      }
      for (int64_t k = tiles_r - 1; k >= 0; --k) {
        for (int th = 0; th < kThreads; ++th) {
          ColumnCastPhase(th, x, t, k * kStripRows, c0, scale, strip.bytes, &tally);
        }
        for (int th = 0; th < kThreads; ++th) {
          ColumnStorePhase(th, t, k * kStripRows, c0, strip.bytes);
        }
      }
    }
  }
  Fold(tally, a.amax, nullptr, a.counts);
}

// ---- inputs ----------------------------------------------------------------

// n values, a few special ones among them, as FP32 and as BF16 bits, each
// stored `offset` elements into its buffer (offset 1: no 16-byte alignment).
struct Input {
  Input(int64_t n, uint32_t seed, int offset, bool specials = true)
      : f32(n + offset), b16(n + offset), offset(offset) {
    std::vector<float> v = test_support::RandomNormal(n, seed, 3.0f);
    if (specials) {
      const float inf = std::numeric_limits<float>::infinity();
      const std::vector<float> s = {0.0f, -0.0f, 1e-30f, -1e-41f, 1e30f, inf, -inf, 500.0f};
      for (size_t i = 0; i < s.size() && i * 997 + 5 < v.size(); ++i) v[i * 997 + 5] = s[i];
    }
    for (int64_t i = 0; i < n; ++i) {
      f32[offset + i] = v[i];
      b16[offset + i] = FloatToBf16(v[i]);
    }
  }
  const void* data(bool bf16) const {
    return bf16 ? static_cast<const void*>(b16.data() + offset) : f32.data() + offset;
  }
  std::vector<float> f32;
  std::vector<uint16_t> b16;
  int offset;
};

// Output buffers, `offset` bytes into their allocation.
struct Sinks {
  Sinks(int64_t n, int64_t y_bytes, int offset)
      : out_buf(n + 16), out_t_buf(n + 16), y_buf(y_bytes + 16), offset(offset) {}
  uint8_t* out() { return out_buf.data() + offset; }
  uint8_t* out_t() { return out_t_buf.data() + offset; }
  void* y() { return y_buf.data() + 4 * offset; }  // FP32 and BF16 offsets of whole elements
  Fp8Out Fp8(const float* scale, Fp8Kind kind) {
    Fp8Out o;
    o.scale = scale;
    o.format = kind;
    o.out = out();
    o.out_t = out_t();
    o.amax = &amax;
    o.amax_finite = &finite;
    o.counts = counts;
    return o;
  }
  std::vector<uint8_t> out_buf, out_t_buf, y_buf;
  int offset;
  float amax = 0, finite = 0;
  uint64_t counts[2] = {0, 0};
};

void ExpectSame(const Sinks& got, const Sinks& want) {
  EXPECT_EQ(got.out_buf, want.out_buf);
  EXPECT_EQ(got.out_t_buf, want.out_t_buf);
  EXPECT_EQ(got.y_buf, want.y_buf);
  EXPECT_EQ(FloatBits(got.amax), FloatBits(want.amax));
  EXPECT_EQ(FloatBits(got.finite), FloatBits(want.finite));
  EXPECT_EQ(got.counts[0], want.counts[0]);
  EXPECT_EQ(got.counts[1], want.counts[1]);
}

struct Shape {
  int64_t rows, cols;
};
// Multiples of the tile and of 16 (vector paths throughout), partial
// tiles, odd widths (rows alternately aligned and not), one row, one
// column.
const Shape kShapes[] = {{64, 256}, {96, 400}, {77, 129}, {33, 48}, {1, 1000}, {300, 1}, {17, 8}};

TEST(CastTileOnCpu, TheCastKernelMatchesTheReference) {
  for (const Shape& s : kShapes) {
    for (int offset : {0, 1}) {
      const Input in(s.rows * s.cols, 11, offset);
      for (bool bf16 : {false, true}) {
        for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
          SCOPED_TRACE(testing::Message() << s.rows << " x " << s.cols << " offset " << offset
                                          << " bf16 " << bf16 << " format " << int(kind));
          const float scale = kind == Fp8Kind::kE4M3 ? 37.5f : 5000.0f;
          Sinks want(s.rows * s.cols, 0, offset), got(s.rows * s.cols, 0, offset);
          CastArgs a;
          a.x = in.data(bf16);
          a.source = bf16 ? SourceKind::kBFloat16 : SourceKind::kFloat32;
          a.rows = s.rows;
          a.cols = s.cols;
          a.scale = &scale;
          a.format = kind;
          a.out = want.out();
          a.out_t = want.out_t();
          a.amax = &want.amax;
          a.amax_finite = &want.finite;
          a.counts = want.counts;
          CastReference(a);
          a.out = got.out();
          a.out_t = got.out_t();
          a.amax = &got.amax;
          a.amax_finite = &got.finite;
          a.counts = got.counts;
          if (bf16) {
            EmulateCast<uint16_t>(a);
          } else {
            EmulateCast<float>(a);
          }
          ExpectSame(got, want);
        }
      }
    }
  }
  // Only the row-major bytes, only the amax.
  const Input in(77 * 129, 12, 0);
  for (int mode = 0; mode < 2; ++mode) {
    const float scale = 3.0f;
    Sinks want(77 * 129, 0, 0), got(77 * 129, 0, 0);
    CastArgs a;
    a.x = in.data(false);
    a.rows = 77;
    a.cols = 129;
    a.scale = mode == 0 ? &scale : nullptr;
    a.out = mode == 0 ? want.out() : nullptr;
    a.amax = &want.amax;
    CastReference(a);
    a.out = mode == 0 ? got.out() : nullptr;
    a.amax = &got.amax;
    EmulateCast<float>(a);
    ExpectSame(got, want);
  }
}

TEST(CastTileOnCpu, TheRmsNormCastKernelMatchesTheReference) {
  for (const Shape& s : kShapes) {
    for (int offset : {0, 1}) {
      const Input in(s.rows * s.cols, 13, offset, /*specials=*/false);
      const Input gain(s.cols, 14, offset, false);
      for (bool bf16_in : {false, true}) {
        for (bool bf16_out : {false, true}) {
          for (bool write_y : {false, true}) {
            SCOPED_TRACE(testing::Message()
                         << s.rows << " x " << s.cols << " offset " << offset << " bf16 in "
                         << bf16_in << " out " << bf16_out << " y " << write_y);
            const float scale = 60.0f;
            const int64_t n = s.rows * s.cols;
            Sinks want(n, 4 * n, offset), got(n, 4 * n, offset);
            std::vector<float> rstd_want(s.rows), rstd_got(s.rows);
            RmsNormCastArgs a;
            a.x = in.data(bf16_in);
            a.x_dtype = bf16_in ? Dtype::kBFloat16 : Dtype::kFloat32;
            a.rows = s.rows;
            a.cols = s.cols;
            a.gain = gain.f32.data() + offset;
            a.eps = 1e-6f;
            a.y_dtype = bf16_out ? Dtype::kBFloat16 : Dtype::kFloat32;
            a.y = write_y ? want.y() : nullptr;
            a.rstd = rstd_want.data();
            a.fp8 = want.Fp8(&scale, Fp8Kind::kE4M3);
            RmsNormCastReference(a);
            a.y = write_y ? got.y() : nullptr;
            a.rstd = rstd_got.data();
            a.fp8 = got.Fp8(&scale, Fp8Kind::kE4M3);
            if (bf16_in && bf16_out) EmulateRmsNormCast<uint16_t, uint16_t>(a);
            if (bf16_in && !bf16_out) EmulateRmsNormCast<uint16_t, float>(a);
            if (!bf16_in && bf16_out) EmulateRmsNormCast<float, uint16_t>(a);
            if (!bf16_in && !bf16_out) EmulateRmsNormCast<float, float>(a);
            ExpectSame(got, want);
            EXPECT_EQ(rstd_got, rstd_want);
          }
        }
      }
    }
  }
}

TEST(CastTileOnCpu, TheSwiGluCastKernelMatchesTheReference) {
  for (const Shape& s : kShapes) {
    for (int offset : {0, 1}) {
      const Input in(s.rows * 2 * s.cols, 15, offset);
      for (bool bf16 : {false, true}) {
        for (Fp8Kind kind : {Fp8Kind::kE4M3, Fp8Kind::kE5M2}) {
          SCOPED_TRACE(testing::Message() << s.rows << " x " << s.cols << " offset " << offset
                                          << " bf16 " << bf16 << " format " << int(kind));
          const float scale = kind == Fp8Kind::kE4M3 ? 25.0f : 3000.0f;
          const int64_t n = s.rows * s.cols;
          Sinks want(n, 4 * n, offset), got(n, 4 * n, offset);
          SwiGluCastArgs a;
          a.x13 = in.data(bf16);
          a.x_dtype = bf16 ? Dtype::kBFloat16 : Dtype::kFloat32;
          a.rows = s.rows;
          a.cols = s.cols;
          a.y_dtype = a.x_dtype;
          a.y = want.y();
          a.fp8 = want.Fp8(&scale, kind);
          SwiGluCastReference(a);
          a.y = got.y();
          a.fp8 = got.Fp8(&scale, kind);
          if (bf16) {
            EmulateSwiGluCast<uint16_t, uint16_t>(a);
          } else {
            EmulateSwiGluCast<float, float>(a);
          }
          ExpectSame(got, want);
        }
      }
    }
  }
}

TEST(CastTileOnCpu, TheRowwiseKernelsMatchTheReference) {
  const Shape shapes[] = {{64, 256}, {300, 48}, {77, 129}, {600, 33}, {1, 1000}, {300, 1}};
  for (const Shape& s : shapes) {
    for (int offset : {0, 1}) {
      const Input in(s.rows * s.cols, 16, offset);
      for (bool bf16 : {false, true}) {
        for (RowwiseAxis axis : {RowwiseAxis::kRows, RowwiseAxis::kColumns}) {
          SCOPED_TRACE(testing::Message() << s.rows << " x " << s.cols << " offset " << offset
                                          << " bf16 " << bf16 << " axis " << int(axis));
          const int64_t n = s.rows * s.cols;
          const int64_t k = axis == RowwiseAxis::kRows ? s.rows : s.cols;
          Sinks want(n, 0, offset), got(n, 0, offset);
          std::vector<float> scale_want(k), inv_want(k), scale_got(k), inv_got(k);
          RowwiseCastArgs a;
          a.x = in.data(bf16);
          a.source = bf16 ? SourceKind::kBFloat16 : SourceKind::kFloat32;
          a.rows = s.rows;
          a.cols = s.cols;
          a.axis = axis;
          a.format = Fp8Kind::kE4M3;
          a.margin = 1;
          a.out = want.out();
          a.scale = scale_want.data();
          a.inv_scale = inv_want.data();
          a.amax = &want.amax;
          a.counts = want.counts;
          RowwiseCastReference(a);
          a.out = got.out();
          a.scale = scale_got.data();
          a.inv_scale = inv_got.data();
          a.amax = &got.amax;
          a.counts = got.counts;
          if (bf16) {
            EmulateRowwise<uint16_t>(a);
          } else {
            EmulateRowwise<float>(a);
          }
          ExpectSame(got, want);
          EXPECT_EQ(scale_got, scale_want);
          EXPECT_EQ(inv_got, inv_want);
        }
      }
    }
  }
}

}  // namespace
}  // namespace tally::kernels

#endif  // TALLY_HAVE_CUDA
