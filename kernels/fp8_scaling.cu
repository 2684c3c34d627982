// Design note. Delayed scaling's bookkeeping is a few dozen FLOPs per
// tensor, but a 1B-parameter model has hundreds of FP8 tensors: updated one
// by one from the host (read the amax, push it, compute the scale, upload
// it) that was two host synchronisations per tensor per step. Here every
// tensor's state lives in device arrays (kernels/fp8_scaling.h) and one
// launch updates them all, a thread per tensor; the arithmetic is the CPU
// reference's (FP64 for the scale, rounded to FP32), so the two agree bit
// for bit.
#include <cfloat>

#include <cuda_runtime.h>

#include "kernels/fp8_scaling.h"

namespace tally::kernels {
namespace {

constexpr int kThreads = 128;

__device__ float DeviceScaleForAmax(float amax, uint8_t format, int margin, float previous) {
  if (!(amax > 0) || !isfinite(amax)) return previous;
  const double max = format == static_cast<uint8_t>(Fp8Kind::kE4M3) ? 448.0 : 57344.0;
  const double s = max / static_cast<double>(amax) / ldexp(1.0, margin);
  if (!(s >= FLT_MIN && s <= FLT_MAX)) return previous;
  return static_cast<float>(s);
}

__device__ float Inverse(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

__global__ void DelayedStepKernel(ScalingState s, int margin, bool history_max) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= s.tensors) return;
  const int H = s.history_len;
  float* h = s.history + t * H;
  const float seen = s.step_finite[t];
  s.step_amax[t] = 0;
  s.step_finite[t] = 0;
  int n = s.count[t];
  if (n == 0 && !(seen > 0)) return;
  if (n == H) {
    for (int i = 1; i < H; ++i) h[i - 1] = h[i];
    h[H - 1] = seen;
  } else {
    h[n++] = seen;
    s.count[t] = n;
  }
  float amax = h[n - 1];
  if (history_max) {
    for (int i = 0; i < n; ++i) amax = fmaxf(amax, h[i]);
  }
  s.scale[t] = DeviceScaleForAmax(amax, s.formats[t], margin, s.scale[t]);
  s.inv_scale[t] = Inverse(s.scale[t]);
}

__global__ void ScaleFromAmaxKernel(const float* amax, const uint8_t* formats, int64_t n,
                                    int margin, float* scale, float* inv_scale) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  scale[i] = DeviceScaleForAmax(amax[i], formats[i], margin, scale[i]);
  inv_scale[i] = Inverse(scale[i]);
}

int Blocks(int64_t n) { return static_cast<int>((n + kThreads - 1) / kThreads); }

}  // namespace

std::string DelayedScalingStepCuda(const ScalingState& s, const ScalingRecipe& r, void* stream) {
  if (s.tensors <= 0) return "";
  DelayedStepKernel<<<Blocks(s.tensors), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      s, r.margin, r.history_max);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

std::string ScaleFromAmaxCuda(const float* amax, const uint8_t* formats, int64_t n, int margin,
                              float* scale, float* inv_scale, void* stream) {
  if (n <= 0) return "";
  ScaleFromAmaxKernel<<<Blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      amax, formats, n, margin, scale, inv_scale);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? "" : cudaGetErrorString(err);
}

}  // namespace tally::kernels
