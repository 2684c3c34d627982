// Grouped FP8 expert products: one MoE weight's product over all experts
// (x_RI [R, I] with expert e's tokens in rows [ends[e - 1], ends[e]), counts[e]
// of them real and the rest padding, times w_EOI [E, O, I]) with each
// expert's own per-tensor scales (its site's entries, linear.h).
//
// Each expert's input and weight are the converter's casts (the weight once
// per optimizer step, an input w1 and w3 share once). Forward on CUDA: one
// at::_scaled_grouped_mm (E4M3 operands, each expert's inverse scales
// spread over its rows and output channels on the device, fast
// accumulation as every forward product (linear.h), BF16 output). The
// first grouped product of a run is checked against the per-expert
// _scaled_mm products; a mismatch or a refusal turns
// grouping off for the run (Fp8Linears::TurnGroupedOff) and the experts run
// one by one. On CPU (tests, RecipeConfig::grouped_on_cpu) the grouped
// product is emulated in FP32 from the same FP8 operands and scales.
// Backward: each expert's two products as the FP8 linear's, expert by
// expert (on CUDA over its whole padded group: zero rows change no product
// and keep the row count a multiple of 16), sized by the counts the forward
// read (no read of its own). Not grouped: torch 2.11's
// at::_scaled_grouped_mm takes E4M3 operands only (its row-wise path checks
// that both are Float8_e4m3fn, and only BF16 out, scales FP32 [rows] per
// operand, offsets int32 on the device, the second operand column-major),
// and every backward product has the E5M2 gradient as an operand; grouping
// dX and dW would mean E4M3 gradients for the experts, a recipe change.
//
// Not thread-safe: one trainer owns it.
#ifndef TALLY_WORKER_PRECISION_GROUPED_H_
#define TALLY_WORKER_PRECISION_GROUPED_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "worker/precision/linear.h"

namespace tally::precision {

class Fp8Linears;

// [R, O], differentiable in x_RI and w_EOI; rows of idle experts and
// padding are zero. layers[e] is expert e's and, with `linears` (which owns
// them), must outlive the autograd graph.
at::Tensor Fp8GroupedLinear(const at::Tensor& x_RI, const at::Tensor& w_EOI, Fp8Linears* linears,
                            const std::vector<const Fp8Layer*>& layers,
                            const std::vector<int64_t>& counts, const std::vector<int64_t>& ends);

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_GROUPED_H_
