#include "worker/precision/quantize.h"

#if defined(TALLY_WITH_CUDA) && defined(TALLY_HAVE_CUDA)
#include <c10/cuda/CUDAStream.h>

#include "kernels/fp8_cast.h"
#endif

#include <atomic>
#include <cmath>
#include <string>

namespace tally::precision {

double Fp8Max(Fp8Format f) { return f == Fp8Format::kE4M3 ? 448.0 : 57344.0; }

at::ScalarType Fp8Dtype(Fp8Format f) {
  return f == Fp8Format::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

namespace {

std::atomic<int64_t> host_reads{0};

// Leaves one quantization's counts on the device, in stats->pending.
void CountLater(QuantStats* stats, const at::Tensor& overflows, const at::Tensor& underflows,
                int64_t elements) {
  at::Tensor c = at::stack({overflows.sum(), underflows.sum()}).to(at::kLong);
  stats->pending = stats->pending.defined() ? stats->pending + c : c;
  stats->elements += elements;
}

void ResolveCounts(QuantStats* stats) {
  if (stats == nullptr || !stats->pending.defined()) return;
  const std::vector<double> c = internal::ReadHost(stats->pending);
  stats->overflows += static_cast<int64_t>(c[0]);
  stats->underflows += static_cast<int64_t>(c[1]);
  stats->pending = at::Tensor();
}

// The public functions count at once.
at::Tensor Counted(at::Tensor q, QuantStats* stats) {
  ResolveCounts(stats);
  return q;
}

}  // namespace

namespace internal {

std::vector<double> ReadHost(const at::Tensor& t) {
  ++host_reads;
  at::Tensor h = t.to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(h.data_ptr<double>(), h.data_ptr<double>() + h.numel());
}

at::Tensor QuantizeScaledLater(const at::Tensor& x, double scale, Fp8Format f,
                               QuantStats* stats) {
  const double max = Fp8Max(f);
  at::Tensor scaled = x.to(at::kFloat) * scale;
  at::Tensor q = scaled.clamp(-max, max).to(Fp8Dtype(f)).to(at::kFloat);
  if (stats != nullptr) {
    // A value scaled exactly to the limit can land an ulp past it: not an
    // overflow.
    CountLater(stats, scaled.abs().gt(max * (1 + 1e-6)), x.ne(0).logical_and(q.eq(0)),
               x.numel());
  }
  return q;
}

at::Tensor QuantizeDequantizeLater(const at::Tensor& x, double scale, Fp8Format f,
                                   QuantStats* stats) {
  return QuantizeScaledLater(x, scale, f, stats) / scale;
}

at::Tensor QuantizeDequantizeAlongLater(const at::Tensor& x, int64_t dim, Fp8Format f, int margin,
                                        QuantStats* stats, at::Tensor* scales_out) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor amax = xf.abs().amax({dim}, /*keepdim=*/true);
  at::Tensor scales =
      at::where(amax.gt(0).logical_and(at::isfinite(amax)),
                Fp8Max(f) / amax / std::pow(2.0, margin), at::ones_like(amax));
  at::Tensor scaled = xf * scales;
  const double max = Fp8Max(f);
  at::Tensor q = scaled.clamp(-max, max).to(Fp8Dtype(f)).to(at::kFloat);
  if (stats != nullptr) {
    CountLater(stats, scaled.abs().gt(max * (1 + 1e-6)), xf.ne(0).logical_and(q.eq(0)),
               x.numel());
  }
  if (scales_out != nullptr) *scales_out = scales;
  return q / scales;
}

#if defined(TALLY_WITH_CUDA) && defined(TALLY_HAVE_CUDA)
at::Tensor FusedCastE4M3(const at::Tensor& x, double scale, at::Tensor* amax, QuantStats* q) {
  at::Tensor xf = x.contiguous();
  at::Tensor y = at::empty(xf.sizes(), xf.options().dtype(at::kByte));
  at::Tensor amax_dev = at::zeros({1}, xf.options());
  at::Tensor counts = at::zeros({2}, xf.options().dtype(at::kLong));
  const std::string err = kernels::CastToE4M3Cuda(
      xf.data_ptr<float>(), xf.numel(), static_cast<float>(scale), y.data_ptr<uint8_t>(),
      amax_dev.data_ptr<float>(), c10::cuda::getCurrentCUDAStream().stream(),
      reinterpret_cast<uint64_t*>(counts.data_ptr<int64_t>()));
  TORCH_CHECK(err.empty(), "fused FP8 cast: ", err);
  // Both stay on the device: the step reads them with everything else.
  *amax = amax_dev;
  q->pending = q->pending.defined() ? q->pending + counts : counts;
  q->elements += x.numel();
  return y.view(at::kFloat8_e4m3fn);
}
#endif

}  // namespace internal

using internal::QuantizeDequantizeAlongLater;
using internal::QuantizeDequantizeLater;
using internal::QuantizeScaledLater;

int64_t Fp8HostReads() { return host_reads.load(); }

at::Tensor QuantizeScaled(const at::Tensor& x, double scale, Fp8Format f, QuantStats* stats) {
  return Counted(QuantizeScaledLater(x, scale, f, stats), stats);
}

at::Tensor QuantizeDequantize(const at::Tensor& x, double scale, Fp8Format f,
                              QuantStats* stats) {
  return Counted(QuantizeDequantizeLater(x, scale, f, stats), stats);
}

at::Tensor QuantizeDequantizeAlong(const at::Tensor& x, int64_t dim, Fp8Format f, int margin,
                                   QuantStats* stats, at::Tensor* scales_out) {
  return Counted(QuantizeDequantizeAlongLater(x, dim, f, margin, stats, scales_out), stats);
}

}  // namespace tally::precision
