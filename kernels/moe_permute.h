// MoE token permutation (CUDA, with CPU references). No LibTorch.
//
// Permute: token-expert assignments (token-major: assignment a = n·K + k is
// token n's k-th choice) are laid out expert by expert, in assignment order
// within an expert (stable), each expert's group padded with empty rows to a
// multiple of `align` (grouped matrix products want aligned groups; 1: no
// padding). Dropped assignments (expert -1) get row -1.
//
// Unpermute: out[n] = sum over k of gate[n·K + k] · rows[dest[n·K + k]], the
// k summed in order, so the result does not depend on thread timing.
#ifndef TALLY_KERNELS_MOE_PERMUTE_H_
#define TALLY_KERNELS_MOE_PERMUTE_H_

#include <cstdint>
#include <string>

namespace tally::kernels {

// expert[A] in [0, E) or -1; fills dest_row[A] and group_end[E] (cumulative,
// padded row count after each expert: the offsets a grouped product takes).
// Returns the total number of rows.
int32_t PermuteReference(const int32_t* expert, int32_t A, int32_t E, int32_t align,
                         int32_t* dest_row, int32_t* group_end);

// rows[R, D] (permuted expert outputs), gate[N·K], dest_row[N·K] -> out[N, D].
void UnpermuteReference(const float* rows, const float* gate, const int32_t* dest_row,
                        int32_t N, int32_t K, int32_t D, float* out);

// The same on the GPU (device pointers; `stream` is a cudaStream_t). Permute
// runs one thread per expert, each scanning the assignments in order (stable
// without sorting; E threads x A reads). Returns "" or the CUDA error.
std::string PermuteCuda(const int32_t* expert, int32_t A, int32_t E, int32_t align,
                        int32_t* dest_row, int32_t* group_end, void* stream);
std::string UnpermuteCuda(const float* rows, const float* gate, const int32_t* dest_row,
                          int32_t N, int32_t K, int32_t D, float* out, void* stream);

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_MOE_PERMUTE_H_
