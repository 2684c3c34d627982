#include "worker/train/checksum_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file/file_system.h"

namespace tally::train {
namespace {

std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

std::string ChecksumFilePath(const std::string& checkpoint_path) {
  return checkpoint_path + ".sha256";
}

bool IsSha256Hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

absl::Status WriteChecksumFile(const std::string& checkpoint_path, const std::string& sha256_hex) {
  if (!IsSha256Hex(sha256_hex)) {
    return absl::InvalidArgumentError(
        absl::StrCat("SHA-256 \"", sha256_hex.substr(0, 80), "\" is not 64 lower-case hex digits"));
  }
  const std::string path = ChecksumFilePath(checkpoint_path);
  const std::string line = absl::StrCat(sha256_hex, "  ", BaseName(checkpoint_path), "\n");
  // A stale temporary file (or a link planted in its place) goes first: the
  // new one is created, never opened through a link (file/file_system.h).
  auto out = file::Posix()->NewAtomicFile(path);
  if (!out.ok()) return out.status();
  if (absl::Status s = (*out)->Append(line); !s.ok()) return s;
  return (*out)->Commit();
}

absl::StatusOr<std::string> ReadChecksumFile(const std::string& checkpoint_path) {
  const std::string path = ChecksumFilePath(checkpoint_path);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return Errno("opening " + path);
  }
  // One line of a known length: read a little more to see that there is
  // nothing else.
  const std::string want_name = BaseName(checkpoint_path);
  const size_t want = 64 + 2 + want_name.size() + 1;
  std::string text(want + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = Errno("reading " + path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  const std::string hex = text.substr(0, 64);
  if (got != want || !IsSha256Hex(hex) || text.compare(64, 2, "  ") != 0 ||
      text.compare(66, want_name.size(), want_name) != 0 || text.back() != '\n') {
    return absl::DataLossError(absl::StrCat(path, ": not a SHA-256 line for ", want_name,
                                            " (expected 64 lower-case hex digits, two "
                                            "spaces and \"",
                                            want_name, "\", as sha256sum prints)"));
  }
  return hex;
}

}  // namespace tally::train
