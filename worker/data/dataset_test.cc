#include "worker/data/dataset.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "worker/data/tokenizer.h"

namespace tally::data {
namespace {

std::string TempPrefix(const std::string& name) {
  char dir[] = "/tmp/tally_data_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return std::string(dir) + "/" + name;
}

TEST(DatasetTest, RoundTripsDocumentsAndMetadata) {
  const std::string prefix = TempPrefix("train");
  const std::vector<std::string> docs = {"hello", "", "x", "caf\xc3\xa9 au lait\n"};
  {
    auto w = DatasetWriter::Create(prefix);
    ASSERT_TRUE(w.ok()) << w.status();
    for (const auto& d : docs) {
      std::vector<uint16_t> t;
      ByteTokenizer::Encode(d, &t);
      ASSERT_TRUE((*w)->Add(t).ok());
    }
    ASSERT_TRUE((*w)->Finish("{\"split\": \"train\"}").ok());
  }
  auto ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->num_docs(), 4);
  int64_t total = 0;
  for (int i = 0; i < 4; ++i) {
    const int64_t len = (*ds)->doc_length(i);
    EXPECT_EQ(len, static_cast<int64_t>(docs[i].size()) + 2);
    EXPECT_EQ((*ds)->doc(i)[0], ByteTokenizer::kBos);
    EXPECT_EQ((*ds)->doc(i)[len - 1], ByteTokenizer::kEos);
    EXPECT_EQ(ByteTokenizer::Decode((*ds)->doc(i), len), docs[i]);
    total += len;
  }
  EXPECT_EQ((*ds)->num_tokens(), total);
  std::ifstream meta(prefix + ".json");
  std::string json((std::istreambuf_iterator<char>(meta)), {});
  EXPECT_NE(json.find("\"num_docs\": 4"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tokenizer\": \"byte\""), std::string::npos);
  EXPECT_NE(json.find("\"split\": \"train\""), std::string::npos);
}

TEST(DatasetTest, MissingAndTruncatedFilesAreClearErrors) {
  const std::string prefix = TempPrefix("train");
  auto missing = Dataset::Open(prefix);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("tally-prep"), std::string::npos);
  {
    auto w = DatasetWriter::Create(prefix);
    std::vector<uint16_t> t;
    ByteTokenizer::Encode("some text", &t);
    ASSERT_TRUE((*w)->Add(t).ok());
    ASSERT_TRUE((*w)->Finish("").ok());
  }
  ASSERT_EQ(truncate((prefix + ".bin").c_str(), 6), 0);
  auto bad = Dataset::Open(prefix);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find(".bin"), std::string::npos);
}

TEST(DatasetTest, ValidationPrefixIsBesideTrain) {
  EXPECT_EQ(ValidationPrefixFor("data/fortunes/train"), "data/fortunes/val");
  EXPECT_EQ(ValidationPrefixFor("train"), "val");
}

}  // namespace
}  // namespace tally::data
