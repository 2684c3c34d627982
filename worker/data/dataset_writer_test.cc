// DatasetWriter's files, byte for byte, and what it leaves when the disk
// fails under it; Dataset::Open's metadata read through the file seam.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "tests/support/file/fault_injection_file_system.h"
#include "common/file/file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/dataset_test_util.h"
#include "worker/data/tokenizer.h"

namespace tally::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A fixed pseudo-random sequence (an LCG, so that every standard library
// gives the same numbers).
class Lcg {
 public:
  uint32_t Next() {
    state_ = state_ * 6364136223846793005u + 1442695040888963407u;
    return static_cast<uint32_t>(state_ >> 33);
  }

 private:
  uint64_t state_ = 42;
};

struct Written {
  size_t bin_bytes, idx_bytes, json_bytes;
  std::string bin_sha256, idx_sha256, json_sha256;
};

// The files' sizes and digests; removes them.
Written Digests(const std::string& prefix) {
  Written w;
  const std::string bin = ReadFile(prefix + ".bin"), idx = ReadFile(prefix + ".idx"),
                    json = ReadFile(prefix + ".json");
  w.bin_bytes = bin.size();
  w.idx_bytes = idx.size();
  w.json_bytes = json.size();
  w.bin_sha256 = Sha256Hex(bin.data(), bin.size());
  w.idx_sha256 = Sha256Hex(idx.data(), idx.size());
  w.json_sha256 = Sha256Hex(json.data(), json.size());
  std::filesystem::remove_all(std::filesystem::path(prefix).parent_path());
  return w;
}

// 3000 byte-tokenizer documents of 1 to 600 bytes: a .bin of some 1.8 MB, so
// that writes cross any buffer size up to a megabyte.
std::string WriteByteCorpus() {
  const std::string prefix = TempPrefix("train");
  auto w = DatasetWriter::Create(prefix);
  EXPECT_TRUE(w.ok()) << w.status();
  Lcg rng;
  for (int i = 0; i < 3000; ++i) {
    std::string text(1 + rng.Next() % 600, ' ');
    for (char& c : text) c = static_cast<char>('a' + rng.Next() % 26);
    std::vector<uint16_t> t;
    ByteTokenizer::Encode(text, &t);
    EXPECT_TRUE((*w)->Add(t).ok());
  }
  EXPECT_TRUE((*w)->Finish("{\"split\": \"train\", \"source\": \"lcg\"}").ok());
  return prefix;
}

// 4-byte tokens: a pre-tokenized corpus with a vocabulary wider than 2 bytes.
std::string WriteWideCorpus() {
  const std::string prefix = TempPrefix("wide");
  TokenizerRecord tok;
  tok.kind = "pretokenized";
  tok.vocab_size = 100000;
  tok.bos = -1;
  tok.eos = 0;
  auto w = DatasetWriter::Create(prefix, tok);
  EXPECT_TRUE(w.ok()) << w.status();
  Lcg rng;
  for (int i = 0; i < 500; ++i) {
    std::vector<uint32_t> doc(1 + rng.Next() % 300);
    for (uint32_t& t : doc) t = 1 + rng.Next() % 99999;
    doc.back() = 0;
    EXPECT_TRUE((*w)->Add(doc, 0).ok());
  }
  EXPECT_TRUE((*w)->Finish("").ok());
  return prefix;
}

// The sizes and digests the writer produced when it wrote through stdio
// (before it wrote through file::FileSystem): a change to how the files are
// written must not change a byte of them.
TEST(DatasetWriterTest, WritesTheSameBytesAsEver) {
  const Written byte = Digests(WriteByteCorpus());
  EXPECT_EQ(byte.bin_bytes, 1830800u);
  EXPECT_EQ(byte.idx_bytes, 24032u);
  EXPECT_EQ(byte.json_bytes, 759u);
  EXPECT_EQ(byte.bin_sha256, "c53e86538c48330199b2b8dcd1b8a3e4fe5963b3bc311320f0e6179c063a263a");
  EXPECT_EQ(byte.idx_sha256, "7d4d1a6b1ceab5df8548ff395c8220cd5ba4f5224ba2e0295dd778bc63e99c52");
  EXPECT_EQ(byte.json_sha256, "ca78249cd93ad321206ca3d8f1df488f676ea174c092917300f168b5e26f9554");

  const Written wide = Digests(WriteWideCorpus());
  EXPECT_EQ(wide.bin_bytes, 304440u);
  EXPECT_EQ(wide.idx_bytes, 4032u);
  EXPECT_EQ(wide.json_bytes, 691u);
  EXPECT_EQ(wide.bin_sha256, "8f899bd3fbbf44341686d85dc34cae3deb9d3185431cd2ec224af723ecf8bbe6");
  EXPECT_EQ(wide.idx_sha256, "a9299e40426a78bc0d53ad209a0f6f70f17e7f077d84b62813bd5a344c1309ee");
  EXPECT_EQ(wide.json_sha256, "a0d16fa1568d911800bf3d28d8cfb5d73da9b222667ca07dfb1353acf152ead2");
}

// A FileSystem that records the order in which files are committed.
class CommitOrderFileSystem final : public file::FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<file::AtomicFile>> NewAtomicFile(
      const std::string& path) override {
    auto f = file::Posix()->NewAtomicFile(path);
    if (!f.ok()) return f.status();
    return std::unique_ptr<file::AtomicFile>(new File(std::move(*f), path, &committed_));
  }
  absl::StatusOr<std::string> ReadAtMost(const std::string& path, size_t max_bytes) override {
    return file::Posix()->ReadAtMost(path, max_bytes);
  }
  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    return file::Posix()->FileSize(path);
  }
  const std::vector<std::string>& committed() const { return committed_; }

 private:
  class File final : public file::AtomicFile {
   public:
    File(std::unique_ptr<file::AtomicFile> base, std::string path, std::vector<std::string>* log)
        : base_(std::move(base)), path_(std::move(path)), log_(log) {}
    absl::Status Append(absl::string_view bytes) override { return base_->Append(bytes); }
    absl::Status WriteAt(uint64_t offset, absl::string_view bytes) override {
      return base_->WriteAt(offset, bytes);
    }
    absl::StatusOr<std::string> ReadAt(uint64_t offset, size_t n) override {
      return base_->ReadAt(offset, n);
    }
    absl::Status Commit() override {
      log_->push_back(path_.substr(path_.rfind('.')));
      return base_->Commit();
    }

   private:
    std::unique_ptr<file::AtomicFile> base_;
    std::string path_;
    std::vector<std::string>* log_;
  };
  std::vector<std::string> committed_;
};

TEST(DatasetWriterTest, CommitsTheJsonLast) {
  CommitOrderFileSystem fs;
  const std::string prefix = TempPrefix("train");
  auto w = DatasetWriter::Create(prefix, TokenizerRecord(), &fs);
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<uint16_t> t;
  ByteTokenizer::Encode("text", &t);
  ASSERT_TRUE((*w)->Add(t).ok());
  ASSERT_TRUE((*w)->Finish("").ok());
  EXPECT_THAT(fs.committed(), ElementsAre(".bin", ".idx", ".json"));
  EXPECT_TRUE(Dataset::Open(prefix, 0, &fs).ok());
}

bool AnyFileOf(const std::string& prefix) {
  for (const char* ext : {".bin", ".idx", ".json"}) {
    for (const char* tmp : {"", ".tmp"}) {
      if (std::filesystem::exists(prefix + ext + tmp)) return true;
    }
  }
  return false;
}

// Ten documents of no text (two tokens each): a .bin of 40 bytes, an .idx
// of 24 + 8 * 11 = 112.
absl::Status WriteSmall(const std::string& prefix, file::FileSystem* fs) {
  auto w = DatasetWriter::Create(prefix, TokenizerRecord(), fs);
  if (!w.ok()) return w.status();
  for (int i = 0; i < 10; ++i) {
    std::vector<uint16_t> t;
    ByteTokenizer::Encode("", &t);
    if (auto s = (*w)->Add(t); !s.ok()) return s;
  }
  return (*w)->Finish("");
}

// Each fault fails the writer with the fault's error and leaves no file.
TEST(DatasetWriterTest, AFailedWriteLeavesNoFile) {
  struct Case {
    const char* name;
    std::function<void(file::FaultInjectionFileSystem&)> inject;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"create", [](auto& fs) { fs.FailCreates(true); }, "creating"},
      {"append", [](auto& fs) { fs.FailAppendsAfter(30); }, "writing"},
      // The .bin's 40 bytes and the .idx's 112 go in; the header's
      // overwrite does not.
      {"header", [](auto& fs) { fs.FailAppendsAfter(112); }, "train.idx.tmp at 0 after 112"},
      {"read back", [](auto& fs) { fs.FailReads(true); }, "reading back"},
      {"commit", [](auto& fs) { fs.FailCommits(true); }, "renaming"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    file::FaultInjectionFileSystem fs(file::Posix());
    c.inject(fs);
    const std::string prefix = TempPrefix("train");
    absl::Status s = WriteSmall(prefix, &fs);
    EXPECT_THAT(s.message(), HasSubstr("injected fault"));
    EXPECT_THAT(s.message(), HasSubstr(c.message));
    EXPECT_FALSE(AnyFileOf(prefix));
    std::filesystem::remove_all(std::filesystem::path(prefix).parent_path());
  }
}

// A rewrite that fails leaves the dataset that was there, byte for byte.
TEST(DatasetWriterTest, AFailedRewriteLeavesTheOldDataset) {
  const std::string prefix = TempPrefix("train");
  ASSERT_TRUE(WriteSmall(prefix, file::Posix()).ok());
  std::vector<std::string> before;
  for (const char* ext : {".bin", ".idx", ".json"}) before.push_back(ReadFile(prefix + ext));
  file::FaultInjectionFileSystem fs(file::Posix());
  fs.FailCommits(true);
  EXPECT_FALSE(WriteSmall(prefix, &fs).ok());
  std::vector<std::string> after;
  for (const char* ext : {".bin", ".idx", ".json"}) after.push_back(ReadFile(prefix + ext));
  EXPECT_EQ(after, before);
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
  EXPECT_TRUE(Dataset::Open(prefix).ok());
}

// A document of a megabyte or more is appended at once, so its failure is
// the Add's: the writer ends there and its files are gone at once.
TEST(DatasetWriterTest, AFailedAddEndsTheWriter) {
  file::FaultInjectionFileSystem fs(file::Posix());
  fs.FailAppendsAfter(1000);
  const std::string prefix = TempPrefix("train");
  auto w = DatasetWriter::Create(prefix, TokenizerRecord(), &fs);
  ASSERT_TRUE(w.ok()) << w.status();
  const std::vector<uint16_t> big(1 << 20, 'a');
  absl::Status s = (*w)->Add(big);
  EXPECT_THAT(s.message(), HasSubstr("injected fault: writing " + prefix + ".bin.tmp"));
  EXPECT_FALSE(AnyFileOf(prefix));
  fs.FailAppendsAfter(-1);
  const std::vector<uint16_t> small = {256, 'a', 257};
  EXPECT_EQ((*w)->Add(small).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*w)->Finish("").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(AnyFileOf(prefix));
}

TEST(DatasetOpenTest, ReadsTheMetadataThroughTheFileSystem) {
  const std::string prefix = TempPrefix("train");
  ASSERT_TRUE(WriteSmall(prefix, file::Posix()).ok());
  file::FaultInjectionFileSystem fs(file::Posix());
  EXPECT_TRUE(Dataset::Open(prefix, 0, &fs).ok());
  fs.FailReads(true);
  auto ds = Dataset::Open(prefix, 0, &fs);
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(ds.status().message(), HasSubstr("injected fault"));
  EXPECT_THAT(ds.status().message(), HasSubstr(prefix + ".json"));
}

// The messages Open gave when it read the .json itself.
TEST(DatasetOpenTest, MetadataErrorsAreWordedAsEver) {
  const std::string prefix = TempPrefix("train");
  const std::string json = prefix + ".json";
  auto missing = Dataset::Open(prefix);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            json + ": no such file (write the dataset with tally-prep)");
  // A device is refused as a FIFO is, not read.
  std::filesystem::create_symlink("/dev/zero", json);
  auto device = Dataset::Open(prefix);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(device.status().message(), json + ": not a regular file");
  std::filesystem::remove(json);
  ASSERT_TRUE(WriteSmall(prefix, file::Posix()).ok());
  std::filesystem::resize_file(json, kMaxMetadataBytes + 1);
  auto huge = Dataset::Open(prefix);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(huge.status().message(),
            json + ": 8388609 bytes, more than the 8388608 a dataset's metadata may have; "
                   "re-run tally-prep to rebuild the dataset");
}

}  // namespace
}  // namespace tally::data
