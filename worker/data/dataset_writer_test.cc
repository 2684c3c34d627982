// DatasetWriter's files, byte for byte, and what it leaves when the disk
// fails under it.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"

namespace tally::data {
namespace {

std::string TempPrefix(const std::string& name) {
  char dir[] = "/tmp/tally_data_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return std::string(dir) + "/" + name;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

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

}  // namespace
}  // namespace tally::data
