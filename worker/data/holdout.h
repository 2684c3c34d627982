// Choosing and judging the validation split (pure: values in, decision out).
//
// A validation loss is token-weighted: a split whose tokens sit in a few long
// documents measures mostly whether the model saw text like those few, and
// the seed then moves a run's loss by more than the recipe does.
// LargestDocumentShare says how concentrated a split is; StratifiedHoldout
// holds out about `val_tokens` tokens with documents spread across lengths.
#ifndef TALLY_WORKER_DATA_HOLDOUT_H_
#define TALLY_WORKER_DATA_HOLDOUT_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tally::data {

// Above this share of a split's tokens in one document, tally-prep warns.
inline constexpr double kConcentratedShare = 0.10;

// The largest document's share of all the tokens (0 for an empty split).
double LargestDocumentShare(absl::Span<const int64_t> doc_lengths);

struct Holdout {
  std::vector<bool> held_out;  // per document, in corpus order
  int64_t num_docs = 0;        // held out
  int64_t num_tokens = 0;
  // Documents longer than val_tokens * kConcentratedShare: kept for
  // training, so that none holds more than that share of the split.
  int64_t num_too_long = 0;
};

// SampleByLength (stratified.h) over the eligible documents: every stretch
// of lengths gives the same fraction of its documents, val_tokens / (the
// eligible tokens), so the split has short, middling and long documents in
// the corpus's proportions and about val_tokens tokens (at least one
// document). Documents longer than val_tokens * kConcentratedShare are
// never held out. val_tokens >= the eligible tokens holds out every
// eligible document.
Holdout StratifiedHoldout(absl::Span<const int64_t> doc_lengths, int64_t val_tokens,
                          uint64_t seed);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_HOLDOUT_H_
