#include "server/ha/dsn.h"

#include <libpq-fe.h>

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tally::ha {
namespace {

absl::StatusOr<std::string> FindDsn(const DsnSources& sources) {
  if (!sources.flag.empty() && !sources.file_flag.empty()) {
    return absl::InvalidArgumentError(
        "--postgres_dsn and --postgres_dsn_file: give one of them, not both");
  }
  if (!sources.flag.empty()) return sources.flag;
  if (!sources.file_flag.empty()) {
    std::error_code ec;
    if (std::filesystem::is_directory(sources.file_flag, ec)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--postgres_dsn_file: ", sources.file_flag,
                       " is a folder; name the file in it that holds the connection string "
                       "(a Secret mounted as a folder has one file per key, e.g. .../dsn)"));
    }
    std::ifstream in(sources.file_flag, std::ios::binary);
    if (!in) {
      return absl::NotFoundError(absl::StrCat("--postgres_dsn_file: cannot read ",
                                              sources.file_flag,
                                              " (does it exist and is it readable?)"));
    }
    // A connection string is short: read a bounded amount, so a wrong path
    // (a device, a log) fails at once instead of filling memory.
    constexpr size_t kMaxBytes = 64 * 1024;
    std::string text(kMaxBytes + 1, '\0');
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxBytes) {
      return absl::FailedPreconditionError(
          absl::StrCat("--postgres_dsn_file: ", sources.file_flag, " holds more than ",
                       kMaxBytes, " bytes; it should hold only a libpq connection string"));
    }
    std::string dsn(absl::StripTrailingAsciiWhitespace(text));
    if (dsn.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--postgres_dsn_file: ", sources.file_flag,
          " is empty; it should hold a libpq connection string such as "
          "\"host=db port=5432 dbname=tally user=tally password=...\""));
    }
    return dsn;
  }
  if (!sources.env.empty()) return sources.env;
  return absl::InvalidArgumentError(
      "--store=postgres needs a connection string: pass --postgres_dsn=DSN, set "
      "$TALLY_POSTGRES_DSN, or pass --postgres_dsn_file=PATH (e.g. a mounted Secret); DSN "
      "is a libpq string such as \"host=db port=5432 dbname=tally user=tally\" or "
      "postgresql://tally@db:5432/tally");
}

}  // namespace

absl::StatusOr<std::string> ResolveDsn(const DsnSources& sources) {
  absl::StatusOr<std::string> dsn = FindDsn(sources);
  if (!dsn.ok()) return dsn;
  // Parsed now, so a typo fails tallyd at start (exit 2) instead of leaving it
  // retrying a connection that can never succeed. libpq's message names the
  // keyword, never a value.
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(dsn->c_str(), &error);
  if (options != nullptr) {
    PQconninfoFree(options);
    return dsn;
  }
  std::string why = error != nullptr ? error : "out of memory";
  if (error != nullptr) PQfreemem(error);
  while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
  const char* from = !sources.flag.empty()        ? "--postgres_dsn"
                     : !sources.file_flag.empty() ? "--postgres_dsn_file"
                                                  : "$TALLY_POSTGRES_DSN";
  return absl::InvalidArgumentError(absl::StrCat(
      from, ": not a libpq connection string (", why,
      "); write it as \"host=db port=5432 dbname=tally user=tally password=...\" or "
      "postgresql://tally@db:5432/tally"));
}

std::string RedactDsn(const std::string& dsn) {
  char* error = nullptr;
  PQconninfoOption* options = PQconninfoParse(dsn.c_str(), &error);
  if (options == nullptr) {
    if (error != nullptr) PQfreemem(error);
    return "(unparsable DSN)";
  }
  std::vector<std::string> parts;
  for (const char* key : {"host", "hostaddr", "port", "dbname", "user", "sslmode"}) {
    for (PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
      if (o->val != nullptr && *o->val != '\0' && std::string(o->keyword) == key) {
        parts.push_back(absl::StrCat(key, "=", o->val));
      }
    }
  }
  PQconninfoFree(options);
  if (parts.empty()) return "(defaults)";
  return absl::StrJoin(parts, " ");
}

}  // namespace tally::ha
