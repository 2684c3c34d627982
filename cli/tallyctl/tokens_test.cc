#include "cli/tallyctl/tokens.h"

#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace tally::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

TEST(TokensTest, NewTokensAre64HexCharactersAndDiffer) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::string> t = NewToken();
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_THAT(*t, MatchesRegex("[0-9a-f]{64}"));
    seen.insert(*t);
  }
  EXPECT_EQ(seen.size(), 100u);
}

TEST(TokensTest, TokenFromBytesIsLowercaseHex) {
  EXPECT_EQ(TokenFromBytes(std::string("\x00\xff\x10\xab", 4)), "00ff10ab");
}

TEST(TokensTest, Sha256MatchesTheStandardVectors) {
  EXPECT_EQ(TokenSha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(TokenSha256Hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(TokensTest, ValidateTokenEntry) {
  struct Case {
    TokenEntry entry;
    const char* error;  // empty: valid
  };
  for (const Case& c : {
           Case{{"alice", "research", "user"}, ""},
           Case{{"bob", "research", "viewer"}, ""},
           Case{{"root", "", "admin"}, ""},
           Case{{"gpu-node-1", "", "worker"}, ""},
           Case{{"alice@example.com", "team.a_b-c", "user"}, ""},
           Case{{"alice", "", "user"}, "--tenant: is required for the user role"},
           Case{{"alice", "", "viewer"}, "--tenant: is required for the viewer role"},
           Case{{"alice", "r", "owner"}, "--role: \"owner\" is not a role"},
           Case{{"alice", "r", ""}, "--role: is required"},
           Case{{"alice", "r", "Admin"}, "is not a role"},
           Case{{"", "r", "user"}, "--name: is required"},
           Case{{"1alice", "r", "user"}, ""},
           Case{{"_alice", "r", "user"}, "--name: \"_alice\" is not a valid name"},
           Case{{"123", "r", "user"}, "YAML keyword or number"},
           Case{{"alice", "1e5", "user"}, "YAML keyword or number"},
           Case{{"0x1f", "r", "user"}, "YAML keyword or number"},
           Case{{"w1", "research", "worker"}, "--tenant: a worker has no tenant"},
           Case{{"al ice", "r", "user"}, "--name: \"al ice\" has the character \" \""},
           Case{{"alice", "r}, role: admin", "user"}, "--tenant"},
           Case{{"alice", "r:x", "user"}, "--tenant"},
           Case{{"null", "r", "user"}, "YAML keyword"},
           Case{{"alice", "Yes", "user"}, "YAML keyword"},
           Case{{std::string(129, 'a'), "r", "user"}, "at most 128"},
       }) {
    absl::Status s = ValidateTokenEntry(c.entry);
    if (std::string(c.error).empty()) {
      EXPECT_TRUE(s.ok()) << c.entry.name << ": " << s;
    } else {
      EXPECT_THAT(std::string(s.message()), HasSubstr(c.error)) << c.entry.name;
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST(TokensTest, TheEntryHasTheTokenFilesShapeAndReadsBack) {
  const std::string sha = TokenSha256Hex("t");
  EXPECT_EQ(TokenEntryYaml({"alice", "research", "user", sha}),
            "  - {name: alice, tenant: research, role: user, token_sha256: \"" + sha + "\"}");
  for (const TokenEntry& e : {TokenEntry{"alice@example.com", "research", "user", sha},
                              TokenEntry{"root", "", "admin", sha}}) {
    ASSERT_TRUE(ValidateTokenEntry(e).ok());
    const YAML::Node doc = YAML::Load("tokens:\n" + TokenEntryYaml(e) + "\n");
    const YAML::Node n = doc["tokens"][0];
    EXPECT_EQ(n.size(), 4u);
    EXPECT_EQ(n["name"].as<std::string>(), e.name);
    EXPECT_EQ(n["tenant"].as<std::string>(), e.tenant);
    EXPECT_EQ(n["role"].as<std::string>(), e.role);
    EXPECT_EQ(n["token_sha256"].as<std::string>(), sha);
  }
}

}  // namespace
}  // namespace tally::cli
