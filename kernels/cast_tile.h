// The per-thread code of the FP8 cast kernels (fp8_cast.cu, fused_cast.cu,
// rowwise_cast.cu), written for both compilers: the kernels run it on the
// GPU between their barriers, and cast_tile_test.cc runs the same code on
// the CPU, every thread of a block one after another phase by phase (what
// the barriers guarantee), so the kernels' indexing, vector and scalar
// paths and transposes are checked against the CPU references where there
// is no GPU. Needs the CUDA headers (vector types, cuda_fp8.h's conversion,
// which has a host definition); no LibTorch.
//
// A tile is 32 rows x 128 columns and a block 256 threads. Row-major phase:
// thread t owns row t / 8 of the tile and its 16 columns (t % 8) x 16: it
// produces 16 values (four 16-byte loads of FP32, two of BF16), converts
// them and writes the 16 FP8 bytes with one 16-byte store, keeping them in
// shared memory too. Transposed phase: thread t owns column t / 2 of the
// tile, i.e. a row of the transpose, and its 16 rows (t % 2) x 16: it
// gathers those bytes from shared memory and writes them with one 16-byte
// store. A segment whose address is not 16-byte aligned, or that the
// tensor's edge cuts short (the scalar tail), is read and written element
// by element instead; the values are the same either way.
//
// BF16 tensors are uint16_t bit patterns here.
#ifndef TALLY_KERNELS_CAST_TILE_H_
#define TALLY_KERNELS_CAST_TILE_H_

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cast_math.h"
#include "kernels/fp8_cast.h"

namespace tally::kernels::cast_tile {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 32;
constexpr int kTileCols = 128;
constexpr int kVec = 16;                       // elements per thread per segment
constexpr int kSegsPerRow = kTileCols / kVec;  // 8 threads per tile row
// Shared bytes per tile row: a multiple of 4 (word stores) whose word
// stride (33) spreads the transposed phase's column reads over the banks.
constexpr int kTileStride = kTileCols + 4;
static_assert(kTileRows * kSegsPerRow == kThreads, "the row-major phase covers the tile");
static_assert(kTileCols * (kTileRows / kVec) == kThreads, "the transposed phase covers it");

using cast_math::Bits;
using cast_math::FromBits;

TALLY_HD bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
TALLY_HD unsigned int MaxU(unsigned int a, unsigned int b) { return a > b ? a : b; }

// Elements per 16 bytes: what an index must be a multiple of for a vector
// access at p + i to be aligned (p itself aligned).
template <typename T>
TALLY_HD constexpr int64_t PerVector() {
  return 16 / static_cast<int64_t>(sizeof(T));
}

// Element i of an FP32 or BF16 array, as FP32.
TALLY_HD float Load1(const float* p, int64_t i) { return p[i]; }
TALLY_HD float Load1(const uint16_t* p, int64_t i) {
  return FromBits(static_cast<uint32_t>(p[i]) << 16);
}

TALLY_HD void Widen(uint32_t pair, float* v) {
  v[0] = FromBits(pair << 16);
  v[1] = FromBits(pair & 0xffff0000u);
}

// N (a multiple of 8) consecutive elements from a 16-byte aligned address.
template <int N>
TALLY_HD void LoadN(const float* p, float* v) {
  const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int k = 0; k < N / 4; ++k) {
    const float4 f = q[k];
    v[4 * k] = f.x;
    v[4 * k + 1] = f.y;
    v[4 * k + 2] = f.z;
    v[4 * k + 3] = f.w;
  }
}
template <int N>
TALLY_HD void LoadN(const uint16_t* p, float* v) {
  const uint4* q = reinterpret_cast<const uint4*>(p);
#pragma unroll
  for (int k = 0; k < N / 8; ++k) {
    const uint4 u = q[k];
    Widen(u.x, v + 8 * k);
    Widen(u.y, v + 8 * k + 2);
    Widen(u.z, v + 8 * k + 4);
    Widen(u.w, v + 8 * k + 6);
  }
}

// One 16-byte store to an aligned address (the device's explicit vector
// store: the compiler may otherwise split a float4 it has scalarised).
TALLY_HD void StoreVector(void* p, uint4 v) {
#if defined(__CUDA_ARCH__)
  __stwb(reinterpret_cast<uint4*>(p), v);
#else
  *reinterpret_cast<uint4*>(p) = v;
#endif
}

// 16 values to a 16-byte aligned address: FP32 as they are, BF16 by their
// top halves (the values are already rounded to BF16).
TALLY_HD void Store16(float* p, const float* v) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    StoreVector(p + 4 * k, make_uint4(Bits(v[4 * k]), Bits(v[4 * k + 1]), Bits(v[4 * k + 2]),
                                      Bits(v[4 * k + 3])));
  }
}
TALLY_HD uint32_t Narrow(float lo, float hi) { return (Bits(lo) >> 16) | (Bits(hi) & 0xffff0000u); }
TALLY_HD void Store16(uint16_t* p, const float* v) {
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const float* w = v + 8 * k;
    StoreVector(p + 8 * k, make_uint4(Narrow(w[0], w[1]), Narrow(w[2], w[3]), Narrow(w[4], w[5]),
                                      Narrow(w[6], w[7])));
  }
}
TALLY_HD void Store1(float* p, int64_t i, float v) { p[i] = v; }
TALLY_HD void Store1(uint16_t* p, int64_t i, float v) {
  p[i] = static_cast<uint16_t>(Bits(v) >> 16);
}

// A value in a tensor of type T: BF16 rounds (nearest even), FP32 keeps it.
TALLY_HD float RoundTo(float v, const float*) { return v; }
TALLY_HD float RoundTo(float v, const uint16_t*) { return cast_math::RoundBf16(v); }

// 16 FP8 bytes with one store.
TALLY_HD uint32_t Pack(const uint8_t* q) {
  return q[0] | (q[1] << 8) | (q[2] << 16) | (static_cast<uint32_t>(q[3]) << 24);
}
TALLY_HD void StoreBytes16(uint8_t* p, const uint8_t* q) {
  StoreVector(p, make_uint4(Pack(q), Pack(q + 4), Pack(q + 8), Pack(q + 12)));
}

// A thread's share of what a cast measures.
struct Tally {
  unsigned int amax = 0, finite = 0;  // |x| bits, sign cleared
  unsigned long long over = 0, under = 0;
};

TALLY_HD void Observe(float v, Tally* t) {
  const unsigned int bits = Bits(v) & 0x7fffffffu;
  t->amax = MaxU(t->amax, bits);
  if (bits < 0x7f800000u) t->finite = MaxU(t->finite, bits);
}

// What a cast writes and how.
struct Target {
  int64_t rows = 0, cols = 0;
  uint8_t* out = nullptr;    // [rows, cols]
  uint8_t* out_t = nullptr;  // [cols, rows]
  __nv_fp8_interpretation_t format = __NV_E4M3;
  float bound = 0;
  bool cast = true;  // false: the amax alone
};

TALLY_HD __nv_fp8_interpretation_t Interpretation(Fp8Kind k) {
  return k == Fp8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2;
}

// FloatToFp8(v x scale), the product rounded to FP32; counts as
// kernels/fp8_cast.h defines them.
TALLY_HD uint8_t Convert(float v, float scale, const Target& t, Tally* tally) {
  const float s = cast_math::Mul(v, scale);
  const uint8_t q = static_cast<uint8_t>(__nv_cvt_float_to_fp8(s, __NV_SATFINITE, t.format));
  tally->over += FromBits(Bits(s) & 0x7fffffffu) > t.bound;  // NaN compares false, as in ATen
  tally->under += v != 0.0f && (q & 0x7f) == 0;
  return q;
}

// The row-major phase of the tile at (r0, c0) for thread `thread`.
// Producer gives the values to cast:
//   bool Vector(r, c): segment (r, c..c+15) may use 16-byte accesses
//   void Get16(r, c, float v[16]); float Get1(r, c)
// (either may also write a side output, e.g. the high-precision value).
// ScaleOf(i): the scale of the tile's row i.
template <class Producer, class ScaleOf>
TALLY_HD void RowMajorPhase(int thread, const Producer& p, const ScaleOf& scale_of, const Target& t,
                            int64_t r0, int64_t c0, uint8_t (*tile)[kTileStride], Tally* tally) {
  const int i = thread / kSegsPerRow, j = thread % kSegsPerRow;
  const int64_t r = r0 + i, c = c0 + j * kVec;
  if (r >= t.rows || c >= t.cols) return;
  const int n = t.cols - c < kVec ? static_cast<int>(t.cols - c) : kVec;
  float v[kVec];
  if (n == kVec && p.Vector(r, c)) {
    p.Get16(r, c, v);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = k < n ? p.Get1(r, c + k) : 0.0f;
  }
  uint8_t q[kVec];
  const float scale = scale_of(i);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    q[k] = 0;
    if (k < n) {
      Observe(v[k], tally);
      if (t.cast) q[k] = Convert(v[k], scale, t, tally);
    }
  }
  if (!t.cast) return;
  const int64_t at = r * t.cols + c;
  if (t.out != nullptr) {
    if (n == kVec && Aligned16(t.out + at)) {
      StoreBytes16(t.out + at, q);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (k < n) t.out[at + k] = q[k];
      }
    }
  }
  if (t.out_t != nullptr) {
    uint8_t* row = tile[i] + j * kVec;
#pragma unroll
    for (int k = 0; k < kVec; k += 4) *reinterpret_cast<uint32_t*>(row + k) = Pack(q + k);
  }
}

// The transposed phase (after every thread's row-major phase of the same
// tile): out_t[c0 + t / 2][r0 + (t % 2) x 16 ...] from the shared tile.
TALLY_HD void TransposedPhase(int thread, const Target& t, int64_t r0, int64_t c0,
                              uint8_t (*tile)[kTileStride]) {
  const int cc = thread / 2, h = thread % 2;
  const int64_t oc = c0 + cc, orow = r0 + h * kVec;
  if (oc >= t.cols || orow >= t.rows) return;
  const int m = t.rows - orow < kVec ? static_cast<int>(t.rows - orow) : kVec;
  uint8_t q[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) q[k] = k < m ? tile[h * kVec + k][cc] : 0;
  const int64_t at = oc * t.rows + orow;
  if (m == kVec && Aligned16(t.out_t + at)) {
    StoreBytes16(t.out_t + at, q);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (k < m) t.out_t[at + k] = q[k];
    }
  }
}

// Whether a tile's transposed phase runs.
TALLY_HD bool WritesTranspose(const Target& t) { return t.cast && t.out_t != nullptr; }

struct UniformScale {
  float scale;
  TALLY_HD float operator()(int) const { return scale; }
};

// ---- what each kernel casts ------------------------------------------------

// The tensor itself (fp8_cast): element (r, c) = x[r * cols + c].
template <typename Src>
struct SourceProducer {
  const Src* x;
  int64_t cols;
  TALLY_HD bool Vector(int64_t r, int64_t c) const {
    return Aligned16(x) && (r * cols + c) % PerVector<Src>() == 0;
  }
  TALLY_HD void Get16(int64_t r, int64_t c, float* v) const { LoadN<kVec>(x + r * cols + c, v); }
  TALLY_HD float Get1(int64_t r, int64_t c) const { return Load1(x, r * cols + c); }
};

// RMSNorm's output (fused_cast: RmsNormCast): (x rstd[r]) gain[c], rounded
// to Out's precision, also written to y when y is not null. rstd holds the
// strip's rows from r0.
template <typename Src, typename Out>
struct NormProducer {
  const Src* x;
  int64_t cols;
  const float* gain;
  const float* rstd;
  int64_t r0;
  Out* y;
  TALLY_HD bool Vector(int64_t r, int64_t c) const {
    const int64_t at = r * cols + c;
    return Aligned16(x) && at % PerVector<Src>() == 0 && Aligned16(gain) &&
           c % PerVector<float>() == 0 &&
           (y == nullptr || (Aligned16(y) && at % PerVector<Out>() == 0));
  }
  TALLY_HD void Get16(int64_t r, int64_t c, float* v) const {
    const int64_t at = r * cols + c;
    float g[kVec];
    LoadN<kVec>(x + at, v);
    LoadN<kVec>(gain + c, g);
    const float s = rstd[r - r0];
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = RoundTo(cast_math::Normed(v[k], s, g[k]), y);
    if (y != nullptr) Store16(y + at, v);
  }
  TALLY_HD float Get1(int64_t r, int64_t c) const {
    const int64_t at = r * cols + c;
    const float v = RoundTo(cast_math::Normed(Load1(x, at), rstd[r - r0], gain[c]), y);
    if (y != nullptr) Store1(y, at, v);
    return v;
  }
};

// SwiGLU of the joint gate/up product (fused_cast: SwiGluCast): silu(a) b
// with a = x13[r][c], b = x13[r][f + c], rounded to Out's precision, also
// written to y when y is not null.
template <typename Src, typename Out>
struct SwiGluProducer {
  const Src* x13;
  int64_t f;
  Out* y;
  TALLY_HD bool Vector(int64_t r, int64_t c) const {
    const int64_t a = r * 2 * f + c;
    return Aligned16(x13) && a % PerVector<Src>() == 0 && (a + f) % PerVector<Src>() == 0 &&
           (y == nullptr || (Aligned16(y) && (r * f + c) % PerVector<Out>() == 0));
  }
  TALLY_HD void Get16(int64_t r, int64_t c, float* v) const {
    float b[kVec];
    LoadN<kVec>(x13 + r * 2 * f + c, v);
    LoadN<kVec>(x13 + r * 2 * f + f + c, b);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = RoundTo(cast_math::SwiGlu(v[k], b[k]), y);
    if (y != nullptr) Store16(y + r * f + c, v);
  }
  TALLY_HD float Get1(int64_t r, int64_t c) const {
    const float v =
        RoundTo(cast_math::SwiGlu(Load1(x13, r * 2 * f + c), Load1(x13, r * 2 * f + f + c)), y);
    if (y != nullptr) Store1(y, r * f + c, v);
    return v;
  }
};

// ---- per-row passes (RMSNorm's sum of squares, row-wise amax) -----------

// Lane `lane`'s share of row r of x [., cols]: it reads the 8-element
// chunks lane, lane + 32, ... (16-byte loads where aligned) in order.
// SumSquares adds their squares in element order, each product and sum
// rounded to FP32 (the order RmsNormCastReference defines); AbsMaxBits
// keeps the largest |x| bits.
template <typename Src, typename Fold>
TALLY_HD void ForLaneChunks(const Src* x, int64_t cols, int64_t r, int lane, Fold fold) {
  constexpr int kChunk = 8;
  const Src* row = x + r * cols;
  for (int64_t c = static_cast<int64_t>(lane) * kChunk; c < cols; c += 32 * kChunk) {
    float v[kChunk];
    const int n = cols - c < kChunk ? static_cast<int>(cols - c) : kChunk;
    if (n == kChunk && Aligned16(x) && (r * cols + c) % PerVector<Src>() == 0) {
      LoadN<kChunk>(row + c, v);
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k) v[k] = k < n ? Load1(row, c + k) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (k < n) fold(v[k]);
    }
  }
}

template <typename Src>
TALLY_HD float SumSquares(const Src* x, int64_t cols, int64_t r, int lane) {
  float acc = 0.0f;
  ForLaneChunks(x, cols, r, lane,
                [&acc](float v) { acc = cast_math::Add(acc, cast_math::Mul(v, v)); });
  return acc;
}

template <typename Src>
TALLY_HD unsigned int AbsMaxBits(const Src* x, int64_t cols, int64_t r, int lane, Tally* tally) {
  unsigned int m = 0;
  ForLaneChunks(x, cols, r, lane, [&](float v) {
    m = MaxU(m, Bits(v) & 0x7fffffffu);
    Observe(v, tally);
  });
  return m;
}

// ---- the column-wise cast (rowwise_cast, axis kColumns) -------------------
// A block owns a strip of 16 columns and walks it down in tiles of 256
// rows, a thread per row: a first pass takes each column's amax, a second
// casts under each column's scale and writes the transpose (16 rows of
// out_t, 256 bytes each per tile) through shared memory.
constexpr int kStripCols = 16;
constexpr int kStripRows = kThreads;
constexpr int kStripStride = kStripCols + 1;  // bytes: spreads the gathers over the banks

// Thread `thread`'s values in row r0 + thread, columns c0..c0+15 (n of
// them in the tensor); returns n (0 past the last row).
template <typename Src>
TALLY_HD int StripRow(const Src* x, int64_t rows, int64_t cols, int64_t r0, int64_t c0, int thread,
                      float* v) {
  const int64_t r = r0 + thread;
  if (r >= rows) return 0;
  const int n = cols - c0 < kStripCols ? static_cast<int>(cols - c0) : kStripCols;
  const int64_t at = r * cols + c0;
  if (n == kStripCols && Aligned16(x) && at % PerVector<Src>() == 0) {
    LoadN<kStripCols>(x + at, v);
  } else {
#pragma unroll
    for (int k = 0; k < kStripCols; ++k) v[k] = k < n ? Load1(x, at + k) : 0.0f;
  }
  return n;
}

// First pass: thread's running |x| maxima per column (bits), folded into
// col_max[16] over the rows it reads.
template <typename Src>
TALLY_HD void ColumnAmaxPhase(int thread, const Src* x, int64_t rows, int64_t cols, int64_t r0,
                              int64_t c0, unsigned int* col_max, Tally* tally) {
  float v[kStripCols];
  const int n = StripRow(x, rows, cols, r0, c0, thread, v);
#pragma unroll
  for (int k = 0; k < kStripCols; ++k) {
    if (k < n) {
      col_max[k] = MaxU(col_max[k], Bits(v[k]) & 0x7fffffffu);
      Observe(v[k], tally);
    }
  }
}

// Second pass, row part: thread's row cast under the columns' scales, the
// bytes kept in strip[thread].
template <typename Src>
TALLY_HD void ColumnCastPhase(int thread, const Src* x, const Target& t, int64_t r0, int64_t c0,
                              const float* col_scale, uint8_t (*strip)[kStripStride],
                              Tally* tally) {
  float v[kStripCols];
  const int n = StripRow(x, t.rows, t.cols, r0, c0, thread, v);
#pragma unroll
  for (int k = 0; k < kStripCols; ++k) {
    if (k < n) strip[thread][k] = Convert(v[k], col_scale[k], t, tally);
  }
}

// Second pass, transposed part: out_t row c0 + thread / 16, its 16 bytes
// from row r0 + (thread % 16) x 16.
TALLY_HD void ColumnStorePhase(int thread, const Target& t, int64_t r0, int64_t c0,
                               uint8_t (*strip)[kStripStride]) {
  const int cc = thread / kVec, s = thread % kVec;
  const int64_t oc = c0 + cc, orow = r0 + s * kVec;
  if (oc >= t.cols || orow >= t.rows) return;
  const int m = t.rows - orow < kVec ? static_cast<int>(t.rows - orow) : kVec;
  uint8_t q[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) q[k] = k < m ? strip[s * kVec + k][cc] : 0;
  const int64_t at = oc * t.rows + orow;
  if (m == kVec && Aligned16(t.out_t + at)) {
    StoreBytes16(t.out_t + at, q);
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (k < m) t.out_t[at + k] = q[k];
    }
  }
}

}  // namespace tally::kernels::cast_tile

#endif  // TALLY_KERNELS_CAST_TILE_H_
