#include "server/wiring/address_file.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/file/file_system.h"

namespace tally::wiring {

absl::Status CheckAddressFile(const std::string& path) {
  const std::string tmp = path + ".tmp";
  if (!std::ofstream(tmp, std::ios::trunc)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--address_file: cannot write ", tmp, " (does its directory exist and is it writable?)"));
  }
  std::error_code ec;
  std::filesystem::remove(tmp, ec);
  return absl::OkStatus();
}

absl::Status WriteAddressFile(const std::string& path, const std::string& text) {
  // Through the file seam: a reader sees the old file or the whole new one,
  // and it survives a crash once written.
  absl::StatusOr<std::unique_ptr<file::AtomicFile>> out = file::Posix()->NewAtomicFile(path);
  if (!out.ok() || !(*out)->Append(text + "\n").ok()) {
    return absl::FailedPreconditionError(absl::StrCat("--address_file: cannot write ", path,
                                                      ".tmp (does its directory exist and is "
                                                      "it writable?)"));
  }
  if (absl::Status s = (*out)->Commit(); !s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--address_file: cannot replace ", path, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace tally::wiring
