// The FP8 linear: y = x w^T as a LibTorch autograd function whose three
// products (output, input gradient, weight gradient) take FP8 operands and
// accumulate in FP32. Forward: input and weight are scaled (scaling.h),
// clamped and cast to E4M3; backward: the output gradient is cast to E5M2.
// Master weights and optimizer state stay FP32. Also the statistics every
// FP8 product adds to (Fp8Stats) and one layer's scaling state (Fp8Layer).
//
// CPU: the same quantize/dequantize numerics, with FP32 matrix products, so
// CPU tests check what the GPU computes up to accumulation order. CUDA:
// at::_scaled_mm on the FP8 operands (the second column-major, dimensions
// multiples of 16); a shape it cannot take runs in BF16 and is counted. The
// weight's cast, amax and counts come from one fused pass (quantize.h) when
// its scale is known ahead.
//
// Not thread-safe: one trainer owns it.
#ifndef TALLY_WORKER_PRECISION_LINEAR_H_
#define TALLY_WORKER_PRECISION_LINEAR_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>

#include "worker/precision/quantize.h"
#include "worker/precision/scaling.h"

namespace tally::precision {

struct Fp8Stats {
  int64_t overflows = 0;
  int64_t underflows = 0;
  int64_t elements = 0;
  int64_t fp8_products = 0;    // matrix products computed in FP8
  int64_t total_products = 0;  // all products of the converted layers
  int64_t grouped_products = 0;  // expert products run inside grouped ones
  // Latest amax per tensor group: "attention.input", "ffn.grad", ...
  std::map<std::string, double> amax;
  // Still on the device while a step runs (TakeStats reads them, in one
  // go, into the fields above): [overflows, underflows], and amax by group.
  at::Tensor pending_counts;
  std::map<std::string, at::Tensor> pending_amax;
};

// One converted linear's scaling state: its input (x), weight (w) and
// output gradient (g). `group` is "ffn" for feed-forward sites (.w1, .w2,
// .w3), else "attention": the statistics' amax groups.
struct Fp8Layer {
  Fp8Layer(const std::string& site, const RecipeConfig& c);
  std::string group;
  TensorScaling x, w, g;
};

// What one call of the FP8 linear works with. It must outlive the autograd
// graph that call builds (the backward pass reads it): the converter keeps
// one per site. Products in training passes (*training) record amax and
// statistics; evaluation passes record nothing.
struct Fp8Context {
  Fp8Layer* layer;
  Fp8Stats* stats;
  const bool* training;
  const RecipeConfig* config;
};

// x [..., K] times w [N, K]^T in FP8 (per the context's recipe), [..., N],
// differentiable in x and w.
at::Tensor Fp8Linear(const at::Tensor& x, const at::Tensor& w, Fp8Context* context);

// Shared by the files of worker/precision only; not for callers.
namespace internal {

// Adds one cast's counts (read or still on the device) to the statistics.
void Account(Fp8Stats* s, const QuantStats& q);
// The latest amax of a tensor group for the statistics: read already, or
// still on the device.
void ReportAmax(Fp8Stats* s, const std::string& group, const TensorScaling& t);
void ReportAmax(Fp8Stats* s, const std::string& group, const at::Tensor& amax);

// Tests only (RecipeConfig::test_overflow_fraction): a copy of x2 with every
// round(1/fraction)-th value set to 16 times the E4M3 range under `scale`,
// its sign kept, so each of them overflows and is clamped.
at::Tensor ForceOverflows(const at::Tensor& x2, double scale, double fraction);

// Whether at::_scaled_mm takes an [m, k] x [k, n] product.
bool ScaledMmShapeOk(int64_t m, int64_t k, int64_t n);

// An E4M3 weight (FP32 master) for a CUDA product: fused when the scale is
// known ahead, else the plain cast after ScaleFor. Sets *scale.
at::Tensor WeightE4M3(const at::Tensor& w, TensorScaling* s, bool record, double* scale,
                      QuantStats* q);

// Per-tensor recipes' backward of y = x w^T (x2 [M, K] scaled by sx, w
// [N, K] by sw in the forward): dX and dW from the output gradient g2
// [M, N] in E5M2, both in FP8 where the shapes allow.
std::pair<at::Tensor, at::Tensor> TensorwiseBackward(Fp8Context* c, const at::Tensor& g2,
                                                     const at::Tensor& x2, const at::Tensor& w,
                                                     double sx, double sw);

}  // namespace internal
}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_LINEAR_H_
