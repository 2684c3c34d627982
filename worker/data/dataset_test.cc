#include "worker/data/dataset.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/data/dataset_test_util.h"
#include "worker/data/tokenizer.h"

namespace tally::data {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
}

// Overwrites `n` bytes at `offset` of an existing file.
void Patch(const std::string& path, size_t offset, const void* bytes, size_t n) {
  std::string s = ReadFile(path);
  ASSERT_LE(offset + n, s.size());
  std::memcpy(s.data() + offset, bytes, n);
  WriteFile(path, s);
}

// Documents "doc 0", "doc 1", ... (7 tokens each: [BOS, bytes, EOS]), or
// `first` in place of "doc 0".
std::string WriteDataset(const std::string& name, int num_docs = 5,
                         const std::string& first = "") {
  const std::string prefix = TempPrefix(name);
  auto w = DatasetWriter::Create(prefix);
  EXPECT_TRUE(w.ok()) << w.status();
  for (int i = 0; i < num_docs; ++i) {
    std::vector<uint16_t> t;
    ByteTokenizer::Encode(i == 0 && !first.empty() ? first : "doc " + std::to_string(i), &t);
    EXPECT_TRUE((*w)->Add(t).ok());
  }
  EXPECT_TRUE((*w)->Finish("{\"split\": \"train\"}").ok());
  return prefix;
}

void EditJson(const std::string& prefix, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(ReadFile(prefix + ".json"));
  edit(j);
  WriteFile(prefix + ".json", j.dump(2));
}

constexpr size_t kIdxHeader = 24;

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
    EXPECT_EQ((*ds)->token(i, 0), ByteTokenizer::kBos);
    EXPECT_EQ((*ds)->token(i, len - 1), ByteTokenizer::kEos);
    std::vector<uint16_t> toks;
    for (int64_t j = 0; j < len; ++j) toks.push_back(static_cast<uint16_t>((*ds)->token(i, j)));
    EXPECT_EQ(ByteTokenizer::Decode(toks.data(), len), docs[i]);
    total += len;
  }
  EXPECT_EQ((*ds)->num_tokens(), total);
  const std::string json = ReadFile(prefix + ".json");
  EXPECT_THAT(json, HasSubstr("\"num_docs\": 4")) << json;
  EXPECT_THAT(json, HasSubstr("\"tokenizer\": \"byte\""));
  EXPECT_THAT(json, HasSubstr("\"split\": \"train\""));
  // The recorded digests are those of the files' bytes (what sha256sum prints).
  const std::string bin = ReadFile(prefix + ".bin");
  const std::string idx = ReadFile(prefix + ".idx");
  EXPECT_EQ((*ds)->metadata().bin_sha256, Sha256Hex(bin.data(), bin.size()));
  EXPECT_EQ((*ds)->metadata().idx_sha256, Sha256Hex(idx.data(), idx.size()));
  EXPECT_TRUE((*ds)->VerifyContentHash().ok());
}

TEST(DatasetTest, Sha256MatchesTheStandardVector) {
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(DatasetTest, MissingAndTruncatedFilesAreClearErrors) {
  const std::string prefix = TempPrefix("train");
  auto missing = Dataset::Open(prefix);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("tally-prep"));
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
  EXPECT_THAT(bad.status().message(), HasSubstr(".bin"));
}

TEST(DatasetTest, MissingMetadataIsNotFound) {
  const std::string prefix = WriteDataset("train");
  ASSERT_EQ(std::remove((prefix + ".json").c_str()), 0);
  auto ds = Dataset::Open(prefix);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(ds.status().message(), HasSubstr("train.json"));
}

// Each case damages a good dataset's .json; Open must refuse it, with the
// code and a message naming the problem.
TEST(DatasetTest, MetadataIsValidated) {
  struct Case {
    const char* name;
    std::function<void(nlohmann::json&)> edit;
    absl::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"vocab_size", [](nlohmann::json& j) { j["vocab_size"] = 10; }, absl::StatusCode::kDataLoss,
       "\"vocab_size\" 10"},
      {"tokenizer", [](nlohmann::json& j) { j["tokenizer"] = "gpt2"; },
       absl::StatusCode::kInvalidArgument, "tokenizer \"gpt2\" is not supported"},
      {"format", [](nlohmann::json& j) { j["format"] = "npy"; }, absl::StatusCode::kDataLoss,
       "\"format\" is \"npy\""},
      {"version", [](nlohmann::json& j) { j["version"] = 3; }, absl::StatusCode::kInvalidArgument,
       "\"version\" 3 is not supported"},
      {"no version", [](nlohmann::json& j) { j.erase("version"); }, absl::StatusCode::kDataLoss,
       "\"version\" is missing"},
      {"string count", [](nlohmann::json& j) { j["num_docs"] = "5"; }, absl::StatusCode::kDataLoss,
       "\"num_docs\" is missing or not an integer"},
      {"float count", [](nlohmann::json& j) { j["num_tokens"] = 1.5; }, absl::StatusCode::kDataLoss,
       "\"num_tokens\" is missing or not an integer"},
      {"negative", [](nlohmann::json& j) { j["max_doc_tokens"] = -1; }, absl::StatusCode::kDataLoss,
       "\"max_doc_tokens\" is negative"},
      {"huge", [](nlohmann::json& j) { j["num_tokens"] = uint64_t{1} << 63; },
       absl::StatusCode::kDataLoss, "out of range"},
      {"token_bytes", [](nlohmann::json& j) { j["token_bytes"] = 3; },
       absl::StatusCode::kInvalidArgument, "\"token_bytes\" 3"},
      {"no docs", [](nlohmann::json& j) { j["num_docs"] = 0; }, absl::StatusCode::kDataLoss,
       "no documents"},
      {"num_docs vs idx", [](nlohmann::json& j) { j["num_docs"] = 4; }, absl::StatusCode::kDataLoss,
       "header says 5 documents, "},
      {"num_tokens vs idx", [](nlohmann::json& j) { j["num_tokens"] = 34; },
       absl::StatusCode::kDataLoss, "train.bin: 70 bytes, but"},
      {"max_doc_tokens", [](nlohmann::json& j) { j["max_doc_tokens"] = 6; },
       absl::StatusCode::kDataLoss, "the longest document has 7 tokens"},
      {"hash", [](nlohmann::json& j) { j["content_sha256"]["bin"] = "xyz"; },
       absl::StatusCode::kDataLoss, "\"content_sha256\".\"bin\""},
      {"not an object",
       [](nlohmann::json& j) {
         j = nlohmann::json::array({1, 2});
       },
       absl::StatusCode::kDataLoss, "expected a JSON object, got array"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string prefix = WriteDataset("train");
    EditJson(prefix, c.edit);
    auto ds = Dataset::Open(prefix);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), c.code) << ds.status();
    EXPECT_THAT(ds.status().message(), HasSubstr(c.message));
    EXPECT_THAT(ds.status().message(), HasSubstr("train."));
  }
}

TEST(DatasetTest, InvalidJsonIsDataLoss) {
  for (const std::string& text : {std::string(""), std::string("{\"format\": "),
                                  std::string("not json"), std::string(100000, '[')}) {
    const std::string prefix = WriteDataset("train");
    WriteFile(prefix + ".json", text);
    auto ds = Dataset::Open(prefix);
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
    EXPECT_THAT(ds.status().message(), HasSubstr("train.json"));
  }
}

TEST(DatasetTest, OversizedMetadataIsRefusedUnread) {
  const std::string prefix = WriteDataset("train");
  // A sparse 1 GiB file: refused from its size, so no gigabyte is allocated.
  ASSERT_EQ(truncate((prefix + ".json").c_str(), int64_t{1} << 30), 0);
  auto ds = Dataset::Open(prefix);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ds.status().message(), HasSubstr("1073741824 bytes, more than"));
}

TEST(DatasetTest, FifoIsRefusedWithoutBlocking) {
  const std::string prefix = WriteDataset("train");
  ASSERT_EQ(std::remove((prefix + ".json").c_str()), 0);
  ASSERT_EQ(mkfifo((prefix + ".json").c_str(), 0600), 0);
  auto ds = Dataset::Open(prefix);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ds.status().message(), HasSubstr("not a regular file"));
}

TEST(DatasetTest, VocabularyMustBeTheModels) {
  const std::string prefix = WriteDataset("train");
  auto small = Dataset::Open(prefix, /*model_vocab_size=*/100);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("vocabulary has 258 tokens"));
  EXPECT_THAT(small.status().message(), HasSubstr("model's vocab_size of 100"));
  EXPECT_TRUE(Dataset::Open(prefix, 258).ok());
  // A larger one too: the model would learn ids no data holds.
  EXPECT_FALSE(Dataset::Open(prefix, 512).ok());
}

TEST(DatasetTest, OutOfVocabularyTokenIsFoundAtOpen) {
  const std::string prefix = WriteDataset("train");
  // Documents are 7 tokens; document 2 starts at token 14. Its third token
  // becomes 258, one past EOS.
  const uint16_t bad = 258;
  Patch(prefix + ".bin", 2 * 16, &bad, 2);
  auto ds = Dataset::Open(prefix);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(ds.status().message(),
              HasSubstr("train.bin: token id 258 at token 16 (document 2) is outside the "
                        "vocabulary of 258"));
}

TEST(DatasetTest, InRangeBinFlipIsCaughtByTheHashOnly) {
  const std::string prefix = WriteDataset("train");
  const uint16_t other = 'x';
  Patch(prefix + ".bin", 2 * 3, &other, 2);
  auto ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  absl::Status s = (*ds)->VerifyContentHash();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("train.bin: SHA-256 "));
  EXPECT_THAT(s.message(), HasSubstr("does not match"));
}

TEST(DatasetTest, IndexIsCheckedStructurally) {
  struct Case {
    const char* name;
    size_t offset;
    uint64_t value;
    int width;
    const char* message;
  };
  // 5 documents of 7 tokens: offsets 0, 7, 14, 21, 28, 35 at byte 24 + 8 * i.
  const std::vector<Case> cases = {
      {"magic", 0, 'X', 1, "bad magic"},
      {"version", 8, 7, 4, "index version 7 is not supported"},
      {"token width", 12, 4, 4, "header says 4-byte tokens"},
      {"doc count", 16, 6, 8, "header says 6 documents"},
      {"huge doc count", 16, ~uint64_t{0}, 8, "documents, "},
      {"first offset", kIdxHeader, 1, 8, "the first offset is 1, not 0"},
      {"out of order", kIdxHeader + 8 * 2, 22, 8, "document 2 is empty or out of order"},
      {"empty doc", kIdxHeader + 8 * 2, 7, 8, "document 1 is empty or out of order"},
      {"last offset", kIdxHeader + 8 * 5, 36, 8, "the offsets end at 36 tokens"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string prefix = WriteDataset("train");
    Patch(prefix + ".idx", c.offset, &c.value, c.width);
    auto ds = Dataset::Open(prefix);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
    EXPECT_THAT(ds.status().message(), HasSubstr("train.idx: "));
    EXPECT_THAT(ds.status().message(), HasSubstr(c.message));
  }
}

TEST(DatasetTest, TruncatedAndPaddedIndexAreRefused) {
  for (const int64_t size : {0, 10, 24, 24 + 8 * 5, 24 + 8 * 6 + 1, 24 + 8 * 7}) {
    SCOPED_TRACE(size);
    const std::string prefix = WriteDataset("train");
    ASSERT_EQ(truncate((prefix + ".idx").c_str(), size), 0);
    auto ds = Dataset::Open(prefix);
    EXPECT_EQ(ds.status().code(), absl::StatusCode::kDataLoss) << ds.status();
    EXPECT_THAT(ds.status().message(), HasSubstr("train.idx: "));
  }
}

TEST(DatasetTest, BoundaryShiftKeepingOffsetsMonotoneIsCaughtByTheHash) {
  // Offsets 0, 22, 29, 36, 43, 50. Document 1 becomes 8 tokens and document 2
  // becomes 6: still a valid index, with the same longest document.
  const std::string prefix = WriteDataset("train", 5, "the longest document");
  const uint64_t shifted = 30;
  Patch(prefix + ".idx", kIdxHeader + 8 * 2, &shifted, 8);
  auto ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  absl::Status s = (*ds)->VerifyContentHash();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("train.idx: SHA-256 "));
}

TEST(DatasetTest, ADamagedDigestInTheJsonBlamesTheJsonNotTheIntactFiles) {
  const std::string prefix = WriteDataset("train");
  std::string bin_sha, idx_sha;
  {
    auto ds = Dataset::Open(prefix);
    ASSERT_TRUE(ds.ok()) << ds.status();
    bin_sha = (*ds)->metadata().bin_sha256;
    idx_sha = (*ds)->metadata().idx_sha256;
    EXPECT_EQ((*ds)->metadata().content_check, ContentCheck(bin_sha, idx_sha));
  }
  // One hex digit of the recorded .bin digest changed: still valid hex.
  std::string edited = bin_sha;
  edited[10] = edited[10] == '0' ? '1' : '0';
  EditJson(prefix, [&](nlohmann::json& j) { j["content_sha256"]["bin"] = edited; });
  auto ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  absl::Status s = (*ds)->VerifyContentHash();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(prefix + ".json: its \"content_sha256\" record is damaged"));
  EXPECT_THAT(s.message(), HasSubstr("\"bin\" records " + edited + " but " + prefix +
                                     ".bin hashes to " + bin_sha));
  EXPECT_THAT(s.message(), HasSubstr("the data files are not to blame"));
  EXPECT_THAT(s.message(), Not(HasSubstr(".bin: SHA-256")));
  // The check digest itself damaged.
  EditJson(prefix, [&](nlohmann::json& j) {
    j["content_sha256"]["bin"] = bin_sha;
    j["content_sha256"]["check"] = std::string(64, 'a');
  });
  ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  s = (*ds)->VerifyContentHash();
  EXPECT_THAT(s.message(), HasSubstr(".json: its \"content_sha256\" record is damaged"));
  EXPECT_THAT(s.message(), HasSubstr("the \"check\" digest itself is wrong"));
  // Not hex at all: the .json is named when it is opened.
  EditJson(prefix, [&](nlohmann::json& j) { j["content_sha256"]["check"] = "xyz"; });
  EXPECT_THAT(Dataset::Open(prefix).status().message(),
              HasSubstr("train.json: \"content_sha256\".\"check\" is not 64"));
}

TEST(DatasetTest, AChangedBinUnderAnIntactRecordBlamesTheBin) {
  const std::string prefix = WriteDataset("train");
  const uint16_t other = 'x';
  Patch(prefix + ".bin", 2 * 3, &other, 2);
  auto ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  absl::Status s = (*ds)->VerifyContentHash();
  EXPECT_THAT(s.message(), HasSubstr(prefix + ".bin: SHA-256 "));
  EXPECT_THAT(s.message(), HasSubstr("(the record is intact)"));
  // A record without its own check (an older tally-prep) cannot tell.
  EditJson(prefix, [](nlohmann::json& j) { j["content_sha256"].erase("check"); });
  ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  s = (*ds)->VerifyContentHash();
  EXPECT_THAT(s.message(), HasSubstr(prefix + ".bin: SHA-256 "));
  EXPECT_THAT(s.message(), HasSubstr("or the record in the .json was edited"));
}

TEST(DatasetTest, OlderDatasetWithoutHashOpensButCannotBeVerified) {
  const std::string prefix = WriteDataset("train");
  EditJson(prefix, [](nlohmann::json& j) {
    j.erase("content_sha256");
    j.erase("token_bytes");
  });
  auto ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  absl::Status s = (*ds)->VerifyContentHash();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("records no content hash"));
}

TEST(DatasetTest, MaxTokenIdCoversEveryPosition) {
  std::mt19937 rng(7);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{4096}, size_t{4097},
                         size_t{12289}}) {
    std::vector<uint16_t> t(n);
    for (auto& x : t) x = static_cast<uint16_t>(rng() % 200);
    EXPECT_EQ(MaxTokenId(t.data(), n), n == 0 ? 0 : *std::max_element(t.begin(), t.end()));
    for (const size_t at : {size_t{0}, n / 2, n > 0 ? n - 1 : 0, size_t{4095}, size_t{4096}}) {
      if (at >= n) continue;
      std::vector<uint16_t> u = t;
      u[at] = 65535;
      EXPECT_EQ(MaxTokenId(u.data(), n), 65535) << "n=" << n << " at=" << at;
    }
  }
}

TEST(DatasetTest, MetadataParserSurvivesEveryTruncationAndFlip) {
  const std::string prefix = WriteDataset("train");
  const std::string good = ReadFile(prefix + ".json");
  ASSERT_TRUE(ParseDatasetMetadata(good, "m.json").ok());
  const size_t last_brace = good.rfind('}');
  for (size_t n = 0; n <= last_brace; ++n) {
    EXPECT_FALSE(ParseDatasetMetadata(good.substr(0, n), "m.json").ok()) << n;
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 2000; ++i) {
    std::string s = good;
    s[rng() % s.size()] = static_cast<char>(rng());
    (void)ParseDatasetMetadata(s, "m.json");  // must not crash or throw
  }
}

TEST(DatasetTest, ValidationPrefixIsBesideTrain) {
  EXPECT_EQ(ValidationPrefixFor("data/fortunes/train"), "data/fortunes/val");
  EXPECT_EQ(ValidationPrefixFor("train"), "val");
}

// Format version 1 (what tally-prep wrote before tokenizers were recorded):
// still opens, as the byte tokenizer with 2-byte tokens.
TEST(DatasetTest, VersionOneDatasetsStillOpen) {
  const std::string prefix = WriteDataset("v1");
  EditJson(prefix, [](nlohmann::json& j) {
    j["version"] = 1;
    j.erase("text_bytes");
    j.erase("text_tokens");
  });
  const uint32_t one = 1;
  Patch(prefix + ".idx", 8, &one, 4);
  auto ds = Dataset::Open(prefix, 258);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->metadata().version, 1);
  EXPECT_EQ((*ds)->bytes_per_text_token(), 1.0);
  EXPECT_EQ((*ds)->token(0, 0), ByteTokenizer::kBos);
  // Version 1 knows no other token width.
  EditJson(prefix, [](nlohmann::json& j) { j["token_bytes"] = 4; });
  auto wide = Dataset::Open(prefix);
  ASSERT_FALSE(wide.ok());
  EXPECT_THAT(wide.status().message(), HasSubstr("\"token_bytes\" 4 is not supported"));
}

TEST(DatasetTest, LargeVocabulariesUseFourByteTokens) {
  const std::string prefix = TempPrefix("wide");
  TokenizerRecord tok;
  tok.kind = "pretokenized";
  tok.vocab_size = 100000;
  tok.bos = 99998;
  tok.eos = -1;
  {
    auto w = DatasetWriter::Create(prefix, tok);
    ASSERT_TRUE(w.ok()) << w.status();
    const std::vector<uint32_t> a = {99998, 70000, 5, 99999}, b = {99998, 1};
    ASSERT_TRUE((*w)->Add(a, 0).ok());
    ASSERT_TRUE((*w)->Add(b, 0).ok());
    const std::vector<uint32_t> bad = {100000};
    EXPECT_THAT((*w)->Add(bad, 0).message(), HasSubstr("outside the 100000-token vocabulary"));
    ASSERT_TRUE((*w)->Finish("").ok());
  }
  struct stat st;
  ASSERT_EQ(::stat((prefix + ".bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 6 * 4);
  auto ds = Dataset::Open(prefix, 100000);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const DatasetMetadata& m = (*ds)->metadata();
  EXPECT_EQ(m.token_bytes, 4);
  EXPECT_EQ(m.bos, 99998);
  EXPECT_EQ(m.eos, -1);
  EXPECT_EQ((*ds)->token(0, 1), 70000u);
  EXPECT_EQ((*ds)->token(0, 3), 99999u);
  EXPECT_TRUE((*ds)->IsSpecial(99998));
  EXPECT_FALSE((*ds)->IsSpecial(99999));
  EXPECT_EQ((*ds)->bytes_per_text_token(), 0);  // no text: unknown
  EXPECT_TRUE((*ds)->VerifyContentHash().ok());
  // A token past the vocabulary is found in 4-byte tokens too.
  const uint32_t big = 100001;
  Patch(prefix + ".bin", 8, &big, 4);
  EditJson(prefix, [](nlohmann::json& j) { j.erase("content_sha256"); });
  auto damaged = Dataset::Open(prefix);
  ASSERT_FALSE(damaged.ok());
  EXPECT_THAT(damaged.status().message(), HasSubstr("token id 100001 at token 2"));
}

TEST(DatasetTest, AModelOfAnotherVocabularyIsRefusedNamingBoth) {
  const std::string prefix = WriteDataset("vocab");
  auto ds = Dataset::Open(prefix, 32000);
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(ds.status().message(), HasSubstr("vocabulary has 258 tokens"));
  EXPECT_THAT(ds.status().message(), HasSubstr("the model's vocab_size of 32000 differs"));
}

TEST(DatasetTest, TextBytesPerTokenAreRecorded) {
  const std::string prefix = TempPrefix("spm");
  TokenizerRecord tok;
  tok.kind = "sentencepiece";
  tok.vocab_size = 500;
  tok.bos = 1;
  tok.eos = 2;
  tok.model_path = "tok.model";
  tok.model_sha256 = std::string(64, 'a');
  {
    auto w = DatasetWriter::Create(prefix, tok);
    ASSERT_TRUE(w.ok());
    const std::vector<uint32_t> doc = {1, 300, 301, 302, 2};  // 3 pieces of 12 bytes
    ASSERT_TRUE((*w)->Add(doc, 12).ok());
    ASSERT_TRUE((*w)->Finish("").ok());
  }
  auto ds = Dataset::Open(prefix);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->metadata().text_bytes, 12);
  EXPECT_EQ((*ds)->metadata().text_tokens, 3);
  EXPECT_EQ((*ds)->bytes_per_text_token(), 4.0);
  EXPECT_EQ((*ds)->metadata().tokenizer_model_sha256, std::string(64, 'a'));
  EditJson(prefix, [](nlohmann::json& j) { j.erase("tokenizer_model"); });
  auto bad = Dataset::Open(prefix);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("tokenizer_model"));
}

}  // namespace
}  // namespace tally::data
