#include "worker/data/eval_sample.h"

#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "worker/data/stratified.h"

namespace tally::data {

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
    order = SampleByLength(doc_lengths, std::move(order),
                           static_cast<double>(eval_tokens) / static_cast<double>(s.split_tokens),
                           seed);
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
