#include "worker/data/packer.h"

#include <algorithm>
#include <map>
#include <random>

namespace tally::data {

const char* PackingModeName(PackingMode mode) {
  switch (mode) {
    case PackingMode::kPacked:
      return "packed";
    case PackingMode::kPadToSeqLen:
      return "pad_to_seq_len";
    case PackingMode::kPadToLongest:
      return "pad_to_longest";
  }
  return "?";
}

void SeededShuffle(uint64_t seed, std::vector<int64_t>* v) {
  std::mt19937_64 rng(seed);
  for (size_t i = v->size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(rng() % i);
    std::swap((*v)[i - 1], (*v)[j]);
  }
}

namespace {

uint64_t Mix(uint64_t seed, int64_t epoch, uint64_t salt) {
  uint64_t x = seed ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1)) ^
               (salt * 0xBF58476D1CE4E5B9ULL);
  x ^= x >> 31;
  x *= 0x94D049BB133111EBULL;
  return x ^ (x >> 29);
}

void AppendChunks(int64_t doc, int64_t length, int32_t seq_len,
                  std::vector<Segment>* out) {
  for (int64_t begin = 0; begin < length; begin += seq_len) {
    out->push_back({doc, begin, static_cast<int32_t>(std::min<int64_t>(
                                    seq_len, length - begin))});
  }
}

}  // namespace

std::vector<Row> PlanEpoch(absl::Span<const int64_t> doc_lengths,
                           const PackOptions& o, int64_t epoch) {
  std::vector<int64_t> order(doc_lengths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (o.shuffle) SeededShuffle(Mix(o.seed, epoch, 1), &order);

  std::vector<Row> rows;
  const size_t window = static_cast<size_t>(std::max(1, o.shuffle_window));
  // The window's rows in a seeded order: a long document's chunks do not
  // take consecutive rows (and so whole steps) in any mode.
  auto shuffle_rows = [&](size_t first_row, size_t start) {
    if (!o.shuffle) return;
    std::vector<int64_t> perm(rows.size() - first_row);
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
    SeededShuffle(Mix(o.seed, epoch, 2 + start), &perm);
    std::vector<Row> shuffled;
    shuffled.reserve(perm.size());
    for (int64_t p : perm) shuffled.push_back(std::move(rows[first_row + p]));
    std::move(shuffled.begin(), shuffled.end(), rows.begin() + first_row);
  };
  if (o.mode != PackingMode::kPacked) {
    std::vector<Segment> chunks;
    for (size_t start = 0; start < order.size(); start += window) {
      chunks.clear();
      const size_t end = std::min(order.size(), start + window);
      for (size_t i = start; i < end; ++i) {
        AppendChunks(order[i], doc_lengths[order[i]], o.seq_len, &chunks);
      }
      const size_t first_row = rows.size();
      for (const Segment& c : chunks) rows.push_back(Row{{c}, c.length});
      shuffle_rows(first_row, start);
    }
    return rows;
  }

  std::vector<Segment> chunks;
  for (size_t start = 0; start < order.size(); start += window) {
    chunks.clear();
    const size_t end = std::min(order.size(), start + window);
    for (size_t i = start; i < end; ++i) {
      AppendChunks(order[i], doc_lengths[order[i]], o.seq_len, &chunks);
    }
    // Longest first; ties in window order, so the plan is fully determined.
    std::stable_sort(chunks.begin(), chunks.end(),
                     [](const Segment& a, const Segment& b) { return a.length > b.length; });
    const size_t first_row = rows.size();
    std::multimap<int32_t, size_t> open;  // room left -> row index
    for (const Segment& c : chunks) {
      auto it = open.lower_bound(c.length);
      size_t r;
      if (it == open.end()) {
        r = rows.size();
        rows.emplace_back();
      } else {
        r = it->second;
        open.erase(it);
      }
      rows[r].segments.push_back(c);
      rows[r].num_tokens += c.length;
      const int32_t room = o.seq_len - rows[r].num_tokens;
      if (room > 0) open.emplace(room, r);
    }
    shuffle_rows(first_row, start);
  }
  return rows;
}

PackStats Summarize(absl::Span<const Row> rows, int32_t seq_len) {
  PackStats s;
  s.rows = static_cast<int64_t>(rows.size());
  s.slot_tokens = s.rows * seq_len;
  for (const Row& r : rows) s.real_tokens += r.num_tokens;
  return s;
}

}  // namespace tally::data
