// Sampling documents stratified by length (pure), for the evaluation sample
// (eval_sample.h) and tally-prep's --val_tokens holdout (holdout.h).
#ifndef TALLY_WORKER_DATA_STRATIFIED_H_
#define TALLY_WORKER_DATA_STRATIFIED_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tally::data {

// Systematic sampling over `docs` (indices into doc_lengths) sorted by
// length: the documents in a seeded order, stably sorted by length (ties
// stay in the seeded order), then one every 1/fraction from a seeded
// offset, so every stretch of lengths gives `fraction` of its documents.
// Never empty while `docs` is not: a fraction too small for the walk to
// take any takes one, at a seeded place, with two tokens or more (a target)
// where one has. fraction >= 1 takes every document. Returns the chosen
// documents, ascending.
std::vector<int64_t> SampleByLength(absl::Span<const int64_t> doc_lengths,
                                    std::vector<int64_t> docs, double fraction, uint64_t seed);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_STRATIFIED_H_
