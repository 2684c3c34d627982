// Micro-batches and the data cursor (no LibTorch: plain vectors the trainer
// wraps as tensors).
//
// A micro-batch is B rows of width T (seq_len, or the longest row for
// kPadToLongest). Each row's segments are laid left to right; the rest of the
// row is padding, treated as one more segment that no loss is taken on.
// Within a segment, positions restart at 0 and the target of token i is token
// i + 1 of the same segment; the last token of a segment has no target, so
// nothing is learned across a document boundary.
#ifndef TALLY_WORKER_DATA_BATCH_H_
#define TALLY_WORKER_DATA_BATCH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/types/span.h"
#include "worker/data/dataset.h"
#include "worker/data/packer.h"

namespace tally::data {

inline constexpr int64_t kIgnoreTarget = -100;

struct MicroBatch {
  int32_t rows = 0;                 // B
  int32_t width = 0;                // T
  std::vector<int64_t> tokens;      // [B*T]; padding is token 0
  std::vector<int64_t> targets;     // [B*T]; kIgnoreTarget where no loss
  std::vector<int64_t> positions;   // [B*T]; restart at 0 in each segment
  std::vector<int64_t> segment_ids; // [B*T]; distinct per segment in the batch
  std::vector<uint8_t> real;        // [B*T]; 1 for document tokens, 0 for padding
  std::vector<int32_t> cu_seqlens;  // segment starts over the flat B*T, + end
  std::vector<int64_t> segment_docs; // per segment id: its document, -1 for padding
  int32_t max_seqlen = 0;           // longest segment
  int64_t real_tokens = 0;          // document tokens
  int64_t padding_tokens = 0;       // B*T - real_tokens
  int64_t num_targets = 0;          // positions with a target
  int64_t text_targets = 0;         // targets that are text (not BOS/EOS)
};

MicroBatch BuildMicroBatch(const Dataset& dataset, absl::Span<const Row> rows,
                           int32_t seq_len, PackingMode mode);

// Where the trainer is in its data: the epoch and the next row of its plan.
struct DataCursor {
  int64_t epoch = 0;
  int64_t row = 0;
};

// Hands out rows epoch after epoch from PlanEpoch. Not thread-safe.
class RowStream {
 public:
  RowStream(const Dataset* dataset, PackOptions options);
  // The next `n` rows, crossing into the next epoch when one runs out.
  std::vector<Row> Next(int n);
  DataCursor cursor() const { return cursor_; }
  void Seek(DataCursor cursor);
  // Packing statistics of the current epoch's plan.
  PackStats epoch_stats() const { return Summarize(plan_, options_.seq_len); }

 private:
  void Plan();
  const Dataset* dataset_;
  const PackOptions options_;
  std::vector<int64_t> lengths_;
  std::vector<Row> plan_;
  int64_t planned_epoch_ = -1;
  DataCursor cursor_;
};

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_BATCH_H_
