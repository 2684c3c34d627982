// Sequence packing (pure: values in, plan out, no I/O).
//
// PlanEpoch turns document lengths into rows of at most seq_len tokens. In
// packed mode, documents are taken in a seeded shuffled order, a window of
// `shuffle_window` documents at a time; inside a window, chunks are placed
// best-fit-decreasing (longest first, each into the open row with the least
// room that still fits it, else a new row), and the window's rows are then
// shuffled. A document longer than seq_len is cut into seq_len-token chunks
// (the last one shorter). Every token of every document appears exactly once
// per epoch. The padded modes put one chunk per row: they exist only as the
// baselines packing is measured against, so they take documents in the same
// windows and shuffle each window's rows the same way (a long document's
// chunks are spread over the window, not trained on in consecutive steps,
// which would make the baseline worse for a reason other than padding).
//
// The plan is a pure function of (lengths, options, epoch), so a data cursor
// (epoch, row) is enough to resume exactly.
#ifndef TALLY_WORKER_DATA_PACKER_H_
#define TALLY_WORKER_DATA_PACKER_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace tally::data {

enum class PackingMode {
  kPacked,        // best-fit-decreasing, block-diagonal attention
  kPadToSeqLen,   // baseline: one document (chunk) per row, padded to seq_len
  kPadToLongest,  // baseline: one chunk per row, padded to the batch's longest
};

const char* PackingModeName(PackingMode mode);

// Tokens [begin, begin + length) of document `doc`.
struct Segment {
  int64_t doc;
  int64_t begin;
  int32_t length;
  bool operator==(const Segment& o) const {
    return doc == o.doc && begin == o.begin && length == o.length;
  }
};

struct Row {
  std::vector<Segment> segments;
  int32_t num_tokens = 0;  // sum of segment lengths, <= seq_len
};

struct PackOptions {
  int32_t seq_len = 512;
  int32_t shuffle_window = 1024;  // documents per best-fit window
  uint64_t seed = 0;
  PackingMode mode = PackingMode::kPacked;
  bool shuffle = true;  // false: corpus order (evaluation)
};

std::vector<Row> PlanEpoch(absl::Span<const int64_t> doc_lengths,
                           const PackOptions& options, int64_t epoch);

struct PackStats {
  int64_t rows = 0;
  int64_t real_tokens = 0;
  int64_t slot_tokens = 0;  // rows * seq_len
  double efficiency() const {
    return slot_tokens ? static_cast<double>(real_tokens) / slot_tokens : 0.0;
  }
};
PackStats Summarize(absl::Span<const Row> rows, int32_t seq_len);

// A portable seeded shuffle (std::shuffle's algorithm is left to the library,
// which would make golden files depend on the compiler).
void SeededShuffle(uint64_t seed, std::vector<int64_t>* v);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_PACKER_H_
