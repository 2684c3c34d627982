#include "worker/train/checkpoint.h"

#include <openssl/evp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "absl/strings/escaping.h"
#include "tests/support/file/fault_injection_file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/train/checksum_file.h"

namespace tally::train {
namespace {

std::string TempDir() {
  char dir[] = "/tmp/tally_ckpt_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  return dir;
}

TEST(CheckpointTest, RoundTripsTensorsAndMetadata) {
  const std::string path = TempDir() + "/a.ckpt";
  CheckpointData data;
  data.metadata_json = R"({"step": 7})";
  data.tensors = {{"w", at::randn({3, 4})}, {"i", at::arange(5, at::kLong)},
                  {"scalar", at::tensor(2.5)}};
  auto sha = WriteCheckpoint(path, data);
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(sha->size(), 64u);
  auto back = ReadCheckpoint(path, *sha);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->metadata_json, data.metadata_json);
  ASSERT_EQ(back->tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back->tensors[i].first, data.tensors[i].first);
    EXPECT_TRUE(at::equal(back->tensors[i].second, data.tensors[i].second));
  }
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// SHA-256 by OpenSSL's one-shot digest, independent of the checkpoint code.
std::string Sha256Hex(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr), 1);
  return absl::BytesToHexString(std::string(reinterpret_cast<char*>(md), len));
}

// A file whose trailer is recomputed after `edit`, so it passes the
// integrity check and only the layout checks can catch it.
void EditAndReseal(const std::string& path, const std::function<void(std::string*)>& edit) {
  std::string bytes = ReadBytes(path);
  bytes.resize(bytes.size() - 32);
  edit(&bytes);
  WriteBytes(path, bytes + absl::HexStringToBytes(Sha256Hex(bytes)));
}

TEST(CheckpointTest, TheReportedHashIsTheWholeFilesSha256) {
  const std::string path = TempDir() + "/a.ckpt";
  CheckpointData data;
  data.metadata_json = R"({"step": 3})";
  data.tensors = {{"w", at::randn({5, 2})}};
  auto sha = WriteCheckpoint(path, data);
  ASSERT_TRUE(sha.ok()) << sha.status();
  const std::string bytes = ReadBytes(path);
  EXPECT_EQ(*sha, Sha256Hex(bytes));
  // And what an operator runs agrees.
  FILE* p = ::popen(("sha256sum " + path).c_str(), "r");
  ASSERT_NE(p, nullptr);
  char line[256] = {};
  ASSERT_NE(std::fgets(line, sizeof(line), p), nullptr);
  ::pclose(p);
  EXPECT_EQ(std::string(line).substr(0, 64), *sha);
  EXPECT_TRUE(ReadCheckpoint(path, *sha).ok());
  // A record made before the whole-file hash holds the trailer's digest.
  const std::string legacy = absl::BytesToHexString(bytes.substr(bytes.size() - 32));
  EXPECT_NE(legacy, *sha);
  EXPECT_TRUE(ReadCheckpoint(path, legacy).ok());
}

TEST(CheckpointTest, LayoutErrorsAreDataLossNotCrashes) {
  CheckpointData data;
  data.metadata_json = "{}";
  data.tensors = {{"w", at::ones({4, 2})}};
  // Offsets in the file: 8 magic + 4 version + 8 length + 2 metadata + 8
  // count, then the tensor: 4 name length, 1 name, 1 dtype, 4 ndim, 2 x 8
  // sizes, 8 byte count, data.
  const size_t tensor_at = 8 + 4 + 8 + 2 + 8;
  const size_t dtype_at = tensor_at + 4 + 1;
  const size_t sizes_at = dtype_at + 1 + 4;
  const struct {
    std::string name;
    std::function<void(std::string*)> edit;
    std::string want;
  } cases[] = {
      {"unknown dtype", [&](std::string* b) { (*b)[dtype_at] = 99; }, "unknown dtype 99"},
      {"shape too large",
       [&](std::string* b) {
         const int64_t huge = int64_t{1} << 40;
         std::memcpy(&(*b)[sizes_at], &huge, 8);
       },
       "bad tensor shape of w"},
      {"shape larger than its bytes",
       [&](std::string* b) {
         const int64_t big = int64_t{1} << 20;
         std::memcpy(&(*b)[sizes_at], &big, 8);
         std::memcpy(&(*b)[sizes_at + 8], &big, 8);
         b->append(std::string(size_t{1} << 21, '\0'));  // a file long enough for each size
       },
       "size does not match its shape"},
      {"bytes left over", [&](std::string* b) { b->append("xx"); }, "2 bytes after the last tensor"},
      {"repeated name",
       [&](std::string* b) {
         const uint64_t two = 2;
         std::memcpy(&(*b)[tensor_at - 8], &two, 8);
         b->append(b->substr(tensor_at));
       },
       "appears twice"},
  };
  for (const auto& c : cases) {
    const std::string path = TempDir() + "/a.ckpt";
    ASSERT_TRUE(WriteCheckpoint(path, data).ok());
    ASSERT_TRUE(ReadCheckpoint(path, "").ok());
    EditAndReseal(path, c.edit);
    auto back = ReadCheckpoint(path, "");
    EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss) << c.name << ": " << back.status();
    EXPECT_NE(back.status().message().find(c.want), std::string::npos)
        << c.name << ": " << back.status();
  }
}

TEST(CheckpointTest, CorruptionAndWrongChecksumAreDataLoss) {
  const std::string path = TempDir() + "/a.ckpt";
  CheckpointData data;
  data.metadata_json = "{}";
  data.tensors = {{"w", at::ones({64})}};
  auto sha = WriteCheckpoint(path, data);
  ASSERT_TRUE(sha.ok());
  EXPECT_EQ(ReadCheckpoint(path, std::string(64, '0')).status().code(),
            absl::StatusCode::kDataLoss);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  auto bad = ReadCheckpoint(path, "");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(bad.status().message().find("checksum mismatch"), std::string::npos);
  EXPECT_EQ(ReadCheckpoint(path + ".missing", "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, NeverWritesThroughASymlinkAtItsTemporaryFile) {
  const std::string dir = TempDir();
  const std::string victim = dir + "/victim";
  WriteBytes(victim, "keep me");
  // A link planted where the writer puts its temporary file.
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/a.ckpt.tmp").c_str()), 0);
  CheckpointData data;
  data.metadata_json = R"({"step": 1})";
  data.tensors = {{"w", at::ones({2})}};
  auto sha = WriteCheckpoint(dir + "/a.ckpt", data);
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(ReadBytes(victim), "keep me");
  EXPECT_TRUE(ReadCheckpoint(dir + "/a.ckpt", *sha).ok());
  // A link at the checkpoint's own path is replaced, not written through.
  ASSERT_EQ(::symlink(victim.c_str(), (dir + "/b.ckpt").c_str()), 0);
  ASSERT_TRUE(WriteCheckpoint(dir + "/b.ckpt", data).ok());
  EXPECT_EQ(ReadBytes(victim), "keep me");
  EXPECT_TRUE(std::filesystem::is_regular_file(
      std::filesystem::symlink_status(dir + "/b.ckpt")));
}

// A write that fails anywhere (a full disk mid-tensor, a failed rename)
// leaves the checkpoint that was there, readable, and no temporary file.
TEST(CheckpointTest, AFailedWriteLeavesThePreviousCheckpoint) {
  const std::string dir = TempDir();
  const std::string path = dir + "/step.ckpt";
  CheckpointData old;
  old.metadata_json = R"({"step": 1})";
  old.tensors = {{"w", at::ones({4})}};
  auto old_sha = WriteCheckpoint(path, old);
  ASSERT_TRUE(old_sha.ok());
  CheckpointData next = old;
  next.metadata_json = R"({"step": 2})";
  next.tensors = {{"w", at::zeros({1000})}};
  file::FaultInjectionFileSystem faulty(file::Posix());
  for (int64_t after : {0, 10, 100, 2000}) {
    faulty.FailAppendsAfter(after);
    auto sha = WriteCheckpoint(path, next, &faulty);
    EXPECT_FALSE(sha.ok()) << "after " << after;
    EXPECT_THAT(std::string(sha.status().message()), ::testing::HasSubstr("injected fault"));
    EXPECT_TRUE(ReadCheckpoint(path, *old_sha).ok());
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  }
  faulty.FailAppendsAfter(-1);
  faulty.FailCommits(true);
  EXPECT_FALSE(WriteCheckpoint(path, next, &faulty).ok());
  EXPECT_TRUE(ReadCheckpoint(path, *old_sha).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  faulty.FailCommits(false);
  auto sha = WriteCheckpoint(path, next, &faulty);
  ASSERT_TRUE(sha.ok()) << sha.status();
  EXPECT_EQ(ReadCheckpoint(path, *sha)->metadata_json, next.metadata_json);
}

TEST(CheckpointTest, AMissingFileIsNotFoundAndAnUnopenableOneIsNot) {
  const std::string dir = TempDir();
  auto missing = ReadCheckpoint(dir + "/none.ckpt", "");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), ::testing::HasSubstr("none.ckpt"));
  auto in_missing_folder = ReadCheckpoint(dir + "/gone/none.ckpt", "");
  EXPECT_EQ(in_missing_folder.status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointTest, ReportedPathsAreResolvedAndConfinedToARealFolder) {
  const std::string dir = TempDir();
  const std::string real = std::filesystem::canonical(dir).string();
  std::filesystem::create_directories(dir + "/root/job-1");
  std::filesystem::create_directories(dir + "/root/x");
  WriteBytes(dir + "/root/job-1/step-00000001.ckpt", "x");
  // "." and ".." and a symlinked folder above the job's folder resolve.
  std::filesystem::create_directory_symlink(dir + "/root", dir + "/root-link");
  for (const std::string& given :
       {dir + "/root/job-1", dir + "/root/./x/../job-1", dir + "/root-link/job-1"}) {
    SCOPED_TRACE(given);
    auto path = ResolvedCheckpointPath(given, "step-00000001.ckpt");
    ASSERT_TRUE(path.ok()) << path.status();
    EXPECT_EQ(*path, real + "/root/job-1/step-00000001.ckpt");
  }
  // The job's folder itself a symlink (here into another job's folder).
  std::filesystem::create_directories(dir + "/root/job-2");
  std::filesystem::create_directory_symlink(dir + "/root/job-2", dir + "/root/job-3");
  absl::Status s = CheckCheckpointFolder(dir + "/root/job-3");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("is a symlink"));
  EXPECT_EQ(ResolvedCheckpointPath(dir + "/root/job-3", "step-00000001.ckpt").status().code(),
            absl::StatusCode::kFailedPrecondition);
  // The checkpoint a symlink (to /etc/passwd, say).
  ASSERT_EQ(::symlink("/etc/passwd", (dir + "/root/job-1/step-00000002.ckpt").c_str()), 0);
  auto link = ResolvedCheckpointPath(dir + "/root/job-1", "step-00000002.ckpt");
  EXPECT_EQ(link.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(link.status().message()), ::testing::HasSubstr("(it is a symlink)"));
  EXPECT_FALSE(ResolvedCheckpointPath(dir + "/root/job-1", "../job-2/x").ok());
  // With a root: the folder must resolve directly inside it.
  EXPECT_TRUE(CheckCheckpointFolder(dir + "/root-link/job-1", dir + "/root").ok());
  EXPECT_TRUE(CheckCheckpointFolder(dir + "/root/job-1", dir + "/root-link").ok());
  std::filesystem::create_directories(dir + "/elsewhere/job-1");
  for (const std::string& outside : {dir + "/elsewhere/job-1", dir + "/root"}) {
    SCOPED_TRACE(outside);
    s = CheckCheckpointFolder(outside, dir + "/root");
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr("not a folder directly in the checkpoint root"));
  }
  EXPECT_FALSE(
      ResolvedCheckpointPath(dir + "/elsewhere/job-1", "step-00000001.ckpt", dir + "/root").ok());
  EXPECT_FALSE(ResolvedCheckpointPath(dir + "/root/job-1", "absent.ckpt").ok());
}

TEST(ChecksumFileTest, RoundTripsInSha256sumsFormat) {
  const std::string dir = TempDir();
  const std::string ckpt = dir + "/step-00000004.ckpt";
  CheckpointData data;
  data.metadata_json = R"({"step": 4})";
  data.tensors = {{"w", at::ones({3})}};
  auto sha = WriteCheckpoint(ckpt, data);
  ASSERT_TRUE(sha.ok());
  ASSERT_TRUE(WriteChecksumFile(ckpt, *sha).ok());
  EXPECT_EQ(ChecksumFilePath(ckpt), ckpt + ".sha256");
  EXPECT_EQ(ReadBytes(ckpt + ".sha256"), *sha + "  step-00000004.ckpt\n");
  auto back = ReadChecksumFile(ckpt);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *sha);
  // sha256sum -c agrees from the folder.
  const std::string cmd = "cd " + dir + " && sha256sum -c --status step-00000004.ckpt.sha256";
  EXPECT_EQ(std::system(cmd.c_str()), 0);

  EXPECT_EQ(ReadChecksumFile(dir + "/other.ckpt").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteChecksumFile(ckpt, "not hex").code(), absl::StatusCode::kInvalidArgument);
  for (const std::string& bad :
       {std::string("zz\n"), *sha + "  another.ckpt\n", *sha + "  step-00000004.ckpt\nmore",
        *sha + " step-00000004.ckpt\n"}) {
    SCOPED_TRACE(bad);
    WriteBytes(ckpt + ".sha256", bad);
    auto r = ReadChecksumFile(ckpt);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr(ckpt + ".sha256"));
  }
}

}  // namespace
}  // namespace tally::train
