// The evaluation sample (pure: values in, plan out, no I/O).
//
// Which validation tokens an evaluation scores decides every stop, target,
// forecast and verdict built on it, so the sample must stand for the whole
// split: PlanEvalSample takes whole documents in a seeded random order (a
// seed of its own, kEvalSampleSeed, never the training seed: every variant
// of an experiment and every attempt of a job is scored on the same tokens)
// until at least `eval_tokens` tokens are taken, then lays them into rows of
// at most seq_len tokens as training does (packed, a document longer than a
// row cut into seq_len-token chunks). A document's length never decides
// whether it is taken. `eval_tokens` <= 0 takes the whole split.
//
// The last document taken is taken whole, so the sample may exceed
// eval_tokens by up to one document; empty documents have no target and are
// left out.
#ifndef TALLY_WORKER_DATA_EVAL_SAMPLE_H_
#define TALLY_WORKER_DATA_EVAL_SAMPLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "worker/data/packer.h"

namespace tally::data {

inline constexpr uint64_t kEvalSampleSeed = 0x5EED0E7A1;

struct EvalSample {
  std::vector<Row> rows;      // segments name documents of the split
  std::vector<int64_t> docs;  // the sampled documents, ascending
  int64_t num_tokens = 0;     // the sample's tokens
  int64_t split_docs = 0;     // the whole split's documents and tokens
  int64_t split_tokens = 0;
  double token_fraction() const {
    return split_tokens > 0 ? static_cast<double>(num_tokens) / split_tokens : 0.0;
  }
  // "171 of 171 documents, 124678 of 124678 tokens (100.0% of the split)".
  std::string Coverage() const;
};

EvalSample PlanEvalSample(absl::Span<const int64_t> doc_lengths, int32_t seq_len,
                          int64_t eval_tokens, uint64_t seed = kEvalSampleSeed);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_EVAL_SAMPLE_H_
