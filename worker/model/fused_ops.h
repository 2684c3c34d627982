// The transformer block's fused element-wise operations, as differentiable
// ATen functions over the kernels of kernels/elementwise.h: the CUDA kernel
// on a GPU, its CPU reference elsewhere (so CPU tests run the same
// arithmetic). The model uses them in its fused mode (Transformer::
// SetFusedOps: BF16 runs); FP32 runs keep the composite ATen ops.
#ifndef TALLY_WORKER_MODEL_FUSED_OPS_H_
#define TALLY_WORKER_MODEL_FUSED_OPS_H_

#include <ATen/ATen.h>

#include <array>

namespace tally::model {

// silu(a) * b for the joint gate/up product y13 [..., 2F] (a its first F
// columns, b the rest): [..., F] in y13's dtype (FP32 or BF16; others are
// computed in FP32). One pass each way.
at::Tensor FusedSwiGlu(const at::Tensor& y13);

// RoPE on the joint QKV product qkv [B, T, 3, H, K] with each token's
// angles (cos, sin: FP32 [B, T, K/2]): q and k rotated, v passed through,
// each [B, T, H, K] contiguous in `dtype` (BF16 for flash attention). One
// pass each way, differentiable in qkv.
std::array<at::Tensor, 3> FusedRopeQkv(const at::Tensor& qkv, const at::Tensor& cos,
                                       const at::Tensor& sin, at::ScalarType dtype);

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_FUSED_OPS_H_
