#include "common/file/file_system.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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
    if (fd_ < 0) return Closed();
    const char* p = bytes.data();
    size_t n = bytes.size();
    while (n > 0) {
      const ssize_t w = ::write(fd_, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Errno("writing " + tmp_);
      p += w;
      n -= static_cast<size_t>(w);
      size_ += static_cast<uint64_t>(w);
    }
    return absl::OkStatus();
  }

  absl::Status WriteAt(uint64_t offset, absl::string_view bytes) override {
    if (fd_ < 0) return Closed();
    if (offset > size_ || bytes.size() > size_ - offset) {
      return absl::OutOfRangeError(absl::StrCat("writing ", tmp_, ": ", bytes.size(), " bytes at ",
                                                offset, " pass its end at ", size_));
    }
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t w = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                                 static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return Errno("writing " + tmp_);
      done += static_cast<size_t>(w);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> ReadAt(uint64_t offset, size_t n) override {
    if (fd_ < 0) return Closed();
    std::string out(offset < size_ ? std::min<uint64_t>(n, size_ - offset) : 0, '\0');
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t r =
          ::pread(fd_, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) return Errno("reading back " + tmp_);
      if (r == 0) break;  // truncated behind our back
      done += static_cast<size_t>(r);
    }
    out.resize(done);
    return out;
  }

  absl::Status Commit() override {
    if (fd_ < 0) return Closed();
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
  absl::Status Closed() const {
    return absl::FailedPreconditionError(absl::StrCat(tmp_, " is closed"));
  }

  const std::string path_, tmp_;
  int fd_;
  uint64_t size_ = 0;  // bytes appended
  bool committed_ = false;
};

// Opens `path` with `flags` and stats it: the descriptor (the caller closes
// it), NotFound "PATH: no such file", or Internal naming the step.
absl::StatusOr<int> OpenAndStat(const std::string& path, int flags, struct stat* st) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return Errno("opening " + path);
  }
  if (::fstat(fd, st) != 0) {
    absl::Status s = Errno("stat " + path);
    ::close(fd);
    return s;
  }
  return fd;
}

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<AtomicFile>> NewAtomicFile(const std::string& path) override {
    const std::string tmp = path + ".tmp";
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return Errno("removing " + tmp);
    // Read-write: ReadAt reads back what was written.
    const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("creating " + tmp);
    return std::unique_ptr<AtomicFile>(new PosixAtomicFile(path, tmp, fd));
  }

  absl::StatusOr<std::string> ReadAtMost(const std::string& path, size_t max_bytes) override {
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, and
    // reading a terminal for a line.
    struct stat st;
    absl::StatusOr<int> opened = OpenAndStat(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, &st);
    if (!opened.ok()) return opened.status();
    const int fd = *opened;
    if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
      ::close(fd);
      return NotRegular(path);
    }
    std::string text;
    char buf[16384];
    while (text.size() <= max_bytes) {
      const ssize_t n = ::read(fd, buf, std::min(sizeof(buf), max_bytes + 1 - text.size()));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        absl::Status s = Errno("reading " + path);
        ::close(fd);
        return s;
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    ::close(fd);
    return text;
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    // O_PATH: the file is found, not opened for reading, so a FIFO does not
    // wait for a writer and a file without read permission is still sized
    // (ReadAtMost then says why it cannot be read).
    struct stat st;
    absl::StatusOr<int> opened = OpenAndStat(path, O_PATH | O_CLOEXEC, &st);
    if (!opened.ok()) return opened.status();
    ::close(*opened);
    if (!S_ISREG(st.st_mode)) return NotRegular(path);
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  static absl::Status NotRegular(const std::string& path) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
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
