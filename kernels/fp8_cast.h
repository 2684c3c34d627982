// Fused FP8 cast + amax (CUDA, with a CPU reference). No LibTorch: raw
// pointers and a stream, so the worker calls it through a thin wrapper and
// tests compare it with the reference directly.
#ifndef TALLY_KERNELS_FP8_CAST_H_
#define TALLY_KERNELS_FP8_CAST_H_

#include <cstdint>
#include <string>

namespace tally::kernels {

// E4M3 ("fn": no infinities, 0x7f/0xff are NaN, max 448) bit pattern of
// x * scale, saturated to +-448, rounded to nearest even. NaN stays NaN.
uint8_t FloatToE4M3(float x);
float E4M3ToFloat(uint8_t bits);

// The overflow bound: |x * scale| above it counts as clamped. It is the
// trainer's (worker/precision/quantize.cc compares the FP32 product with the
// double 448 x (1 + 1e-6), which ATen rounds to FP32 before comparing), so
// a value scaled exactly to the limit that lands an ulp or two past it is
// not an overflow. 448 + 15 x 2^-15 in FP32.
constexpr float kE4M3OverflowBound = static_cast<float>(448.0 * (1.0 + 1e-6));

// CPU reference: y[i] = FloatToE4M3(x[i] * scale) (the product in FP32);
// *amax = max |x[i]| of the input, before scaling, as ATen's max: a NaN
// anywhere makes it NaN, else an infinity makes it +Inf. With `counts`:
// counts[0] += the values with |x * scale| > kE4M3OverflowBound (clamped;
// infinities included, NaN not), counts[1] += the nonzero values, NaN
// excluded, that became zero.
void CastToE4M3Reference(const float* x, int64_t n, float scale, uint8_t* y, float* amax,
                         uint64_t* counts = nullptr);

// The same in one pass over x on the GPU, bit for bit (the amax's NaN too:
// both keep the largest bit pattern): every block converts its slice and
// reduces its amax, then one atomic per block folds it into *amax (which the
// caller zeroes). All pointers are device pointers; `stream` is a
// cudaStream_t. Returns "" or the CUDA error, never exits.
std::string CastToE4M3Cuda(const float* x, int64_t n, float scale, uint8_t* y, float* amax,
                           void* stream, uint64_t* counts = nullptr);

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_FP8_CAST_H_
