#include "cli/tallyctl/tokens.h"

#include <openssl/rand.h>
#include <openssl/sha.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"

namespace tally::cli {
namespace {

// Words YAML 1.1 or 1.2 reads as something other than a string.
bool IsYamlKeyword(absl::string_view word) {
  static constexpr const char* kKeywords[] = {"null", "true", "false", "yes", "no", "on",
                                              "off",  "y",    "n",     "nan", "inf"};
  const std::string lower = absl::AsciiStrToLower(word);
  for (const char* k : kKeywords) {
    if (lower == k) return true;
  }
  return false;
}

absl::Status CheckWord(absl::string_view flag, absl::string_view value) {
  const std::string rule =
      "a letter or digit, then letters, digits, '.', '_', '-' or '@', at most 128 "
      "characters";
  if (value.size() > 128 || !absl::ascii_isalnum(static_cast<unsigned char>(value[0]))) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": \"",
                                                   EscapeUnprintable(value.substr(0, 140)),
                                                   "\" is not a valid name; use ", rule));
  }
  for (unsigned char c : value) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-' && c != '@') {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": \"", EscapeUnprintable(value), "\" has the character \"",
                       EscapeUnprintable(absl::string_view(reinterpret_cast<const char*>(&c), 1)),
                       "\"; use ", rule));
    }
  }
  double number;
  if (IsYamlKeyword(value) || absl::SimpleAtod(value, &number) ||
      absl::StartsWithIgnoreCase(value, "0x") || absl::StartsWithIgnoreCase(value, "0o")) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": \"", value, "\" reads as a YAML keyword or number, not a name; choose another"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string TokenFromBytes(absl::string_view bytes) { return absl::BytesToHexString(bytes); }

absl::StatusOr<std::string> NewToken() {
  unsigned char bytes[kTokenRandomBytes];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    return absl::InternalError(
        "the system's random number generator failed; no token was made, try again");
  }
  std::string token =
      TokenFromBytes(absl::string_view(reinterpret_cast<const char*>(bytes), sizeof bytes));
  OPENSSL_cleanse(bytes, sizeof bytes);
  return token;
}

std::string TokenSha256Hex(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof digest));
}

absl::Status ValidateTokenEntry(const TokenEntry& entry) {
  if (entry.role != "admin" && entry.role != "user" && entry.role != "viewer" &&
      entry.role != "worker") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--role: ",
        entry.role.empty() ? std::string("is required")
                           : absl::StrCat("\"", EscapeUnprintable(entry.role), "\" is not a role"),
        "; use admin, user, viewer or worker"));
  }
  if (entry.name.empty()) {
    return absl::InvalidArgumentError(
        "--name: is required; give the principal the token speaks for, e.g. --name=alice");
  }
  if (absl::Status s = CheckWord("--name", entry.name); !s.ok()) return s;
  if (entry.role == "worker" && !entry.tenant.empty()) {
    return absl::InvalidArgumentError(
        "--tenant: a worker has no tenant (it runs every tenant's jobs); drop --tenant");
  }
  if (entry.tenant.empty()) {
    if (entry.role == "user" || entry.role == "viewer") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tenant: is required for the ", entry.role,
          " role (its jobs and experiments belong to a tenant), e.g. --tenant=research"));
    }
  } else if (absl::Status s = CheckWord("--tenant", entry.tenant); !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

std::string TokenEntryYaml(const TokenEntry& entry) {
  return absl::StrCat("  - {name: ", entry.name,
                      ", tenant: ", entry.tenant.empty() ? "\"\"" : entry.tenant,
                      ", role: ", entry.role, ", token_sha256: \"", entry.token_sha256, "\"}");
}

}  // namespace tally::cli
