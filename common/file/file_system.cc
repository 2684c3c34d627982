#include "common/file/file_system.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace tally::file {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

class PosixAtomicFile final : public AtomicFile {
 public:
  PosixAtomicFile(std::string path, std::string tmp, int fd)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd) {}
  ~PosixAtomicFile() override {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(tmp_.c_str());
  }

  absl::Status Append(absl::string_view bytes) override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(tmp_, " is closed"));
    const char* p = bytes.data();
    size_t n = bytes.size();
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Errno("writing " + tmp_);
      p += w;
      n -= static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  absl::Status Commit() override {
    if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(tmp_, " is closed"));
    if (::fsync(fd_) != 0) return Errno("writing " + tmp_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return Errno("closing " + tmp_);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) return Errno("renaming " + tmp_);
    committed_ = true;
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
    return absl::OkStatus();
  }

 private:
  const std::string path_, tmp_;
  int fd_;
  bool committed_ = false;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<AtomicFile>> NewAtomicFile(const std::string& path) override {
    const std::string tmp = path + ".tmp";
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return Errno("removing " + tmp);
    const int fd =
        ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("creating " + tmp);
    return std::unique_ptr<AtomicFile>(new PosixAtomicFile(path, tmp, fd));
  }

  absl::StatusOr<std::string> ReadAtMost(const std::string& path, size_t max_bytes) override {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
    return file::ReadAtMost(in, max_bytes);
  }
};

}  // namespace

FileSystem* Posix() {
  static PosixFileSystem* fs = new PosixFileSystem;
  return fs;
}

absl::StatusOr<std::string> ReadAtMost(std::istream& in, size_t max_bytes) {
  std::string text;
  char buf[16384];
  while (text.size() <= max_bytes && in) {
    in.read(buf, static_cast<std::streamsize>(std::min(sizeof(buf), max_bytes + 1 - text.size())));
    text.append(buf, static_cast<size_t>(in.gcount()));
  }
  if (in.bad()) return absl::InternalError("cannot be read");
  return text;
}

}  // namespace tally::file
