#include "worker/data/eval_sample.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"

namespace tally::data {
namespace {

uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::string EvalSample::Coverage() const {
  return absl::StrFormat("%d of %d documents, %d of %d tokens (%.1f%% of the split)",
                         docs.size(), split_docs, num_tokens, split_tokens,
                         100 * token_fraction());
}

EvalSample PlanEvalSample(absl::Span<const int64_t> doc_lengths, int32_t seq_len,
                          int64_t eval_tokens, uint64_t seed) {
  EvalSample s;
  s.split_docs = static_cast<int64_t>(doc_lengths.size());
  std::vector<int64_t> order;
  order.reserve(doc_lengths.size());
  for (size_t i = 0; i < doc_lengths.size(); ++i) {
    s.split_tokens += doc_lengths[i];
    if (doc_lengths[i] > 0) order.push_back(static_cast<int64_t>(i));
  }
  if (eval_tokens > 0 && eval_tokens < s.split_tokens) {
    // Stratified by length: the documents in a seeded order, stably sorted
    // by length (ties stay in the seeded order), then one every 1/fraction
    // from a seeded offset: every stretch of lengths gives the same share of
    // its documents, so the sample has short, middling and long documents
    // in the split's proportions.
    SeededShuffle(seed, &order);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return doc_lengths[a] < doc_lengths[b]; });
    const double fraction = static_cast<double>(eval_tokens) / static_cast<double>(s.split_tokens);
    double acc = static_cast<double>(Mix64(seed) >> 11) * 0x1.0p-53;
    std::vector<int64_t> taken;
    for (int64_t d : order) {
      acc += fraction;
      if (acc < 1.0) continue;
      acc -= 1.0;
      taken.push_back(d);
    }
    // A sample smaller than one document's share of the split could take
    // none: it then takes one, at a seeded place in the length order, with
    // a target (two tokens or more) where the split has one.
    if (taken.empty() && !order.empty()) {
      size_t at = static_cast<size_t>(Mix64(seed ^ 0x5A17ULL) % order.size());
      for (size_t tried = 0; tried < order.size() && doc_lengths[order[at]] < 2; ++tried) {
        at = (at + 1) % order.size();
      }
      taken.push_back(order[at]);
    }
    order = std::move(taken);
    std::sort(order.begin(), order.end());
  }
  s.docs = order;
  // Packed like training, over the sample alone; where a chunk lands does
  // not change its loss (attention stays within a document).
  std::vector<int64_t> lengths;
  lengths.reserve(order.size());
  for (int64_t d : order) {
    lengths.push_back(doc_lengths[d]);
    s.num_tokens += doc_lengths[d];
  }
  PackOptions o;
  o.seq_len = seq_len;
  o.shuffle = false;
  o.shuffle_window = std::numeric_limits<int32_t>::max();
  s.rows = PlanEpoch(lengths, o, 0);
  for (Row& r : s.rows) {
    for (Segment& seg : r.segments) seg.doc = order[seg.doc];
  }
  return s;
}

}  // namespace tally::data
