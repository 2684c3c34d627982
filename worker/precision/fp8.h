// FP8 training: linear layers that compute in FP8 with FP32 accumulation.
// This header gathers the pieces; each one documents itself:
// - quantize.h: the formats, casts and quantize-dequantize numerics, the
//   overflow/underflow counts, the fused CUDA cast;
// - scaling.h: every FP8 tensor's scale and amax history, on the device;
// - fp8_recipe.h: the recipes (delayed, current, row-wise) that choose the
//   scales, one file each;
// - linear.h: the FP8 linear's forward/backward autograd function and the
//   statistics of its products;
// - grouped.h: MoE expert products grouped into one FP8 product, and their
//   CPU emulation;
// - converter.h: Fp8Linears, which applies FP8 to a built model through its
//   LinearOverride and expert hooks.
//
// Design. Forward: input and weight are scaled, clamped to the format's
// finite range and cast to E4M3; backward: the output gradient is cast to
// E5M2. All three products (output, input gradient, weight gradient) take
// FP8 operands and accumulate in FP32; master weights and optimizer state
// stay FP32. Each tensor (input, weight, gradient) of each layer has its own
// scale, kept on the device with its amax history; every cast is one fused
// pass (both layouts, amax, counts) reading its scale from device memory, so
// nothing in forward or backward waits for the host. CPU runs the same casts
// (the kernels' references) with FP32 matrix products of the dequantized
// values, so CPU tests check what the GPU computes up to accumulation order;
// CUDA runs at::_scaled_mm on the FP8 bytes.
//
// Not thread-safe: one trainer owns it. Embeddings, norms, softmax and the
// output head never come here.
#ifndef TALLY_WORKER_PRECISION_FP8_H_
#define TALLY_WORKER_PRECISION_FP8_H_

#include "worker/precision/converter.h"
#include "worker/precision/fp8_recipe.h"
#include "worker/precision/grouped.h"
#include "worker/precision/linear.h"
#include "worker/precision/quantize.h"
#include "worker/precision/scaling.h"

#endif  // TALLY_WORKER_PRECISION_FP8_H_
