#include "server/auth/token_file.h"

#include <algorithm>
#include <fstream>
#include <utility>

#include "common/file/file_system.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/spec_yaml.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "openssl/crypto.h"
#include "openssl/sha.h"
#include "tally/v1/auth_config.pb.h"

namespace tally::auth {
namespace {

using Digest = std::array<uint8_t, 32>;

Digest Sha256(absl::string_view data) {
  Digest digest;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
         digest.data());
  return digest;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<Digest> ParseHexDigest(absl::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  Digest digest;
  for (size_t i = 0; i < digest.size(); ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    digest[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return digest;
}

class Checker {
 public:
  Checker(absl::string_view source, TokenTable::Kind kind)
      : source_(source), kind_(kind) {}

  absl::Status Error(int index, absl::string_view field,
                     absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, source_.empty() ? "" : ": ", "principals[", index,
                     "].", field, ": ", what));
  }

  absl::string_view FileKind() const {
    return kind_ == TokenTable::Kind::kUsers ? "users" : "workers";
  }

  // name or tenant: printable and bounded.
  absl::Status CheckText(int index, absl::string_view field,
                         absl::string_view value) const {
    if (value.size() > kMaxPrincipalFieldBytes) {
      return Error(index, field,
                   absl::StrCat("is ", value.size(), " bytes long; at most ",
                                kMaxPrincipalFieldBytes, " are allowed"));
    }
    if (std::optional<std::string> why = UnprintableReason(value)) {
      return Error(index, field,
                   absl::StrCat(*why, "; use printable UTF-8 text"));
    }
    return absl::OkStatus();
  }

 private:
  absl::string_view source_;
  TokenTable::Kind kind_;
};

}  // namespace

absl::StatusOr<TokenTable> TokenTable::Parse(absl::string_view yaml, Kind kind,
                                             absl::string_view source) {
  const std::string prefix =
      source.empty() ? std::string() : absl::StrCat(source, ": ");
  if (yaml.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "the file is ", yaml.size(), " bytes; at most ", kMaxSpecBytes,
        " are read (about 100 bytes per principal)"));
  }
  tally::v1::TokenFile file;
  if (absl::Status s = ParseYamlInto(yaml, &file, ""); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
  }

  const Checker check(source, kind);
  static const Digest kEmptyDigest = Sha256("");
  std::vector<Entry> entries;
  entries.reserve(file.principals_size());
  absl::flat_hash_map<std::string, int> index_of_name;
  absl::flat_hash_map<std::string, int> index_of_digest;
  for (int i = 0; i < file.principals_size(); ++i) {
    const tally::v1::TokenPrincipal& p = file.principals(i);
    Entry entry;

    absl::StatusOr<Role> role = ParseRole(p.role());
    const bool role_allowed =
        role.ok() && ((kind == Kind::kWorkers) == (*role == Role::kWorker));
    if (!role_allowed) {
      return check.Error(
          i, "role",
          absl::StrCat(
              p.role().empty()
                  ? "is missing"
                  : absl::StrCat("unknown role ", QuoteForMessage(p.role())),
              " in a ", check.FileKind(), " file; use ",
              kind == Kind::kUsers ? "admin, user or viewer" : "worker"));
    }
    entry.principal.role = *role;

    if (p.name().empty()) {
      return check.Error(i, "name",
                         kind == Kind::kUsers
                             ? "is missing; name the principal, e.g. alice"
                             : "is missing; give the worker id this token "
                               "may use");
    }
    RETURN_IF_ERROR(check.CheckText(i, "name", p.name()));
    if (auto [it, inserted] = index_of_name.emplace(p.name(), i); !inserted) {
      return check.Error(
          i, "name",
          absl::StrCat(QuoteForMessage(p.name()),
                       " is already used by principals[", it->second,
                       "]; give each principal its own name"));
    }
    entry.principal.name = p.name();

    RETURN_IF_ERROR(check.CheckText(i, "tenant", p.tenant()));
    absl::StatusOr<std::string> tenant = TenantName("tenant", p.tenant());
    if (!tenant.ok()) return check.Error(i, "tenant", tenant.status().message());
    switch (*role) {
      case Role::kUser:
      case Role::kViewer:
        if (tenant->empty()) {
          return check.Error(
              i, "tenant",
              absl::StrCat("is missing; a ", RoleName(*role),
                           " acts in one tenant, e.g. tenant: research (only "
                           "an admin may have an empty tenant, meaning every "
                           "tenant)"));
        }
        break;
      case Role::kWorker:
        if (!tenant->empty()) {
          return check.Error(i, "tenant",
                             "must be empty or absent for a worker; remove it");
        }
        break;
      case Role::kAdmin:
        break;
    }
    entry.principal.tenant = *std::move(tenant);

    std::optional<Digest> digest = ParseHexDigest(p.token_sha256());
    if (!digest.has_value()) {
      return check.Error(
          i, "token_sha256",
          absl::StrCat(p.token_sha256().empty()
                           ? "is missing"
                           : absl::StrCat("is not 64 hex digits (",
                                          p.token_sha256().size(), " bytes)"),
                       "; give the SHA-256 of the token in hex, e.g. printf "
                       "%s TOKEN | sha256sum"));
    }
    if (*digest == kEmptyDigest) {
      return check.Error(i, "token_sha256",
                         "is the SHA-256 of the empty string: the token was "
                         "empty when hashed; hash the token itself, e.g. "
                         "printf %s TOKEN | sha256sum");
    }
    const std::string digest_key(digest->begin(), digest->end());
    if (auto [it, inserted] = index_of_digest.emplace(digest_key, i);
        !inserted) {
      return check.Error(
          i, "token_sha256",
          absl::StrCat("is the same as principals[", it->second,
                       "]; every principal needs its own token"));
    }
    entry.digest = *digest;
    entry.principal.method = "token";
    entries.push_back(std::move(entry));
  }
  return TokenTable(std::move(entries));
}

absl::StatusOr<TokenTable> TokenTable::Load(const std::string& path,
                                            Kind kind) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot be read; check the path and permissions"));
  }
  // One byte past the limit is enough to refuse a file that is too long.
  absl::StatusOr<std::string> text = file::ReadAtMost(in, kMaxSpecBytes);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  return Parse(*text, kind, path);
}

std::optional<Principal> TokenTable::Find(absl::string_view token) const {
  if (token.empty()) return std::nullopt;
  const Digest digest = Sha256(token);
  const Entry* found = nullptr;
  for (const Entry& entry : entries_) {
    if (CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0) {
      found = &entry;
    }
  }
  if (found == nullptr) return std::nullopt;
  return found->principal;
}

}  // namespace tally::auth
