// What the api tests share: token tables built in memory, as --auth_tokens
// and --worker_tokens files would give them.
#ifndef TALLY_SERVER_API_GATE_TEST_UTIL_H_
#define TALLY_SERVER_API_GATE_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "openssl/sha.h"
#include "server/auth/token_file.h"

namespace tally::api {

// SHA-256 of `token` in hex, as a token file's token_sha256.
inline std::string TokenSha256(absl::string_view token) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d), sizeof(d)));
}

// A token table of `rows`, each {name, tenant, role, token}.
inline std::shared_ptr<const auth::TokenTable> TokenTableOf(
    const std::vector<std::vector<std::string>>& rows, auth::TokenTable::Kind kind) {
  std::string yaml = "principals:\n";
  for (const auto& r : rows) {
    absl::StrAppend(&yaml, "  - {name: ", r[0], ", tenant: \"", r[1], "\", role: ", r[2],
                    ", token_sha256: \"", TokenSha256(r[3]), "\"}\n");
  }
  absl::StatusOr<auth::TokenTable> t = auth::TokenTable::Parse(yaml, kind, "t.yaml");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::make_shared<const auth::TokenTable>(*std::move(t));
}

}  // namespace tally::api

#endif  // TALLY_SERVER_API_GATE_TEST_UTIL_H_
