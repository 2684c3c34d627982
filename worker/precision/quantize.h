// FP8 numerics: the two formats, casts to them under a scale (clamped to the
// format's finite range first: LibTorch turns |x| > 448 into NaN when casting
// to E4M3), quantize-dequantize round trips per tensor and per slice, and
// the overflow/underflow counts of each cast. On CUDA builds with the
// kernels, the fused E4M3 cast (kernels/fp8_cast.h) that does the cast, the
// amax and the counts in one pass.
//
// Counts: the public functions below read their counts back at once; the
// internal "Later" variants leave them on the device (QuantStats::pending)
// so a training step reads everything in one go. Not thread-safe.
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
  // Counts still on the device, [overflows, underflows] (int64): the FP8
  // linears read them once per step, not once per product. The functions
  // below leave none.
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
at::Tensor QuantizeDequantizeLater(const at::Tensor& x, double scale, Fp8Format format,
                                   QuantStats* stats);
at::Tensor QuantizeDequantizeAlongLater(const at::Tensor& x, int64_t dim, Fp8Format format,
                                        int margin, QuantStats* stats, at::Tensor* scales_out);

#if defined(TALLY_WITH_CUDA) && defined(TALLY_HAVE_CUDA)
// E4M3 image of an FP32 CUDA tensor under a known scale, with its amax ([1]
// FP32) and the clamped/flushed counts (added to q->pending), in one pass
// over memory (kernels/fp8_cast.h) instead of an amax pass, a cast and two
// counting passes. Both stay on the device. Throws c10::Error when the
// kernel reports an error.
at::Tensor FusedCastE4M3(const at::Tensor& x, double scale, at::Tensor* amax, QuantStats* q);
#endif

}  // namespace internal
}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_QUANTIZE_H_
