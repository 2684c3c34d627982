// A float's bits and back (what C++20's std::bit_cast does), for the CPU
// references and their tests.
#ifndef TALLY_KERNELS_FLOAT_BITS_H_
#define TALLY_KERNELS_FLOAT_BITS_H_

#include <cstdint>
#include <cstring>

namespace tally::kernels {

inline uint32_t FloatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

inline float BitsFloat(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}

}  // namespace tally::kernels

#endif  // TALLY_KERNELS_FLOAT_BITS_H_
