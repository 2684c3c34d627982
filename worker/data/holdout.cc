#include "worker/data/holdout.h"

#include <algorithm>
#include <utility>

#include "worker/data/stratified.h"

namespace tally::data {

double LargestDocumentShare(absl::Span<const int64_t> doc_lengths) {
  int64_t total = 0, largest = 0;
  for (int64_t l : doc_lengths) {
    total += l;
    largest = std::max(largest, l);
  }
  return total > 0 ? static_cast<double>(largest) / static_cast<double>(total) : 0.0;
}

Holdout StratifiedHoldout(absl::Span<const int64_t> doc_lengths, int64_t val_tokens,
                          uint64_t seed) {
  Holdout h;
  h.held_out.assign(doc_lengths.size(), false);
  if (val_tokens <= 0) return h;
  const double too_long = static_cast<double>(val_tokens) * kConcentratedShare;
  std::vector<int64_t> eligible;
  int64_t eligible_tokens = 0;
  for (size_t i = 0; i < doc_lengths.size(); ++i) {
    if (doc_lengths[i] <= 0) continue;
    if (static_cast<double>(doc_lengths[i]) > too_long) {
      ++h.num_too_long;
      continue;
    }
    eligible.push_back(static_cast<int64_t>(i));
    eligible_tokens += doc_lengths[i];
  }
  if (eligible_tokens == 0) return h;
  const double fraction = static_cast<double>(val_tokens) / static_cast<double>(eligible_tokens);
  for (int64_t d : SampleByLength(doc_lengths, std::move(eligible), fraction, seed)) {
    h.held_out[d] = true;
    ++h.num_docs;
    h.num_tokens += doc_lengths[d];
  }
  return h;
}

}  // namespace tally::data
