// FP8 casts (CUDA, with CPU references). No LibTorch: raw pointers and a
// stream, so the worker calls them through a thin wrapper
// (worker/precision/quantize.h) and tests compare kernel and reference
// directly.
//
// The formats are OCP FP8 as NVIDIA's hardware converts to them: E4M3 "fn"
// (no infinities, 0x7f/0xff NaN, max 448) and E5M2 (max finite 57344), both
// round to nearest even and, here, saturate to the largest finite value
// (the conversion's SATFINITE mode: what the trainer's clamp-then-cast
// computes).
#ifndef TALLY_KERNELS_FP8_CAST_H_
#define TALLY_KERNELS_FP8_CAST_H_

#include <cstdint>
#include <string>

namespace tally::kernels {

enum class Fp8Kind : uint8_t { kE4M3 = 0, kE5M2 = 1 };
// What a cast reads: FP32, or BF16 (the top half of an FP32).
enum class SourceKind : uint8_t { kFloat32 = 0, kBFloat16 = 1 };

// Largest finite value: 448 and 57344.
constexpr float Fp8Max(Fp8Kind k) { return k == Fp8Kind::kE4M3 ? 448.0f : 57344.0f; }

// The overflow bound: |x * scale| above it counts as clamped. It is the
// trainer's (worker/precision compares the FP32 product with the double
// max x (1 + 1e-6), which ATen rounds to FP32 before comparing), so a value
// scaled exactly to the limit that lands an ulp or two past it is not an
// overflow. 448 + 15 x 2^-15 for E4M3.
constexpr float kE4M3OverflowBound = static_cast<float>(448.0 * (1.0 + 1e-6));
constexpr float kE5M2OverflowBound = static_cast<float>(57344.0 * (1.0 + 1e-6));
constexpr float OverflowBound(Fp8Kind k) {
  return k == Fp8Kind::kE4M3 ? kE4M3OverflowBound : kE5M2OverflowBound;
}

// The FP8 bit pattern of x, rounded to nearest even and saturated to +-max;
// NaN stays NaN (0x7f). Zero and values below half the smallest subnormal
// keep their sign. Bit for bit the hardware's conversion
// (__nv_cvt_float_to_fp8 with __NV_SATFINITE), and ATen's cast of the value
// clamped to +-max.
uint8_t FloatToFp8(float x, Fp8Kind kind);
float Fp8ToFloat(uint8_t bits, Fp8Kind kind);
inline uint8_t FloatToE4M3(float x) { return FloatToFp8(x, Fp8Kind::kE4M3); }
inline float E4M3ToFloat(uint8_t bits) { return Fp8ToFloat(bits, Fp8Kind::kE4M3); }

// One cast of x [rows, cols] (row-major, FP32 or BF16) under the scale
// *scale: out[r][c] = FloatToFp8(x[r][c] * scale) (the product in FP32) and
// out_t[c][r] the same byte (x's transpose, i.e. its column-major image),
// both in one pass over x. Every pointer but x and scale is optional (null:
// not written), so the same call computes only an amax.
//
// amax: max |x| of the input, before scaling, folded into *amax as ATen's
// max folds (a NaN anywhere makes it NaN, else an infinity makes it +Inf):
// with the sign cleared, floats order like their unsigned bits and every NaN
// orders above +Inf, so it is kept as the largest bit pattern; the caller
// zeroes it before the first cast it folds. amax_finite: the same over the
// finite values only (what an amax history records). counts[0] += values
// with |x * scale| > OverflowBound (clamped; infinities included, NaN not),
// counts[1] += nonzero values, NaN excluded, that became zero.
struct CastArgs {
  const void* x = nullptr;
  SourceKind source = SourceKind::kFloat32;
  int64_t rows = 0, cols = 0;
  const float* scale = nullptr;  // one value
  Fp8Kind format = Fp8Kind::kE4M3;
  uint8_t* out = nullptr;        // [rows, cols]
  uint8_t* out_t = nullptr;      // [cols, rows]
  float* amax = nullptr;
  float* amax_finite = nullptr;
  uint64_t* counts = nullptr;    // [2]
};

// The CPU reference (host pointers), the definition the kernel meets.
void CastReference(const CastArgs& args);

// The same on the GPU, bit for bit (device pointers; `stream` is a
// cudaStream_t). Each block converts 32 x 128 tiles, 16 values a thread
// with 16-byte loads and stores (a scalar path where a segment is not
// 16-byte aligned or the tensor's edge cuts it), writes the row-major
// bytes as it reads and the transposed ones from shared memory, and folds
// its amax and counts in with one atomic each. Returns "" or the CUDA error,
// never exits. scale may be null only when out and out_t are.
std::string CastCuda(const CastArgs& args, void* stream);

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_FP8_CAST_H_
