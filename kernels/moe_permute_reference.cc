#include <vector>

#include "kernels/moe_permute.h"

namespace tally::kernels {

int32_t PermuteReference(const int32_t* expert, int32_t A, int32_t E, int32_t align,
                         int32_t* dest_row, int32_t* group_end) {
  std::vector<int32_t> count(E, 0);
  for (int32_t a = 0; a < A; ++a) {
    if (expert[a] >= 0) ++count[expert[a]];
  }
  std::vector<int32_t> start(E, 0);
  int32_t rows = 0;
  for (int32_t e = 0; e < E; ++e) {
    start[e] = rows;
    const int32_t padded = align > 1 ? (count[e] + align - 1) / align * align : count[e];
    rows += padded;
    group_end[e] = rows;
  }
  for (int32_t a = 0; a < A; ++a) {
    dest_row[a] = expert[a] >= 0 ? start[expert[a]]++ : -1;
  }
  return rows;
}

void UnpermuteReference(const float* rows, const float* gate, const int32_t* dest_row,
                        int32_t N, int32_t K, int32_t D, float* out) {
  for (int32_t n = 0; n < N; ++n) {
    for (int32_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int32_t k = 0; k < K; ++k) {
        const int32_t r = dest_row[n * K + k];
        if (r >= 0) acc += gate[n * K + k] * rows[static_cast<int64_t>(r) * D + d];
      }
      out[static_cast<int64_t>(n) * D + d] = acc;
    }
  }
}

}  // namespace tally::kernels
