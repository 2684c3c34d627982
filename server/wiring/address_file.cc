#include "server/wiring/address_file.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"

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
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text << "\n";
    out.flush();
    if (!out) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--address_file: cannot write ", tmp, " (does its directory exist and is it writable?)"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    return absl::FailedPreconditionError(
        absl::StrCat("--address_file: cannot rename ", tmp, " to ", path, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace tally::wiring
