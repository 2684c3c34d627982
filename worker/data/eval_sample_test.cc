#include "worker/data/eval_sample.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>

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

TEST(EvalSampleTest, TakesWholeDocumentsOfEveryLengthToAboutEvalTokens) {
  const std::vector<int64_t> lengths = LongTail(2000, 7);
  int64_t total = 0;
  for (int64_t l : lengths) total += l;
  const int64_t want = total / 4;
  const EvalSample s = PlanEvalSample(lengths, 512, want);
  // About eval_tokens: a quarter of the documents of every length, give or
  // take the two very long ones (25,000 and 10,000 tokens).
  EXPECT_NEAR(static_cast<double>(s.num_tokens), want, 0.1 * want);
  EXPECT_NEAR(s.token_fraction(), 0.25, 0.025);
  // Whole documents: each sampled document is in the rows with all its
  // tokens, and nothing else is.
  const auto by_doc = TokensByDoc(s);
  ASSERT_EQ(by_doc.size(), s.docs.size());
  for (int64_t d : s.docs) EXPECT_EQ(by_doc.at(d), lengths[d]) << d;
  // Stratified by length: each length quartile of the split gives a quarter
  // of its documents (the old plan took the longest first).
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  std::set<int64_t> in_sample(s.docs.begin(), s.docs.end());
  for (int q = 0; q < 4; ++q) {
    const int64_t lo = sorted[sorted.size() * q / 4];
    const int64_t hi = q == 3 ? INT64_MAX : sorted[sorted.size() * (q + 1) / 4];
    int64_t in = 0, taken = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < lo || lengths[i] >= hi) continue;
      ++in;
      taken += in_sample.count(static_cast<int64_t>(i));
    }
    ASSERT_GT(in, 100);
    EXPECT_NEAR(static_cast<double>(taken) / in, 0.25, 0.02) << "quartile " << q;
  }
  EXPECT_NEAR(static_cast<double>(s.docs.size()), 500, 10);
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
  EXPECT_EQ(PlanEvalSample(lengths, 16, 60).docs, (std::vector<int64_t>{0, 1, 2}));
  const EvalSample s = PlanEvalSample(lengths, 16, 1000);
  EXPECT_EQ(s.docs, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(s.num_tokens, 60);
  EXPECT_EQ(TokensByDoc(s).at(2), 30);
}

TEST(EvalSampleTest, ASampleSmallerThanAnyDocumentsShareStillScoresOne) {
  // 24 long documents and eval_tokens a fiftieth of the split: the walk
  // alone could take none (an evaluation with nothing to score).
  std::vector<int64_t> lengths(24, 20000);
  lengths[3] = 1;  // no target
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const EvalSample s = PlanEvalSample(lengths, 512, 8192, seed);
    ASSERT_FALSE(s.docs.empty()) << seed;
    EXPECT_GE(lengths[s.docs[0]], 2) << seed;
    EXPECT_GT(s.num_tokens, 0);
  }
  // Only documents without a target: one is still taken (the evaluation
  // then has no target, which the trainer reports as it always has).
  EXPECT_EQ(PlanEvalSample(std::vector<int64_t>{1, 1, 1}, 16, 1).docs.size(), 1u);
}

TEST(EvalSampleTest, EmptySplit) {
  const EvalSample s = PlanEvalSample({}, 16, 100);
  EXPECT_TRUE(s.rows.empty());
  EXPECT_EQ(s.token_fraction(), 0);
}

}  // namespace
}  // namespace tally::data
