#include <cuda_runtime.h>

#include "kernels/moe_permute.h"

namespace tally::kernels {
namespace {

// One thread per expert: count, then (after a scan by thread 0) place in
// order. E is small (experts per layer), so one block holds them all.
__global__ void PermuteKernel(const int32_t* expert, int32_t A, int32_t E, int32_t align,
                              int32_t* dest_row, int32_t* group_end) {
  extern __shared__ int32_t start[];  // E
  const int32_t e = threadIdx.x;
  int32_t count = 0;
  if (e < E) {
    for (int32_t a = 0; a < A; ++a) count += expert[a] == e;
    start[e] = align > 1 ? (count + align - 1) / align * align : count;
  }
  __syncthreads();
  if (e == 0) {
    int32_t rows = 0;
    for (int32_t i = 0; i < E; ++i) {
      const int32_t padded = start[i];
      start[i] = rows;
      rows += padded;
      group_end[i] = rows;
    }
  }
  __syncthreads();
  if (e < E) {
    int32_t next = start[e];
    for (int32_t a = 0; a < A; ++a) {
      if (expert[a] == e) dest_row[a] = next++;
      else if (e == 0 && expert[a] < 0) dest_row[a] = -1;
    }
  }
}

__global__ void UnpermuteKernel(const float* rows, const float* gate, const int32_t* dest_row,
                                int32_t N, int32_t K, int32_t D, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(N) * D) return;
  const int32_t n = static_cast<int32_t>(i / D), d = static_cast<int32_t>(i % D);
  float acc = 0;
  for (int32_t k = 0; k < K; ++k) {
    const int32_t r = dest_row[n * K + k];
    // Explicit rounding, no fused multiply-add: the CPU reference's result.
    if (r >= 0) acc = __fadd_rn(acc, __fmul_rn(gate[n * K + k], rows[static_cast<int64_t>(r) * D + d]));
  }
  out[i] = acc;
}

std::string Check(cudaError_t e) { return e == cudaSuccess ? "" : cudaGetErrorString(e); }

}  // namespace

std::string PermuteCuda(const int32_t* expert, int32_t A, int32_t E, int32_t align,
                        int32_t* dest_row, int32_t* group_end, void* stream) {
  if (E < 1 || E > 1024) return "experts: must be between 1 and 1024";
  PermuteKernel<<<1, E, E * sizeof(int32_t), static_cast<cudaStream_t>(stream)>>>(
      expert, A, E, align, dest_row, group_end);
  return Check(cudaGetLastError());
}

std::string UnpermuteCuda(const float* rows, const float* gate, const int32_t* dest_row,
                          int32_t N, int32_t K, int32_t D, float* out, void* stream) {
  const int64_t n = static_cast<int64_t>(N) * D;
  if (n == 0) return "";
  const int threads = 256;
  UnpermuteKernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0,
                    static_cast<cudaStream_t>(stream)>>>(rows, gate, dest_row, N, K, D, out);
  return Check(cudaGetLastError());
}

}  // namespace tally::kernels
