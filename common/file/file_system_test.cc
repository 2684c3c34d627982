#include "common/file/file_system.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/support/file/fault_injection_file_system.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::file {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tally_file_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void Write(const std::string& path, const std::string& text) {
    std::ofstream(path, std::ios::binary) << text;
  }
  fs::path dir_;
};

TEST_F(FileSystemTest, AnAtomicFileAppearsWholeOnlyAtCommit) {
  const std::string path = Path("a.bin");
  Write(path, "old");
  auto f = Posix()->NewAtomicFile(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("new ").ok());
  ASSERT_TRUE((*f)->Append("contents").ok());
  EXPECT_EQ(Read(path), "old");  // not yet
  EXPECT_TRUE(fs::exists(path + ".tmp"));
  ASSERT_TRUE((*f)->Commit().ok());
  EXPECT_EQ(Read(path), "new contents");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

TEST_F(FileSystemTest, AnUncommittedFileLeavesNothing) {
  const std::string path = Path("b.bin");
  Write(path, "old");
  {
    auto f = Posix()->NewAtomicFile(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append("half").ok());
  }
  EXPECT_EQ(Read(path), "old");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

// A link planted at PATH.tmp is removed, never written through; a link at
// PATH is replaced, its target untouched.
TEST_F(FileSystemTest, NeverWritesThroughALink) {
  const std::string target = Path("target"), path = Path("c.bin");
  Write(target, "precious");
  fs::create_symlink(target, path + ".tmp");
  fs::create_symlink(target, path);
  auto f = Posix()->NewAtomicFile(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("x").ok());
  ASSERT_TRUE((*f)->Commit().ok());
  EXPECT_EQ(Read(target), "precious");
  EXPECT_FALSE(fs::is_symlink(path));
  EXPECT_EQ(Read(path), "x");
}

TEST_F(FileSystemTest, ErrorsNameTheFile) {
  auto f = Posix()->NewAtomicFile(Path("no/such/folder/d.bin"));
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr("creating " + Path("no/such/folder/d.bin.tmp")));
  auto r = Posix()->ReadAtMost(Path("absent"), 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr(Path("absent")));
}

TEST_F(FileSystemTest, ReadAtMostStopsOneBytePastTheLimit) {
  const std::string path = Path("e.txt");
  Write(path, std::string(100, 'a'));
  EXPECT_EQ(Posix()->ReadAtMost(path, 100)->size(), 100u);
  EXPECT_EQ(Posix()->ReadAtMost(path, 99)->size(), 100u);  // longer than allowed
  EXPECT_EQ(Posix()->ReadAtMost(path, 10)->size(), 11u);
  // An endless file is not read to its end.
  EXPECT_EQ(Posix()->ReadAtMost("/dev/zero", 1 << 20)->size(), (1u << 20) + 1);
  std::istringstream in("hello");
  EXPECT_EQ(*ReadAtMost(in, 64), "hello");
}

TEST_F(FileSystemTest, InjectedFaultsLeaveTheOldFile) {
  const std::string path = Path("f.bin");
  Write(path, "old");
  FaultInjectionFileSystem faulty(Posix());
  faulty.FailAppendsAfter(4);
  {
    auto f = faulty.NewAtomicFile(path);
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE((*f)->Append("1234").ok());
    absl::Status s = (*f)->Append("5");
    EXPECT_THAT(s.message(), HasSubstr("injected fault: writing " + path + ".tmp after 4 bytes"));
  }
  EXPECT_EQ(Read(path), "old");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  faulty.FailAppendsAfter(-1);
  faulty.FailCommits(true);
  {
    auto f = faulty.NewAtomicFile(path);
    ASSERT_TRUE(f.ok());
    EXPECT_TRUE((*f)->Append("new").ok());
    EXPECT_FALSE((*f)->Commit().ok());
  }
  EXPECT_EQ(Read(path), "old");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  faulty.FailCreates(true);
  EXPECT_FALSE(faulty.NewAtomicFile(path).ok());
  faulty.FailReads(true);
  EXPECT_FALSE(faulty.ReadAtMost(path, 10).ok());
}

// A header learnt at the end: appended as a placeholder, overwritten in
// place, read back before Commit; the file never grows by a WriteAt.
TEST_F(FileSystemTest, WriteAtOverwritesAndReadAtReadsBack) {
  const std::string path = Path("g.idx");
  auto f = Posix()->NewAtomicFile(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_TRUE((*f)->Append("0000body").ok());
  ASSERT_TRUE((*f)->WriteAt(0, "HEAD").ok());
  ASSERT_TRUE((*f)->WriteAt(6, "dY").ok());
  EXPECT_EQ(*(*f)->ReadAt(0, 100), "HEADbodY");
  EXPECT_EQ(*(*f)->ReadAt(3, 2), "Db");
  EXPECT_EQ(*(*f)->ReadAt(8, 4), "");
  EXPECT_EQ(*(*f)->ReadAt(100, 4), "");
  absl::Status past = (*f)->WriteAt(6, "XYZ");
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
  EXPECT_THAT(past.message(), HasSubstr(path + ".tmp"));
  EXPECT_EQ((*f)->WriteAt(9, "").code(), absl::StatusCode::kOutOfRange);
  ASSERT_TRUE((*f)->Append("+").ok());
  ASSERT_TRUE((*f)->WriteAt(8, "!").ok());  // what was appended since
  ASSERT_TRUE((*f)->Commit().ok());
  EXPECT_EQ(Read(path), "HEADbodY!");
  EXPECT_EQ((*f)->WriteAt(0, "x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*f)->ReadAt(0, 1).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(FileSystemTest, FileSizeIsForRegularFilesOnly) {
  const std::string path = Path("h.json");
  Write(path, std::string(123, 'a'));
  EXPECT_EQ(*Posix()->FileSize(path), 123u);
  const std::string link = Path("link");
  fs::create_symlink(path, link);
  EXPECT_EQ(*Posix()->FileSize(link), 123u);
  auto absent = Posix()->FileSize(Path("absent"));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr(Path("absent")));
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& other : {fifo, std::string("/dev/zero"), dir_.string()}) {
    auto size = Posix()->FileSize(other);
    EXPECT_EQ(size.status().code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_EQ(size.status().message(), other + ": not a regular file");
  }
}

// A FIFO with no writer would block an ordinary open forever (the test would
// hang); ReadAtMost refuses it at once.
TEST_F(FileSystemTest, ReadAtMostRefusesAFifoWithoutBlocking) {
  const std::string fifo = Path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto r = Posix()->ReadAtMost(fifo, 10);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), fifo + ": not a regular file");
  EXPECT_EQ(*Posix()->ReadAtMost("/dev/null", 10), "");  // a device is read
}

TEST_F(FileSystemTest, InjectedFaultsCoverWriteAtReadAtAndFileSize) {
  const std::string path = Path("i.idx");
  FaultInjectionFileSystem faulty(Posix());
  faulty.FailAppendsAfter(6);
  {
    auto f = faulty.NewAtomicFile(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append("0000").ok());
    ASSERT_TRUE((*f)->WriteAt(0, "AB").ok());  // 6 bytes written in all
    absl::Status s = (*f)->WriteAt(2, "C");
    EXPECT_THAT(s.message(), HasSubstr("injected fault: writing " + path + ".tmp at 2 after 6"));
    EXPECT_EQ(*(*f)->ReadAt(0, 4), "AB00");
    faulty.FailReads(true);
    EXPECT_THAT((*f)->ReadAt(0, 4).status().message(),
                HasSubstr("injected fault: reading back " + path + ".tmp"));
  }
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  Write(path, "x");
  EXPECT_FALSE(faulty.FileSize(path).ok());
  faulty.FailReads(false);
  EXPECT_EQ(*faulty.FileSize(path), 1u);
}

}  // namespace
}  // namespace tally::file
