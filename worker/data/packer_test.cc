#include "worker/data/packer.h"

#include <dirent.h>
#include <unistd.h>

#include <map>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/data/batch.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"

namespace tally::data {
namespace {

struct Dist {
  const char* name;
  std::function<int64_t(std::mt19937_64&)> draw;
};

std::vector<int64_t> Lengths(const Dist& d, int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = std::max<int64_t>(1, d.draw(rng));
  return v;
}

std::string DistAndModeName(
    const ::testing::TestParamInfo<std::tuple<int, PackingMode>>& info) {
  static const char* const kNames[] = {"uniform", "heavy_tail", "all_long", "tiny"};
  return std::string(kNames[std::get<0>(info.param)]) + "_" +
         PackingModeName(std::get<1>(info.param));
}

class PackerInvariants : public ::testing::TestWithParam<std::tuple<int, PackingMode>> {};

// Every token of every document appears exactly once per epoch, no row is
// over seq_len, and segments never overlap.
TEST_P(PackerInvariants, EveryTokenOnceNoRowOverSeqLen) {
  const auto [dist_index, mode] = GetParam();
  const std::vector<Dist> dists = {
      {"uniform", [](std::mt19937_64& r) { return int64_t(r() % 300) + 1; }},
      {"heavy_tail",
       [](std::mt19937_64& r) {
         return int64_t(std::exp(std::uniform_real_distribution<>(0, 8)(r)));
       }},
      {"all_long", [](std::mt19937_64& r) { return int64_t(r() % 2000) + 128; }},
      {"tiny", [](std::mt19937_64& r) { return int64_t(r() % 3) + 1; }},
  };
  const auto lengths = Lengths(dists[dist_index], 3000, 7 + dist_index);
  for (int32_t seq_len : {8, 128, 512}) {
    for (int64_t epoch : {0, 1}) {
      PackOptions o;
      o.seq_len = seq_len;
      o.shuffle_window = 257;
      o.seed = 42;
      o.mode = mode;
      const auto rows = PlanEpoch(lengths, o, epoch);
      std::vector<std::vector<int>> seen(lengths.size());
      for (size_t d = 0; d < lengths.size(); ++d) seen[d].assign(lengths[d], 0);
      for (const Row& row : rows) {
        int32_t sum = 0;
        for (const Segment& s : row.segments) {
          ASSERT_GT(s.length, 0);
          ASSERT_LE(s.begin + s.length, lengths[s.doc]);
          for (int32_t i = 0; i < s.length; ++i) ++seen[s.doc][s.begin + i];
          sum += s.length;
        }
        ASSERT_EQ(sum, row.num_tokens);
        ASSERT_LE(row.num_tokens, seq_len);
        if (mode != PackingMode::kPacked) ASSERT_EQ(row.segments.size(), 1u);
      }
      for (size_t d = 0; d < lengths.size(); ++d) {
        for (int64_t t = 0; t < lengths[d]; ++t) {
          ASSERT_EQ(seen[d][t], 1) << "doc " << d << " token " << t;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllModes, PackerInvariants,
    ::testing::Combine(::testing::Range(0, 4),
                       ::testing::Values(PackingMode::kPacked, PackingMode::kPadToSeqLen,
                                         PackingMode::kPadToLongest)),
    DistAndModeName);

TEST(PackerTest, DeterministicPerEpochAndShuffledAcrossEpochs) {
  const auto lengths = Lengths({"u", [](std::mt19937_64& r) { return int64_t(r() % 200) + 1; }},
                               500, 3);
  PackOptions o;
  o.seq_len = 256;
  o.seed = 9;
  const auto a = PlanEpoch(lengths, o, 0);
  const auto b = PlanEpoch(lengths, o, 0);
  const auto c = PlanEpoch(lengths, o, 1);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].segments, b[i].segments);
  bool differs = a.size() != c.size();
  for (size_t i = 0; !differs && i < a.size(); ++i) differs = !(a[i].segments == c[i].segments);
  EXPECT_TRUE(differs);
}

// A fair baseline: in every mode a long document's chunks are spread over
// its window's rows, not laid in consecutive rows (consecutive steps).
TEST(PackerTest, ALongDocumentsChunksAreNotConsecutiveInAnyMode) {
  std::vector<int64_t> lengths(50, 40);
  lengths[7] = 64 * 40;  // 40 chunks at seq_len 64
  for (PackingMode mode :
       {PackingMode::kPacked, PackingMode::kPadToSeqLen, PackingMode::kPadToLongest}) {
    PackOptions o;
    o.seq_len = 64;
    o.seed = 5;
    o.mode = mode;
    const auto rows = PlanEpoch(lengths, o, 0);
    int longest_run = 0, run = 0;
    for (const Row& r : rows) {
      const bool long_doc = r.segments.size() == 1 && r.segments[0].doc == 7;
      run = long_doc ? run + 1 : 0;
      longest_run = std::max(longest_run, run);
    }
    EXPECT_LT(longest_run, 10) << PackingModeName(mode);
  }
}

// The bar: >= 99% packing efficiency on the fortunes corpus at 512.
TEST(PackerTest, FortunesPackAtLeast99PercentAt512) {
  const std::string dir = "/usr/share/games/fortunes";
  DIR* d = opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << dir << " is missing: scripts/setup.sh installs `fortunes`";
  std::vector<std::string> files;
  while (dirent* e = readdir(d)) {
    if (absl::EndsWith(e->d_name, ".u8")) files.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  std::sort(files.begin(), files.end());
  std::vector<int64_t> lengths;
  for (const auto& f : files) {
    ASSERT_TRUE(ReadCorpusFile(f, {}, [&](absl::string_view text, const DocumentSource&) {
                  lengths.push_back(static_cast<int64_t>(text.size()) + 2);  // BOS, EOS
                  return absl::OkStatus();
                }).ok());
  }
  ASSERT_GT(lengths.size(), 5000u);
  PackOptions o;
  o.seq_len = 512;
  o.seed = 1;
  const PackStats packed = Summarize(PlanEpoch(lengths, o, 0), 512);
  o.mode = PackingMode::kPadToSeqLen;
  const PackStats padded = Summarize(PlanEpoch(lengths, o, 0), 512);
  std::cout << lengths.size() << " fortunes: packed efficiency " << packed.efficiency()
            << " (" << packed.rows << " rows), padded " << padded.efficiency() << " ("
            << padded.rows << " rows)\n";
  EXPECT_GE(packed.efficiency(), 0.99);
  EXPECT_EQ(packed.real_tokens, padded.real_tokens);
  EXPECT_LT(padded.efficiency(), 0.6);
}

class BatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tally_batch_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    prefix_ = std::string(dir) + "/train";
    auto w = DatasetWriter::Create(prefix_);
    for (const char* text : {"abc", "hello world", "z", "a much longer document here"}) {
      std::vector<uint16_t> t;
      ByteTokenizer::Encode(text, &t);
      ASSERT_TRUE((*w)->Add(t).ok());
    }
    ASSERT_TRUE((*w)->Finish("").ok());
    ds_ = *Dataset::Open(prefix_);
  }
  std::string prefix_;
  std::unique_ptr<Dataset> ds_;
};

TEST_F(BatchTest, TargetsAndPositionsStayInsideDocuments) {
  // Row 0: doc 0 (5 tokens) + doc 2 (3 tokens) in a 12-wide row: 4 padding.
  std::vector<Row> rows = {Row{{{0, 0, 5}, {2, 0, 3}}, 8}, Row{{{1, 0, 12}}, 12}};
  MicroBatch b = BuildMicroBatch(*ds_, rows, 12, PackingMode::kPacked);
  EXPECT_EQ(b.rows, 2);
  EXPECT_EQ(b.width, 12);
  EXPECT_EQ(b.real_tokens, 20);
  EXPECT_EQ(b.padding_tokens, 4);
  EXPECT_EQ(b.num_targets, 4 + 2 + 11);
  const std::vector<int64_t> pos0 = {0, 1, 2, 3, 4, 0, 1, 2, 0, 1, 2, 3};
  EXPECT_EQ(std::vector<int64_t>(b.positions.begin(), b.positions.begin() + 12), pos0);
  // The last token of a document has no target: nothing crosses a boundary.
  EXPECT_EQ(b.targets[4], kIgnoreTarget);
  EXPECT_EQ(b.targets[3], ByteTokenizer::kEos);
  EXPECT_EQ(b.targets[5], 'z');
  for (int i = 7; i < 12; ++i) EXPECT_EQ(b.targets[i], kIgnoreTarget);
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 5, 8, 12, 24}));
  EXPECT_EQ(b.max_seqlen, 12);
  EXPECT_NE(b.segment_ids[4], b.segment_ids[5]);
  EXPECT_NE(b.segment_ids[8], b.segment_ids[7]);
  EXPECT_EQ(b.real[7], 1);
  EXPECT_EQ(b.real[8], 0);
  EXPECT_EQ(std::count(b.real.begin(), b.real.end(), 1), b.real_tokens);

  MicroBatch longest = BuildMicroBatch(*ds_, {Row{{{0, 0, 5}}, 5}, Row{{{2, 0, 3}}, 3}}, 64,
                                       PackingMode::kPadToLongest);
  EXPECT_EQ(longest.width, 5);
  EXPECT_EQ(longest.padding_tokens, 2);
}

TEST_F(BatchTest, RowStreamResumesFromItsCursor) {
  PackOptions o;
  o.seq_len = 16;
  o.seed = 5;
  RowStream a(ds_.get(), o);
  std::vector<Row> first;
  for (int i = 0; i < 7; ++i) {
    auto r = a.Next(1);
    first.push_back(r[0]);
  }
  RowStream b(ds_.get(), o);
  b.Next(3);
  const DataCursor c = b.cursor();
  RowStream resumed(ds_.get(), o);
  resumed.Seek(c);
  for (int i = 3; i < 7; ++i) EXPECT_EQ(resumed.Next(1)[0].segments, first[i].segments) << i;
  EXPECT_GE(resumed.cursor().epoch, 1);  // crossed into a new epoch
}

}  // namespace
}  // namespace tally::data
