#include "worker/data/batch.h"

#include <algorithm>

#include "worker/data/tokenizer.h"

namespace tally::data {

MicroBatch BuildMicroBatch(const Dataset& dataset, absl::Span<const Row> rows,
                           int32_t seq_len, PackingMode mode) {
  MicroBatch b;
  b.rows = static_cast<int32_t>(rows.size());
  b.width = seq_len;
  if (mode == PackingMode::kPadToLongest) {
    b.width = 1;
    for (const Row& r : rows) b.width = std::max(b.width, r.num_tokens);
  }
  const size_t n = static_cast<size_t>(b.rows) * b.width;
  b.tokens.assign(n, 0);
  b.targets.assign(n, kIgnoreTarget);
  b.positions.assign(n, 0);
  b.segment_ids.assign(n, 0);
  b.real.assign(n, 0);
  b.cu_seqlens.push_back(0);
  int64_t segment_id = 0;
  auto add_segment = [&](size_t start, int32_t length, int64_t doc) {
    for (int32_t i = 0; i < length; ++i) {
      b.positions[start + i] = i;
      b.segment_ids[start + i] = segment_id;
    }
    ++segment_id;
    b.segment_docs.push_back(doc);
    b.cu_seqlens.push_back(static_cast<int32_t>(start + length));
    b.max_seqlen = std::max(b.max_seqlen, length);
  };
  for (int32_t r = 0; r < b.rows; ++r) {
    size_t at = static_cast<size_t>(r) * b.width;
    const size_t row_end = at + b.width;
    for (const Segment& s : rows[r].segments) {
      for (int32_t i = 0; i < s.length; ++i) {
        b.tokens[at + i] = dataset.token(s.doc, s.begin + i);
        if (i + 1 < s.length) {
          const uint32_t next = dataset.token(s.doc, s.begin + i + 1);
          b.targets[at + i] = next;
          ++b.num_targets;
          if (!dataset.IsSpecial(next)) ++b.text_targets;
        }
      }
      add_segment(at, s.length, s.doc);
      std::fill(b.real.begin() + at, b.real.begin() + at + s.length, 1);
      at += s.length;
      b.real_tokens += s.length;
    }
    if (at < row_end) add_segment(at, static_cast<int32_t>(row_end - at), -1);
  }
  b.padding_tokens = static_cast<int64_t>(n) - b.real_tokens;
  return b;
}

RowStream::RowStream(const Dataset* dataset, PackOptions options)
    : dataset_(dataset), options_(options), lengths_(dataset->DocLengths()) {
  Plan();
}

void RowStream::Plan() {
  if (planned_epoch_ == cursor_.epoch) return;
  plan_ = PlanEpoch(lengths_, options_, cursor_.epoch);
  planned_epoch_ = cursor_.epoch;
}

void RowStream::Seek(DataCursor cursor) {
  cursor_ = cursor;
  Plan();
}

std::vector<Row> RowStream::Next(int n) {
  std::vector<Row> out;
  out.reserve(n);
  Plan();
  while (static_cast<int>(out.size()) < n) {
    if (cursor_.row >= static_cast<int64_t>(plan_.size())) {
      ++cursor_.epoch;
      cursor_.row = 0;
      Plan();
      continue;
    }
    out.push_back(plan_[cursor_.row++]);
  }
  return out;
}

}  // namespace tally::data
