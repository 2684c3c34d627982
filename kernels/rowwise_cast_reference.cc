// The CPU definitions of kernels/rowwise_cast.h.
#include <algorithm>
#include <cmath>

#include "kernels/float_bits.h"
#include "kernels/fp8_scaling.h"
#include "kernels/rowwise_cast.h"

namespace tally::kernels {
namespace {

float Read(const void* x, SourceKind source, int64_t i) {
  if (source == SourceKind::kFloat32) return static_cast<const float*>(x)[i];
  return BitsFloat(static_cast<uint32_t>(static_cast<const uint16_t*>(x)[i]) << 16);
}

}  // namespace

float RowwiseScale(float amax, Fp8Kind kind, int margin) {
  return ScaleForAmax(amax, kind, margin, 1.0f);
}

void RowwiseCastReference(const RowwiseCastArgs& a) {
  if (a.rows <= 0 || a.cols <= 0) return;
  const bool by_row = a.axis == RowwiseAxis::kRows;
  // Operand row i of length k: x's row i, or x's column i.
  const int64_t n = by_row ? a.rows : a.cols, k = by_row ? a.cols : a.rows;
  auto at = [&](int64_t i, int64_t j) { return by_row ? i * a.cols + j : j * a.cols + i; };
  const float bound = OverflowBound(a.format);
  uint32_t max_bits = 0;
  uint64_t over = 0, under = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t row_bits = 0;
    for (int64_t j = 0; j < k; ++j) {
      row_bits = std::max(row_bits, FloatBits(Read(a.x, a.source, at(i, j))) & 0x7fffffffu);
    }
    max_bits = std::max(max_bits, row_bits);
    const float scale = RowwiseScale(BitsFloat(row_bits), a.format, a.margin);
    a.scale[i] = scale;
    a.inv_scale[i] = static_cast<float>(1.0 / static_cast<double>(scale));
    for (int64_t j = 0; j < k; ++j) {
      const float v = Read(a.x, a.source, at(i, j));
      const float s = v * scale;
      const uint8_t q = FloatToFp8(s, a.format);
      a.out[i * k + j] = q;
      over += std::fabs(s) > bound;  // NaN compares false, as in ATen
      under += v != 0.0f && (q & 0x7f) == 0;
    }
  }
  if (a.amax != nullptr) *a.amax = BitsFloat(std::max(FloatBits(*a.amax), max_bits));
  if (a.counts != nullptr) {
    a.counts[0] += over;
    a.counts[1] += under;
  }
}

}  // namespace tally::kernels
