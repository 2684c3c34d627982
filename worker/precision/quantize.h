// FP8 numerics: the two formats, casts to them under a scale (clamped to the
// format's finite range first: LibTorch turns |x| > 448 into NaN when casting
// to E4M3), quantize-dequantize round trips per tensor and per slice, the
// overflow/underflow counts of each cast, and CastFp8: the fused cast of
// kernels/fp8_cast.h (row-major and transposed bytes, amax and counts in one
// pass, the scale read from device memory) on the tensor's device, the CUDA
// kernel on a GPU and its CPU reference elsewhere, bit for bit the same.
//
// Counts: the public Quantize* functions read their counts back at once; the
// internal "Later" variants leave them on the device (QuantStats::pending).
// Not thread-safe.
#ifndef TALLY_WORKER_PRECISION_QUANTIZE_H_
#define TALLY_WORKER_PRECISION_QUANTIZE_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace tally::precision {

enum class Fp8Format { kE4M3, kE5M2 };
double Fp8Max(Fp8Format format);  // 448 and 57344
at::ScalarType Fp8Dtype(Fp8Format format);

struct QuantStats {
  int64_t overflows = 0;   // |x * scale| beyond the format's range
  int64_t underflows = 0;  // nonzero x that became 0
  int64_t elements = 0;
  // Counts still on the device, [overflows, underflows] (int64). The public
  // functions below leave none.
  at::Tensor pending;
};

// The FP8 value of x * scale (clamped), as FP32 and not yet divided back.
at::Tensor QuantizeScaled(const at::Tensor& x, double scale, Fp8Format format,
                          QuantStats* stats);
// x through FP8 and back: QuantizeScaled(x) / scale.
at::Tensor QuantizeDequantize(const at::Tensor& x, double scale, Fp8Format format,
                              QuantStats* stats);
// x through FP8 and back with one scale per slice along `dim` (the amax
// over `dim` of each slice, e.g. dim 1 of [M, K]: a scale per row); a zero
// slice keeps scale 1. `scales` gets them (the shape of amax with keepdim).
at::Tensor QuantizeDequantizeAlong(const at::Tensor& x, int64_t dim, Fp8Format format, int margin,
                                   QuantStats* stats, at::Tensor* scales = nullptr);

// What one fused cast writes, as asked.
struct Fp8Cast {
  at::Tensor data;    // [M, K] in the FP8 dtype
  at::Tensor data_t;  // [K, M]: the transpose, x's column-major image
};

// Where a cast folds what it measured; each may be undefined (not
// measured). amax and amax_finite are one-element FP32 tensors (folded as
// kernels/fp8_cast.h says: the caller starts them at 0), counts a
// two-element int64 tensor, [clamped, flushed], added to. All on x's device.
struct CastSinks {
  at::Tensor amax, amax_finite, counts;
};

// One pass over x2 [M, K] (FP32 or BF16; other dtypes are converted to FP32
// first) cast under `scale` (one FP32 value on x2's device): row-major
// bytes with `rows`, transposed ones with `transposed`, and the sinks. With
// neither layout it only measures (scale may then be undefined). CUDA
// tensors run the kernel on the current stream (nothing waits for it); CPU
// tensors its reference. `rows_into`, when defined, is where the row-major
// bytes go (a contiguous [M, K] uint8 or FP8 tensor on x2's device, e.g.
// a row block of a larger image); data is then a view of it. Throws
// c10::Error when the kernel reports an error or is not in this build.
Fp8Cast CastFp8(const at::Tensor& x2, const at::Tensor& scale, Fp8Format format, bool rows,
                bool transposed, const CastSinks& sinks, const at::Tensor& rows_into = {});

// How many values the FP8 bookkeeping has read back from the device in this
// process (each one a host sync on a GPU): for tests.
int64_t Fp8HostReads();

// Shared by the files of worker/precision only; not for callers.
namespace internal {

// The values of a small device tensor, as doubles on the host: one read,
// counted in Fp8HostReads().
std::vector<double> ReadHost(const at::Tensor& t);

// The functions above with the counts left on the device, in
// stats->pending (stats may be null: nothing counted).
at::Tensor QuantizeScaledLater(const at::Tensor& x, double scale, Fp8Format format,
                               QuantStats* stats);
at::Tensor QuantizeDequantizeAlongLater(const at::Tensor& x, int64_t dim, Fp8Format format,
                                        int margin, QuantStats* stats, at::Tensor* scales_out);
// The same cast kept in FP8: x * scales clamped, in Fp8Dtype(format) (so
// QuantizeDequantizeAlongLater is its FP32 value / scales); *scales_out
// gets the scales and, when not null, *amax_out each slice's amax (both
// the shape of amax with keepdim).
at::Tensor QuantizeAlongLater(const at::Tensor& x, int64_t dim, Fp8Format format, int margin,
                              QuantStats* stats, at::Tensor* scales_out,
                              at::Tensor* amax_out = nullptr);

}  // namespace internal
}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_QUANTIZE_H_
