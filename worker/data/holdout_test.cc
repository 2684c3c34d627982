#include "worker/data/holdout.h"

#include <algorithm>
#include <random>

#include "gtest/gtest.h"

namespace tally::data {
namespace {

std::vector<int64_t> LongTail(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> len(5.5, 1.3);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = std::max<int64_t>(1, static_cast<int64_t>(len(rng)));
  v[n / 2] = 25000;  // one document of ~5% of the corpus
  return v;
}

TEST(HoldoutTest, LargestDocumentShare) {
  EXPECT_DOUBLE_EQ(LargestDocumentShare({10, 30, 60}), 0.6);
  EXPECT_DOUBLE_EQ(LargestDocumentShare({}), 0.0);
  EXPECT_DOUBLE_EQ(LargestDocumentShare({0, 0}), 0.0);
}

TEST(HoldoutTest, HoldsOutAboutValTokensSpreadAcrossLengths) {
  const std::vector<int64_t> lengths = LongTail(3300, 11);
  const int64_t want = 40000;
  const Holdout h = StratifiedHoldout(lengths, want, 1);
  EXPECT_NEAR(static_cast<double>(h.num_tokens), want, 0.1 * want);
  // No document holds more than 10% of the split.
  std::vector<int64_t> val;
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (h.held_out[i]) val.push_back(lengths[i]);
  }
  EXPECT_EQ(static_cast<int64_t>(val.size()), h.num_docs);
  EXPECT_LE(LargestDocumentShare(val), kConcentratedShare + 1e-9);
  EXPECT_GE(h.num_too_long, 1);  // the 25,000-token one stays in training
  // Each length quartile of the corpus gives about the same fraction of its
  // documents.
  std::vector<int64_t> sorted = lengths;
  std::sort(sorted.begin(), sorted.end());
  const double fraction = static_cast<double>(h.num_docs) / lengths.size();
  for (int q = 0; q < 4; ++q) {
    const int64_t lo = sorted[sorted.size() * q / 4];
    const int64_t hi = q == 3 ? INT64_MAX : sorted[sorted.size() * (q + 1) / 4];
    int64_t in = 0, out = 0;
    for (size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] < lo || lengths[i] >= hi) continue;
      ++in;
      if (h.held_out[i]) ++out;
    }
    if (in < 100 || static_cast<double>(hi) > want * kConcentratedShare) continue;
    EXPECT_NEAR(static_cast<double>(out) / in, fraction, 0.35 * fraction) << "quartile " << q;
  }
}

TEST(HoldoutTest, SeededAndDeterministic) {
  const std::vector<int64_t> lengths = LongTail(500, 2);
  EXPECT_EQ(StratifiedHoldout(lengths, 10000, 1).held_out,
            StratifiedHoldout(lengths, 10000, 1).held_out);
  EXPECT_NE(StratifiedHoldout(lengths, 10000, 1).held_out,
            StratifiedHoldout(lengths, 10000, 2).held_out);
}

TEST(HoldoutTest, MoreThanTheCorpusHoldsOutEveryEligibleDocument) {
  const Holdout h = StratifiedHoldout({5, 6, 0, 7}, 1000, 0);
  EXPECT_EQ(h.held_out, (std::vector<bool>{true, true, false, true}));
  EXPECT_EQ(h.num_tokens, 18);
  EXPECT_EQ(StratifiedHoldout({5, 6}, 0, 0).num_docs, 0);
}

}  // namespace
}  // namespace tally::data
