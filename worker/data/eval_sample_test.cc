#include "worker/data/eval_sample.h"

#include <algorithm>
#include <map>
#include <random>

#include "gtest/gtest.h"

namespace tally::data {
namespace {

// Tokens of each document the rows hold, by document.
std::map<int64_t, int64_t> TokensByDoc(const EvalSample& s) {
  std::map<int64_t, int64_t> by_doc;
  for (const Row& r : s.rows) {
    int32_t n = 0;
    for (const Segment& seg : r.segments) {
      by_doc[seg.doc] += seg.length;
      n += seg.length;
    }
    EXPECT_EQ(n, r.num_tokens);
  }
  return by_doc;
}

// A long-tailed split: mostly short documents, a few very long ones.
std::vector<int64_t> LongTail(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> len(5.5, 1.2);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = std::max<int64_t>(1, static_cast<int64_t>(len(rng)));
  v[n / 3] = 25000;
  v[n / 2] = 10000;
  return v;
}

TEST(EvalSampleTest, ZeroTakesTheWholeSplitInRowsOfAtMostSeqLen) {
  const std::vector<int64_t> lengths = {5, 0, 700, 64, 1, 300};
  const EvalSample s = PlanEvalSample(lengths, 256, 0);
  EXPECT_EQ(s.docs, (std::vector<int64_t>{0, 2, 3, 4, 5}));  // the empty one has no target
  EXPECT_EQ(s.num_tokens, 1070);
  EXPECT_EQ(s.split_tokens, 1070);
  EXPECT_EQ(s.split_docs, 6);
  EXPECT_DOUBLE_EQ(s.token_fraction(), 1.0);
  const auto by_doc = TokensByDoc(s);
  for (int64_t d : s.docs) EXPECT_EQ(by_doc.at(d), lengths[d]) << d;
  for (const Row& r : s.rows) EXPECT_LE(r.num_tokens, 256);
  EXPECT_EQ(s.Coverage(), "5 of 6 documents, 1070 of 1070 tokens (100.0% of the split)");
}

TEST(EvalSampleTest, TakesWholeDocumentsUntilEvalTokensWhateverTheirLength) {
  const std::vector<int64_t> lengths = LongTail(2000, 7);
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  const int64_t want = total / 4;
  const EvalSample s = PlanEvalSample(lengths, 512, want);
  EXPECT_GE(s.num_tokens, want);
  // Whole documents: each sampled document is in the rows with all its
  // tokens, and nothing else is.
  const auto by_doc = TokensByDoc(s);
  ASSERT_EQ(by_doc.size(), s.docs.size());
  for (int64_t d : s.docs) EXPECT_EQ(by_doc.at(d), lengths[d]) << d;
  // It stopped as soon as it had enough: without its last document (any of
  // them, as the order is random) it could be short of `want`, never of a
  // whole extra document's worth more.
  int64_t longest = 0;
  for (int64_t d : s.docs) longest = std::max(longest, lengths[d]);
  EXPECT_LT(s.num_tokens - longest, want);
  // Not chosen by length: the sampled documents' median length is near the
  // split's (the old plan took the longest first: all of them far above).
  auto median = [](std::vector<int64_t> v) {
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    return v[v.size() / 2];
  };
  std::vector<int64_t> sampled;
  for (int64_t d : s.docs) sampled.push_back(lengths[d]);
  const double ratio = static_cast<double>(median(sampled)) / median(lengths);
  EXPECT_GT(ratio, 0.8);
  EXPECT_LT(ratio, 1.25);
  // A quarter of the documents, give or take the sampling.
  EXPECT_GT(s.docs.size(), 2000 / 4 * 0.75);
  EXPECT_LT(s.docs.size(), 2000 / 4 * 1.33);
}

TEST(EvalSampleTest, TheSameForEveryCallAndIndependentOfSeqLen) {
  const std::vector<int64_t> lengths = LongTail(500, 3);
  const EvalSample a = PlanEvalSample(lengths, 512, 20000);
  const EvalSample b = PlanEvalSample(lengths, 512, 20000);
  const EvalSample c = PlanEvalSample(lengths, 128, 20000);
  EXPECT_EQ(a.docs, b.docs);
  ASSERT_EQ(a.rows.size(), b.rows.size());
  for (size_t i = 0; i < a.rows.size(); ++i) EXPECT_EQ(a.rows[i].segments, b.rows[i].segments);
  // The documents scored do not depend on the row width: a variant with
  // another seq_len is judged on the same text.
  EXPECT_EQ(a.docs, c.docs);
  EXPECT_NE(PlanEvalSample(lengths, 512, 20000, 99).docs, a.docs);
}

TEST(EvalSampleTest, EvalTokensBeyondTheSplitTakesItAll) {
  const std::vector<int64_t> lengths = {10, 20, 30};
  const EvalSample s = PlanEvalSample(lengths, 16, 1000);
  EXPECT_EQ(s.docs, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(s.num_tokens, 60);
  EXPECT_EQ(TokensByDoc(s).at(2), 30);
}

TEST(EvalSampleTest, EmptySplit) {
  const EvalSample s = PlanEvalSample({}, 16, 100);
  EXPECT_TRUE(s.rows.empty());
  EXPECT_EQ(s.token_fraction(), 0);
}

}  // namespace
}  // namespace tally::data
