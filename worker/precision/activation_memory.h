// What a training step holds on a GPU beyond the model state: the tensors
// the autograd graph keeps from a micro-batch's forward for its backward
// (at their peak, when the forward ends) and the step's weight casts, from
// the shapes alone. The arithmetic follows what the CUDA path saves (the
// model's fused mode, BF16 autocast or FP8, flash attention), tensor by
// tensor; the CPU's FP32 runs are not estimated.
//
// Per token and layer (d = d_model, f = d_ff; bytes):
//   BF16: 4d residual (the norm's FP32 input) + 2d BF16 h for wq|wk|wv +
//         6d q, k, v + 2d attention output, then 4d residual + 2d h for
//         w1|w3 + 4f the joint w1|w3 output (the fused SwiGLU's input) +
//         2f the SwiGLU output (w2's input)          = 20d + 6f
//   FP8:  as BF16, but each FP8 linear keeps only x's FP8 transpose:
//         4d + 1d + 6d + 2d (attention output, kept by attention) + 1d
//         (wo's FP8 copy) + 4d + 1d + 4f + 1f         = 19d + 5f
//   (FP8 before its linears kept only FP8 bytes: each kept its FP32 input
//   and both FP8 layouts, and w1 and w3 ran as two products with a
//   composite SwiGLU: 30d + 10f.)
// plus, once, the head: 4d (final norm input) + 2d (its BF16 input) + 6v
// (BF16 logits and the FP32 log-softmax the loss keeps). A MoE layer's
// experts count as top_k feed-forwards per token plus the rows gathered for
// them (6d each, FP32 and the product dtype) and the router (12 bytes per
// expert per token). Norm statistics, RoPE tables and attention's
// log-sum-exp are a few bytes per token and left out.
//
// Weight casts, per step: BF16 autocast keeps a BF16 copy of every linear's
// weight (2 bytes a parameter, the head included); FP8 keeps each block
// linear's weight as FP8 bytes in both layouts (2 bytes a parameter) and
// the head's BF16 copy.
#ifndef TALLY_WORKER_PRECISION_ACTIVATION_MEMORY_H_
#define TALLY_WORKER_PRECISION_ACTIVATION_MEMORY_H_

#include <cstdint>

#include "worker/model/config.h"

namespace tally::precision {

enum class StepPrecision { kFp32, kBf16, kFp8 };

struct StepMemory {
  int64_t activation_bytes = 0;   // one micro-batch's, at the end of its forward
  int64_t weight_cast_bytes = 0;  // the step's weight casts
};

// For a model of `config` (d_ff and vocab_size resolved; the caller's
// every_n_layers at least 1) training `tokens` tokens per micro-batch.
// kFp32: zeros (not estimated).
StepMemory EstimateStepMemory(const model::ModelConfig& config, int64_t tokens,
                              StepPrecision precision);

// The per-token, per-dense-layer activation bytes above (the 20d + 6f
// and 19d + 5f), for tests and the README's arithmetic.
int64_t DenseLayerBytesPerToken(int64_t d_model, int64_t d_ff, StepPrecision precision);

}  // namespace tally::precision

#endif  // TALLY_WORKER_PRECISION_ACTIVATION_MEMORY_H_
