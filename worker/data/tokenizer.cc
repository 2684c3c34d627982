#include "worker/data/tokenizer.h"

namespace tally::data {

void ByteTokenizer::Encode(absl::string_view text, std::vector<uint16_t>* out) {
  out->reserve(out->size() + text.size() + 2);
  out->push_back(kBos);
  for (unsigned char c : text) out->push_back(c);
  out->push_back(kEos);
}

std::string ByteTokenizer::Decode(const uint16_t* tokens, size_t n) {
  std::string s;
  s.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    if (!IsSpecial(tokens[i])) s.push_back(static_cast<char>(tokens[i]));
  }
  return s;
}

}  // namespace tally::data
