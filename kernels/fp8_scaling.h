// FP8 scaling state on the device (CUDA, with CPU references): the scales
// the casts of kernels/fp8_cast.h read, and their update once per optimizer
// step. Nothing here is read by the host while a step runs.
//
// A run's per-tensor scaling state is a handful of arrays over its T
// tensors (every FP8 layer's input, weight and gradient):
//   history     [T, H] FP32  amax history, oldest first; the first count[t]
//                            entries of row t are valid
//   count       [T]    int32
//   scale       [T]    FP32  what the casts multiply by
//   inv_scale   [T]    FP32  1 / scale, what the FP8 products dequantize by
//   step_amax   [T]    FP32  max |x| of this step's casts (raw: NaN wins)
//   step_finite [T]    FP32  max finite |x| of this step's casts
//   formats     [T]    uint8 Fp8Kind of each tensor
// A scale is max / (amax x 2^margin) (Transformer Engine's delayed scaling),
// computed in FP64 and rounded to FP32; an amax that is zero, not finite, or
// gives a scale FP32 cannot hold leaves the previous scale.
#ifndef TALLY_KERNELS_FP8_SCALING_H_
#define TALLY_KERNELS_FP8_SCALING_H_

#include <cstdint>
#include <string>

#include "kernels/fp8_cast.h"

namespace tally::kernels {

// max / (amax x 2^margin) as FP32, or `previous` (see above).
float ScaleForAmax(float amax, Fp8Kind kind, int margin, float previous);

struct ScalingState {
  int64_t tensors = 0;
  int history_len = 0;
  float* history = nullptr;
  int32_t* count = nullptr;
  float* scale = nullptr;
  float* inv_scale = nullptr;
  float* step_amax = nullptr;
  float* step_finite = nullptr;
  const uint8_t* formats = nullptr;
};

struct ScalingRecipe {
  int margin = 0;
  bool history_max = true;  // false: the most recent amax
};

// Once per optimizer step, for every tensor t: a tensor that has seen no
// nonzero finite value yet (count 0 and step_finite 0) is left alone;
// otherwise step_finite[t] joins its history (the oldest entry leaves a
// full one) and the scale becomes ScaleForAmax of the history's maximum (or
// its newest entry). Both step amaxes are zeroed for the next step.
void DelayedScalingStepReference(const ScalingState& s, const ScalingRecipe& r);
std::string DelayedScalingStepCuda(const ScalingState& s, const ScalingRecipe& r, void* stream);

// Scales from amaxes just taken (current scaling, and a delayed tensor's
// first step): scale[i] = ScaleForAmax(amax[i], formats[i], margin,
// scale[i]) and inv_scale[i] = 1 / scale[i], for n entries.
void ScaleFromAmaxReference(const float* amax, const uint8_t* formats, int64_t n, int margin,
                            float* scale, float* inv_scale);
std::string ScaleFromAmaxCuda(const float* amax, const uint8_t* formats, int64_t n, int margin,
                              float* scale, float* inv_scale, void* stream);

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_FP8_SCALING_H_
