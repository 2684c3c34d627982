#include "worker/precision/quantize.h"

#if defined(TALLY_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

#include <ATen/record_function.h>

#include <atomic>
#include <cmath>
#include <string>

#include "kernels/fp8_cast.h"

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

template <typename T>
T* PointerOr(const at::Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
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

at::Tensor QuantizeAlongLater(const at::Tensor& x, int64_t dim, Fp8Format f, int margin,
                              QuantStats* stats, at::Tensor* scales_out, at::Tensor* amax_out) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor amax = xf.abs().amax({dim}, /*keepdim=*/true);
  at::Tensor scales =
      at::where(amax.gt(0).logical_and(at::isfinite(amax)),
                Fp8Max(f) / amax / std::pow(2.0, margin), at::ones_like(amax));
  at::Tensor scaled = xf * scales;
  const double max = Fp8Max(f);
  at::Tensor q8 = scaled.clamp(-max, max).to(Fp8Dtype(f));
  if (stats != nullptr) {
    CountLater(stats, scaled.abs().gt(max * (1 + 1e-6)),
               xf.ne(0).logical_and(q8.to(at::kFloat).eq(0)), x.numel());
  }
  *scales_out = scales;
  if (amax_out != nullptr) *amax_out = amax;
  return q8;
}

at::Tensor QuantizeDequantizeAlongLater(const at::Tensor& x, int64_t dim, Fp8Format f, int margin,
                                        QuantStats* stats, at::Tensor* scales_out) {
  at::Tensor scales;
  const at::Tensor q = QuantizeAlongLater(x, dim, f, margin, stats, &scales).to(at::kFloat);
  if (scales_out != nullptr) *scales_out = scales;
  return q / scales;
}

}  // namespace internal

using internal::QuantizeDequantizeAlongLater;
using internal::QuantizeScaledLater;

int64_t Fp8HostReads() { return host_reads.load(); }

at::Tensor QuantizeScaled(const at::Tensor& x, double scale, Fp8Format f, QuantStats* stats) {
  return Counted(QuantizeScaledLater(x, scale, f, stats), stats);
}

at::Tensor QuantizeDequantize(const at::Tensor& x, double scale, Fp8Format f,
                              QuantStats* stats) {
  return Counted(QuantizeScaledLater(x, scale, f, stats) / scale, stats);
}

at::Tensor QuantizeDequantizeAlong(const at::Tensor& x, int64_t dim, Fp8Format f, int margin,
                                   QuantStats* stats, at::Tensor* scales_out) {
  return Counted(QuantizeDequantizeAlongLater(x, dim, f, margin, stats, scales_out), stats);
}

Fp8Cast CastFp8(const at::Tensor& x2, const at::Tensor& scale, Fp8Format format, bool rows,
                bool transposed, const CastSinks& sinks, const at::Tensor& rows_into) {
  RECORD_USER_SCOPE("tally::fp8_cast");
  TORCH_CHECK(x2.dim() == 2, "CastFp8: x must be 2-D, got ", x2.dim(), "-D");
  at::Tensor x = x2.scalar_type() == at::kBFloat16 || x2.scalar_type() == at::kFloat
                     ? x2.contiguous()
                     : x2.to(at::kFloat).contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  Fp8Cast out;
  const auto bytes = x.options().dtype(at::kByte);
  if (rows && rows_into.defined()) {
    TORCH_CHECK(rows_into.dim() == 2 && rows_into.size(0) == M && rows_into.size(1) == K &&
                    rows_into.element_size() == 1 && rows_into.is_contiguous() &&
                    rows_into.device() == x.device(),
                "CastFp8: the row-major output must be a contiguous one-byte [", M, ", ", K,
                "] tensor on ", x.device());
    out.data = rows_into.view(at::kByte);
  } else if (rows) {
    out.data = at::empty({M, K}, bytes);
  }
  if (transposed) out.data_t = at::empty({K, M}, bytes);
  if (rows || transposed) {
    TORCH_CHECK(scale.defined() && scale.numel() == 1 && scale.scalar_type() == at::kFloat &&
                    scale.device() == x.device(),
                "CastFp8: the scale must be one FP32 value on ", x.device());
  }
  for (const at::Tensor* s : {&sinks.amax, &sinks.amax_finite}) {
    TORCH_CHECK(!s->defined() || (s->numel() == 1 && s->scalar_type() == at::kFloat &&
                                  s->is_contiguous() && s->device() == x.device()),
                "CastFp8: an amax sink must be one contiguous FP32 value on ", x.device());
  }
  TORCH_CHECK(!sinks.counts.defined() ||
                  (sinks.counts.numel() == 2 && sinks.counts.scalar_type() == at::kLong &&
                   sinks.counts.is_contiguous() && sinks.counts.device() == x.device()),
              "CastFp8: the counts sink must be two contiguous int64 values on ", x.device());
  kernels::CastArgs a;
  a.x = x.data_ptr();
  a.source = x.scalar_type() == at::kBFloat16 ? kernels::SourceKind::kBFloat16
                                              : kernels::SourceKind::kFloat32;
  a.rows = M;
  a.cols = K;
  a.scale = rows || transposed ? scale.data_ptr<float>() : nullptr;
  a.format = format == Fp8Format::kE4M3 ? kernels::Fp8Kind::kE4M3 : kernels::Fp8Kind::kE5M2;
  a.out = PointerOr<uint8_t>(out.data);
  a.out_t = PointerOr<uint8_t>(out.data_t);
  a.amax = PointerOr<float>(sinks.amax);
  a.amax_finite = PointerOr<float>(sinks.amax_finite);
  a.counts = PointerOr<uint64_t>(sinks.counts);
  if (x.is_cuda()) {
#if defined(TALLY_WITH_CUDA)
    const std::string err = kernels::CastCuda(a, c10::cuda::getCurrentCUDAStream().stream());
    TORCH_CHECK(err.empty(), "fused FP8 cast: ", err);
#else
    TORCH_CHECK(false, "fused FP8 cast: this build has no CUDA");
#endif
  } else {
    TORCH_CHECK(x.is_cpu(), "CastFp8: ", x.device(), " tensors are not supported");
    kernels::CastReference(a);
  }
  const at::ScalarType dtype = Fp8Dtype(format);
  if (out.data.defined()) out.data = out.data.view(dtype);
  if (out.data_t.defined()) out.data_t = out.data_t.view(dtype);
  return out;
}

}  // namespace tally::precision
