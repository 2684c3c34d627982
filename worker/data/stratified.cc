#include "worker/data/stratified.h"

#include <algorithm>

#include "worker/data/packer.h"

namespace tally::data {
namespace {

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::vector<int64_t> SampleByLength(absl::Span<const int64_t> doc_lengths,
                                    std::vector<int64_t> docs, double fraction, uint64_t seed) {
  if (fraction >= 1.0) {
    std::sort(docs.begin(), docs.end());
    return docs;
  }
  SeededShuffle(seed, &docs);
  std::stable_sort(docs.begin(), docs.end(),
                   [&](int64_t a, int64_t b) { return doc_lengths[a] < doc_lengths[b]; });
  double acc = static_cast<double>(Mix64(seed) >> 11) * 0x1.0p-53;
  std::vector<int64_t> taken;
  for (int64_t d : docs) {
    acc += fraction;
    if (acc < 1.0) continue;
    acc -= 1.0;
    taken.push_back(d);
  }
  if (taken.empty() && !docs.empty()) {
    size_t at = static_cast<size_t>(Mix64(seed ^ 0x5A17ULL) % docs.size());
    for (size_t tried = 0; tried < docs.size() && doc_lengths[docs[at]] < 2; ++tried) {
      at = (at + 1) % docs.size();
    }
    taken.push_back(docs[at]);
  }
  std::sort(taken.begin(), taken.end());
  return taken;
}

}  // namespace tally::data
