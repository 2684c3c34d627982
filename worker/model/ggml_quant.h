// llama.cpp's block formats Q8_0 and Q4_0, exactly as its reference
// quantizer (ggml-quants.c, quantize_row_q8_0_ref / quantize_row_q4_0_ref)
// writes them, in ATen, so that quantization-aware training (QAT) computes
// with the very weights a GGUF export holds, on any device.
//
// Blocks of 32 consecutive weights along a tensor's last (input) dimension,
// which is GGUF's ne0; each block one FP16 scale d:
//   Q8_0: d = max|w| / 127 (FP32), q = roundf(w * (1/d)) in -127..127,
//         stored {fp16 d, int8 q[32]} (34 bytes); w' = q * fp16(d).
//   Q4_0: m = the block's weight of largest magnitude (the first of equals),
//         d = m / -8, q = min(15, trunc(w * (1/d) + 8.5)) in 0..15, stored
//         {fp16 d, uint8 qs[16]} (18 bytes; weight j in the low nibble of
//         qs[j], weight j + 16 in the high one); w' = (q - 8) * fp16(d).
// A block of zeros has d = 0 and dequantizes to zeros. The arithmetic is FP32
// element by element (no fused multiply-add), as the reference's C is.
#ifndef TALLY_WORKER_MODEL_GGML_QUANT_H_
#define TALLY_WORKER_MODEL_GGML_QUANT_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "worker/model/config.h"

namespace tally::model {

inline constexpr int64_t kGgmlBlock = 32;

// Bytes of one block in the file: 34 and 18.
int64_t GgmlBlockBytes(GgmlQuant q);

// Whether a Tally parameter name ("layers.0.w1", "layers.1.experts.w2",
// "layers.0.wqkv", ...) is one `layers` quantizes.
bool QuantizesParameter(std::string_view name, QuantLayers layers);

struct GgmlBlocks {
  at::Tensor scale;  // kHalf [..., n / 32]: each block's d
  at::Tensor codes;  // kChar [..., n]: Q8_0's q, or Q4_0's q (0..15)
};

// `w` any floating dtype (computed in FP32), last dimension a multiple of 32
// (checked).
GgmlBlocks QuantizeBlocks(const at::Tensor& w, GgmlQuant q);
// FP32, w's shape.
at::Tensor DequantizeBlocks(const GgmlBlocks& blocks, GgmlQuant q);
// DequantizeBlocks(QuantizeBlocks(w)) without autograd history, in FP32.
at::Tensor QuantizeDequantize(const at::Tensor& w, GgmlQuant q);
// The same, differentiable with a straight-through estimator: the forward
// value is QuantizeDequantize(w) exactly, the gradient passes to w unchanged.
at::Tensor FakeQuantize(const at::Tensor& w, GgmlQuant q);
// The GGUF bytes of `w` (row-major; the blocks in order), from
// QuantizeBlocks.
std::string PackGgmlBlocks(const at::Tensor& w, GgmlQuant q);

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_GGML_QUANT_H_
