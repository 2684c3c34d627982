// ByteTokenizer: the default tokenizer. Token ids 0..255 are the bytes of the
// UTF-8 text; 256 is BOS and 257 is EOS, so every document encodes as
// [BOS, bytes..., EOS] and decoding is exact. Stateless and thread-safe.
#ifndef TALLY_WORKER_DATA_TOKENIZER_H_
#define TALLY_WORKER_DATA_TOKENIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace tally::data {

class ByteTokenizer {
 public:
  static constexpr uint16_t kBos = 256;
  static constexpr uint16_t kEos = 257;
  static constexpr int kVocabSize = 258;
  static constexpr const char* kName = "byte";

  // Appends [BOS, bytes of text..., EOS] to `out`.
  static void Encode(absl::string_view text, std::vector<uint16_t>* out);
  // Bytes of the non-special tokens, in order.
  static std::string Decode(const uint16_t* tokens, size_t n);
  static bool IsSpecial(uint16_t token) { return token >= kBos; }
};

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_TOKENIZER_H_
