#include "worker/data/sentencepiece.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::data {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  char t[] = "/tmp/tally_spm_test_XXXXXX";
  return mkdtemp(t);
}

std::vector<std::string> Corpus() {
  std::vector<std::string> docs;
  const char* words[] = {"the", "quick",   "brown",   "fox",  "jumps",  "over",    "lazy",
                         "dog", "fortune", "favours", "bold", "tokens", "packing", "padding"};
  for (int d = 0; d < 300; ++d) {
    std::string doc;
    for (int w = 0; w < 40; ++w) {
      doc += words[(d * 7 + w * 3) % 14];
      doc += w % 10 == 9 ? "\n" : " ";
    }
    docs.push_back(doc);
  }
  return docs;
}

TEST(SentencePiece, TrainsLoadsAndEncodesWithBosAndEos) {
  const std::string dir = TempDir();
  TrainTokenizerOptions o;
  o.vocab_size = 300;
  o.out = dir + "/tok.model";
  ASSERT_TRUE(TrainSentencePiece(Corpus(), o).ok());
  auto t = SentencePieceTokenizer::Load(o.out);
  ASSERT_TRUE(t.ok()) << t.status();
  const TokenizerRecord& r = (*t)->record();
  EXPECT_EQ(r.kind, "sentencepiece");
  EXPECT_EQ(r.vocab_size, 300);
  EXPECT_EQ(r.bos, 1);
  EXPECT_EQ(r.eos, 2);
  EXPECT_EQ(r.model_sha256.size(), 64u);
  std::vector<uint32_t> ids;
  ASSERT_TRUE((*t)->Encode("the quick brown fox", &ids).ok());
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids.front(), 1u);
  EXPECT_EQ(ids.back(), 2u);
  EXPECT_LT(ids.size(), 2 + std::string("the quick brown fox").size());  // merges happened
  for (uint32_t id : ids) EXPECT_LT(id, 300u);
  // Text it never saw still encodes (byte fallback), with no <unk>.
  ids.clear();
  ASSERT_TRUE((*t)->Encode("Zürich 漢字", &ids).ok());
  for (uint32_t id : ids) EXPECT_NE(id, 0u);
}

TEST(SentencePiece, BadModelsAndOptionsAreRefused) {
  const std::string dir = TempDir();
  std::ofstream(dir + "/junk.model") << "not a model";
  auto t = SentencePieceTokenizer::Load(dir + "/junk.model");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("not a SentencePiece model"));
  EXPECT_TRUE(absl::IsNotFound(SentencePieceTokenizer::Load(dir + "/none.model").status()));
  TrainTokenizerOptions o;
  o.out = dir + "/tok.bin";
  EXPECT_THAT(TrainSentencePiece(Corpus(), o).message(), HasSubstr("ending in .model"));
  o.out = dir + "/tok.model";
  o.model_type = "wordpiece";
  EXPECT_THAT(TrainSentencePiece(Corpus(), o).message(), HasSubstr("bpe or unigram"));
  o.model_type = "unigram";
  o.vocab_size = 100000;  // far more than this text holds
  EXPECT_FALSE(TrainSentencePiece(Corpus(), o).ok());
}

}  // namespace
}  // namespace tally::data
