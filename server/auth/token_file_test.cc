#include "server/auth/token_file.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "openssl/sha.h"

namespace tally::auth {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Sha256Hex(absl::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         digest);
  std::string hex;
  for (unsigned char b : digest)
    absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

using Kind = TokenTable::Kind;

// One entry, e.g. Entry("alice", "research", "user", "tok-alice").
std::string Entry(absl::string_view name, absl::string_view tenant,
                  absl::string_view role, absl::string_view token) {
  return absl::StrCat("  - {name: ", name, ", tenant: \"", tenant,
                      "\", role: ", role, ", token_sha256: \"",
                      Sha256Hex(token), "\"}\n");
}

absl::Status ParseError(absl::string_view yaml, Kind kind = Kind::kUsers) {
  absl::StatusOr<TokenTable> table =
      TokenTable::Parse(yaml, kind, "tokens.yaml");
  return table.status();
}

TEST(TokenTableTest, TheDocumentedExampleParses) {
  const std::string yaml = absl::StrCat(
      "principals:\n"
      "  - {name: alice, tenant: research, role: user, token_sha256: \"",
      Sha256Hex("alice-secret"),
      "\"}\n"
      "  - {name: ops, tenant: \"\", role: admin, token_sha256: \"",
      Sha256Hex("ops-secret"), "\"}\n");
  absl::StatusOr<TokenTable> table =
      TokenTable::Parse(yaml, Kind::kUsers, "t.yaml");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->size(), 2u);

  std::optional<Principal> alice = table->Find("alice-secret");
  ASSERT_TRUE(alice.has_value());
  EXPECT_EQ(alice->name, "alice");
  EXPECT_EQ(alice->tenant, "research");
  EXPECT_EQ(alice->role, Role::kUser);
  EXPECT_EQ(alice->method, "token");

  std::optional<Principal> ops = table->Find("ops-secret");
  ASSERT_TRUE(ops.has_value());
  EXPECT_EQ(ops->name, "ops");
  EXPECT_EQ(ops->tenant, "");
  EXPECT_EQ(ops->role, Role::kAdmin);
}

TEST(TokenTableTest, BlockStyleViewerAndUpperCaseHex) {
  const std::string yaml = absl::StrCat(
      "principals:\n"
      "  - name: bob\n"
      "    tenant: vision\n"
      "    role: viewer\n"
      "    token_sha256: ",
      absl::AsciiStrToUpper(Sha256Hex("bob-secret")), "\n");
  absl::StatusOr<TokenTable> table =
      TokenTable::Parse(yaml, Kind::kUsers, "t.yaml");
  ASSERT_TRUE(table.ok()) << table.status();
  std::optional<Principal> bob = table->Find("bob-secret");
  ASSERT_TRUE(bob.has_value());
  EXPECT_EQ(bob->role, Role::kViewer);
  EXPECT_EQ(bob->tenant, "vision");
}

TEST(TokenTableTest, FindRefusesUnknownTokens) {
  const std::string hex = Sha256Hex("alice-secret");
  absl::StatusOr<TokenTable> table = TokenTable::Parse(
      absl::StrCat("principals:\n",
                   Entry("alice", "research", "user", "alice-secret")),
      Kind::kUsers, "t.yaml");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_FALSE(table->Find("alice-secreT").has_value());
  EXPECT_FALSE(table->Find("").has_value());
  EXPECT_FALSE(table->Find(hex).has_value()) << "the hash is not the token";

  // The file's hash one hex digit off: the real token no longer matches.
  std::string off_by_one = hex;
  off_by_one[37] = off_by_one[37] == '0' ? '1' : '0';
  absl::StatusOr<TokenTable> altered = TokenTable::Parse(
      absl::StrCat(
          "principals:\n  - {name: alice, tenant: research, role: user, "
          "token_sha256: \"",
          off_by_one, "\"}\n"),
      Kind::kUsers, "t.yaml");
  ASSERT_TRUE(altered.ok()) << altered.status();
  EXPECT_FALSE(altered->Find("alice-secret").has_value());
}

TEST(TokenTableTest, EmptyListsAreValidAndAcceptNobody) {
  for (absl::string_view yaml : {"principals: []\n", "", "# nobody yet\n"}) {
    absl::StatusOr<TokenTable> table =
        TokenTable::Parse(yaml, Kind::kUsers, "t.yaml");
    ASSERT_TRUE(table.ok()) << yaml << ": " << table.status();
    EXPECT_EQ(table->size(), 0u);
    EXPECT_FALSE(table->Find("anything").has_value());
  }
}

TEST(TokenTableTest, WorkersFile) {
  const std::string yaml = absl::StrCat(
      "principals:\n"
      "  - {name: gpu-node-1, role: worker, token_sha256: \"",
      Sha256Hex("w1"), "\"}\n", Entry("gpu-node-2", "", "worker", "w2"));
  absl::StatusOr<TokenTable> table =
      TokenTable::Parse(yaml, Kind::kWorkers, "w.yaml");
  ASSERT_TRUE(table.ok()) << table.status();
  std::optional<Principal> w2 = table->Find("w2");
  ASSERT_TRUE(w2.has_value());
  EXPECT_EQ(w2->name, "gpu-node-2");
  EXPECT_EQ(w2->role, Role::kWorker);
  EXPECT_EQ(w2->tenant, "");

  // A users file does not take workers, nor a workers file users.
  EXPECT_THAT(std::string(ParseError(yaml, Kind::kUsers).message()),
              AllOf(HasSubstr("tokens.yaml: principals[0].role"),
                    HasSubstr("in a users file; use admin, user or viewer")));
  EXPECT_THAT(
      std::string(ParseError(absl::StrCat("principals:\n",
                                          Entry("ops", "", "admin", "x")),
                             Kind::kWorkers)
                      .message()),
      AllOf(HasSubstr("principals[0].role: unknown role \"admin\" in a workers "
                      "file; use worker")));
  EXPECT_THAT(
      std::string(
          ParseError(absl::StrCat("principals:\n",
                                  Entry("w", "research", "worker", "x")),
                     Kind::kWorkers)
              .message()),
      HasSubstr("principals[0].tenant: must be empty or absent for a worker"));
}

struct Refusal {
  std::string name;
  std::string yaml;
  std::string expected;  // a substring of the message
};

TEST(TokenTableTest, RefusalsNameTheEntryAndField) {
  const std::string good = Entry("alice", "research", "user", "a");
  const std::string hash_b = Sha256Hex("b");
  const Refusal refusals[] = {
      {"unknown role",
       absl::StrCat("principals:\n", good,
                    Entry("bob", "research", "superuser", "b")),
       "tokens.yaml: principals[1].role: unknown role \"superuser\" in a users "
       "file; use admin, user or viewer"},
      {"role in upper case",
       absl::StrCat("principals:\n", Entry("bob", "research", "User", "b")),
       "principals[0].role: unknown role \"User\""},
      {"missing role",
       absl::StrCat("principals:\n  - {name: bob, tenant: r, token_sha256: \"",
                    hash_b, "\"}\n"),
       "principals[0].role: is missing in a users file; use admin, user or "
       "viewer"},
      {"empty name",
       absl::StrCat("principals:\n  - {tenant: r, role: user, token_sha256: \"",
                    hash_b, "\"}\n"),
       "principals[0].name: is missing"},
      {"overlong name",
       absl::StrCat("principals:\n",
                    Entry(std::string(129, 'n'), "r", "user", "b")),
       "principals[0].name: is 129 bytes long; at most 128 are allowed"},
      {"non-printable name",
       absl::StrCat("principals:\n", Entry("\"bo\\x1bb\"", "r", "user", "b")),
       "principals[0].name: contains control character U+001B"},
      {"duplicate name",
       absl::StrCat("principals:\n", good,
                    Entry("alice", "other", "viewer", "b")),
       "principals[1].name: \"alice\" is already used by principals[0]"},
      {"short hash",
       absl::StrCat("principals:\n  - {name: bob, tenant: r, role: user, "
                    "token_sha256: \"",
                    hash_b.substr(1), "\"}\n"),
       "principals[0].token_sha256: is not 64 hex digits (63 bytes); give the "
       "SHA-256 of the token in hex, e.g. printf %s TOKEN | sha256sum"},
      {"non-hex hash",
       absl::StrCat("principals:\n  - {name: bob, tenant: r, role: user, "
                    "token_sha256: \"",
                    std::string(63, 'a'), "g\"}\n"),
       "principals[0].token_sha256: is not 64 hex digits"},
      {"token instead of hash",
       "principals:\n  - {name: bob, tenant: r, role: user, token_sha256: "
       "hunter2}\n",
       "principals[0].token_sha256: is not 64 hex digits (7 bytes)"},
      {"missing hash", "principals:\n  - {name: bob, tenant: r, role: user}\n",
       "principals[0].token_sha256: is missing; give the SHA-256 of the token"},
      {"hash of the empty string",
       absl::StrCat("principals:\n", Entry("bob", "r", "user", "")),
       "principals[0].token_sha256: is the SHA-256 of the empty string"},
      {"duplicate hash",
       absl::StrCat("principals:\n", good,
                    Entry("bob", "research", "user", "b"),
                    "  - {name: carol, tenant: r, role: user, token_sha256: \"",
                    absl::AsciiStrToUpper(hash_b), "\"}\n"),
       "principals[2].token_sha256: is the same as principals[1]; every "
       "principal needs its own token"},
      {"user without tenant",
       absl::StrCat("principals:\n", Entry("bob", "", "user", "b")),
       "principals[0].tenant: is missing; a user acts in one tenant"},
      {"viewer without tenant",
       absl::StrCat(
           "principals:\n  - {name: bob, role: viewer, token_sha256: \"",
           hash_b, "\"}\n"),
       "principals[0].tenant: is missing; a viewer acts in one tenant"},
      {"non-printable tenant",
       absl::StrCat(
           "principals:\n  - {name: bob, tenant: \"a\\nb\", role: user, "
           "token_sha256: \"",
           hash_b, "\"}\n"),
       "principals[0].tenant: contains control character U+000A"},
      {"overlong tenant",
       absl::StrCat("principals:\n",
                    Entry("bob", std::string(200, 't'), "admin", "b")),
       "principals[0].tenant: is 200 bytes long; at most 128"},
      {"unknown field",
       absl::StrCat(
           "principals:\n  - {name: bob, tenant: r, role: user, token: "
           "hunter2, token_sha256: \"",
           hash_b, "\"}\n"),
       "principals[0].token"},
      {"duplicate key",
       absl::StrCat(
           "principals:\n  - {name: bob, name: eve, tenant: r, role: user, "
           "token_sha256: \"",
           hash_b, "\"}\n"),
       "principals[0].name"},
      {"anchor", "principals: &a []\n", "tokens.yaml: line 1"},
      {"two documents", "principals: []\n---\nprincipals: []\n",
       "tokens.yaml: line"},
      {"not a list", "principals: alice\n", "tokens.yaml: principals"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.name);
    const absl::Status status = ParseError(r.yaml);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(r.expected));
    EXPECT_THAT(std::string(status.message()),
                ::testing::StartsWith("tokens.yaml: "));
  }
}

TEST(TokenTableTest, NamesOfTheHashAreNotTheTokenInMessages) {
  // A message quotes what is wrong, but never a valid entry's hash.
  const std::string hash = Sha256Hex("a");
  const absl::Status status = ParseError(
      absl::StrCat("principals:\n", Entry("alice", "research", "user", "a"),
                   Entry("bob", "research", "user", "a")));
  EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr(hash)));
}

TEST(TokenTableTest, RefusesOversizeInput) {
  const std::string huge(300 << 10, '#');
  EXPECT_THAT(
      std::string(ParseError(huge).message()),
      HasSubstr("tokens.yaml: the file is 307200 bytes; at most 262144"));
}

TEST(TokenTableTest, LoadReadsAFileAndReportsMissingOnes) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/token_table_test_tokens.yaml");
  {
    std::ofstream out(path);
    out << "principals:\n" << Entry("ops", "", "admin", "ops-secret");
  }
  absl::StatusOr<TokenTable> table = TokenTable::Load(path, Kind::kUsers);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(table->Find("ops-secret").has_value());
  std::remove(path.c_str());

  absl::StatusOr<TokenTable> missing = TokenTable::Load(path, Kind::kUsers);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr(path));

  absl::StatusOr<TokenTable> directory =
      TokenTable::Load(::testing::TempDir(), Kind::kUsers);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kNotFound)
      << directory.status();

  {
    std::ofstream out(path);
    out << "principals:\n" << Entry("bob", "", "user", "b");
  }
  absl::StatusOr<TokenTable> bad = TokenTable::Load(path, Kind::kUsers);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(absl::StrCat(path, ": principals[0].tenant")));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tally::auth

namespace tally::auth {
namespace {

TEST(TokenTableTest, TenantNamesAreTrimmedAndCheckedLikeLabels) {
  absl::StatusOr<TokenTable> table = TokenTable::Parse(
      absl::StrCat("principals:\n", Entry("alice", "research ", "user", "tok-alice")),
      TokenTable::Kind::kUsers, "t.yaml");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->Find("tok-alice")->tenant, "research") << "the same tenant as \"research\"";
  const absl::Status bad = ParseError(
      absl::StrCat("principals:\n", Entry("bob", "r&d team", "user", "tok-bob")));
  EXPECT_THAT(bad.message(),
              AllOf(HasSubstr("principals[0].tenant"),
                    HasSubstr("must be 1-64 characters of letters, digits and _ . : -"),
                    HasSubstr("a tenant name becomes a metric label")));
  // Whitespace alone is no tenant by accident: for an admin that would be
  // every tenant.
  EXPECT_THAT(ParseError(absl::StrCat("principals:\n", Entry("carol", "  ", "admin", "tok-c")))
                  .message(),
              HasSubstr("tenant: is only whitespace"));
}

}  // namespace
}  // namespace tally::auth
