#include "cli/tallyctl/client_config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::cli {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kCaPem[] = R"(-----BEGIN CERTIFICATE-----
MIIBiDCCAS2gAwIBAgIUc0ozd2T1Pgns3zrFneLVYtkgQN4wCgYIKoZIzj0EAwIw
GDEWMBQGA1UEAwwNdGFsbHktdGVzdC1jYTAgFw0yNjEyMDMxNTUwMTBaGA8yMTI2
MTEwOTE1NTAxMFowGDEWMBQGA1UEAwwNdGFsbHktdGVzdC1jYTBZMBMGByqGSM49
AgEGCCqGSM49AwEHA0IABBD7TcZ74MAYwTqVY8doKPVH5soXIlW4qXcI13ymn1ZF
IiyRtVXlFcoSiA2C6FBzrABxjhjCixM6idnJV3YrXqijUzBRMB0GA1UdDgQWBBQ6
SXVU+YGgiXa5szmoFR2O3n3e/DAfBgNVHSMEGDAWgBQ6SXVU+YGgiXa5szmoFR2O
3n3e/DAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0kAMEYCIQC3/EGNfqlq
l3elLC+SM/nDu23oeywpUd/UTgI0Mh08MgIhAKOi8XIq2eoveDnyvwS4UuuoTphX
zaVgmeHcaJFCWwHS
-----END CERTIFICATE-----
)";

// A fresh folder per test, standing in for $HOME, with helpers to write
// files into it; the environment is a map.
class ClientConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    home_ = absl::StrCat(::testing::TempDir(), "/client_config_", info->name(), "_", getpid());
    std::filesystem::remove_all(home_);
    ASSERT_TRUE(std::filesystem::create_directories(home_ + "/.config/tally"));
    env_["HOME"] = home_;
  }

  std::string Write(const std::string& rel, const std::string& text) {
    const std::string path = absl::StrCat(home_, "/", rel);
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string WriteConfig(const std::string& text) {
    return Write(".config/tally/config.yaml", text);
  }

  Environment Env() const {
    return [env = env_](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }
  absl::StatusOr<Connection> Resolve(const ConnectionFlags& flags = {}) {
    return ResolveConnection(flags, Env());
  }
  std::string Error(const ConnectionFlags& flags = {}) {
    absl::StatusOr<Connection> c = Resolve(flags);
    EXPECT_FALSE(c.ok()) << "expected an error";
    if (c.ok()) return "";
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
    return std::string(c.status().message());
  }

  std::string home_;
  std::map<std::string, std::string> env_;
};

TEST_F(ClientConfigTest, NothingSetIsPlaintextToTheDefaultAddressWithoutAToken) {
  absl::StatusOr<Connection> c = Resolve();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address, "127.0.0.1:50051");
  EXPECT_EQ(c->ca_cert_pem, "");
  EXPECT_EQ(c->token, "");
  EXPECT_EQ(c->context, "");
  EXPECT_EQ(c->config_file, "");
}

TEST_F(ClientConfigTest, NoHomeAndNothingSetIsStillTheDefault) {
  env_.erase("HOME");
  absl::StatusOr<Connection> c = Resolve();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address, kDefaultController);
}

// Each setting, table-driven: flag > environment > context > default.
struct PrecedenceCase {
  const char* what;
  bool flag, env, context;
  const char* want;  // the winner: "flag", "env", "context" or "default"
};

void PrintTo(const PrecedenceCase& c, std::ostream* os) { *os << c.what; }

class PrecedenceTest : public ClientConfigTest,
                       public ::testing::WithParamInterface<PrecedenceCase> {};

TEST_P(PrecedenceTest, AddressCaCertAndTokenEachTakeTheFirstThatIsSet) {
  const PrecedenceCase& p = GetParam();
  for (const char* who : {"flag", "env", "context"}) {
    Write(absl::StrCat(who, ".pem"), kCaPem);
    Write(absl::StrCat(who, ".token"), absl::StrCat("token-from-", who, "\n"));
  }
  std::string config = "current_context: prod\ncontexts:\n  - name: prod\n";
  config += "    address: context.example:1\n";
  if (p.context) config += "    ca_cert: ~/context.pem\n    token_file: context.token\n";
  WriteConfig(config);
  // The context's token file is relative: beside the config file.
  Write(".config/tally/context.token", "token-from-context\n");
  ConnectionFlags flags;
  if (p.flag) {
    flags.controller = "flag.example:1";
    flags.ca_cert = home_ + "/flag.pem";
    flags.token = "token-from-flag";
  }
  if (p.env) {
    env_["TALLY_CONTROLLER"] = "env.example:1";
    env_["TALLY_CA_CERT"] = home_ + "/env.pem";
    env_["TALLY_TOKEN"] = "token-from-env";
  }
  absl::StatusOr<Connection> c = Resolve(flags);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string want = p.want;
  EXPECT_EQ(c->context, "prod");
  if (want == "default") {
    EXPECT_EQ(c->ca_cert_path, "");
    EXPECT_EQ(c->token, "");
  } else {
    EXPECT_EQ(c->token, "token-from-" + want);
    EXPECT_EQ(c->ca_cert_path,
              want == "context" ? home_ + "/context.pem" : absl::StrCat(home_, "/", want, ".pem"));
    EXPECT_EQ(c->ca_cert_pem, kCaPem);
  }
  // The context always has an address, so the address falls back to it.
  EXPECT_EQ(c->address, (want == "default" || want == "context")
                            ? std::string("context.example:1")
                            : absl::StrCat(want, ".example:1"));
}

INSTANTIATE_TEST_SUITE_P(
    Table, PrecedenceTest,
    ::testing::Values(PrecedenceCase{"all", true, true, true, "flag"},
                      PrecedenceCase{"flag and env", true, true, false, "flag"},
                      PrecedenceCase{"flag and context", true, false, true, "flag"},
                      PrecedenceCase{"env and context", false, true, true, "env"},
                      PrecedenceCase{"env", false, true, false, "env"},
                      PrecedenceCase{"context", false, false, true, "context"},
                      PrecedenceCase{"none", false, false, false, "default"}),
    [](const auto& info) {
      std::string name = info.param.what;
      for (char& ch : name) {
        if (ch == ' ') ch = '_';
      }
      return name;
    });

TEST_F(ClientConfigTest, TheContextIsFlagThenEnvironmentThenCurrentContext) {
  WriteConfig(
      "current_context: a\ncontexts:\n  - {name: a, address: 'a:1'}\n"
      "  - {name: b, address: 'b:1'}\n  - {name: c, address: 'c:1'}\n");
  EXPECT_EQ(Resolve()->address, "a:1");
  env_["TALLY_CONTEXT"] = "b";
  EXPECT_EQ(Resolve()->address, "b:1");
  EXPECT_EQ(Resolve({.context = "c"})->address, "c:1");
  EXPECT_EQ(Resolve({.context = "c"})->context, "c");
}

TEST_F(ClientConfigTest, ConfigFileIsFlagThenEnvironmentThenHome) {
  WriteConfig("current_context: h\ncontexts: [{name: h, address: 'home:1'}]\n");
  const std::string env_file =
      Write("env.yaml", "current_context: e\ncontexts: [{name: e, address: 'env:1'}]\n");
  const std::string flag_file =
      Write("flag.yaml", "current_context: f\ncontexts: [{name: f, address: 'flag:1'}]\n");
  EXPECT_EQ(Resolve()->address, "home:1");
  env_["TALLY_CONFIG"] = env_file;
  EXPECT_EQ(Resolve()->address, "env:1");
  EXPECT_EQ(Resolve({.config_file = flag_file})->address, "flag:1");
  EXPECT_EQ(Resolve({.config_file = "~/flag.yaml"})->config_file, flag_file);
}

TEST_F(ClientConfigTest, NoCurrentContextMeansNoContext) {
  WriteConfig("contexts: [{name: a, address: 'a:1'}]\n");
  absl::StatusOr<Connection> c = Resolve();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->address, kDefaultController);
  EXPECT_EQ(c->context, "");
}

TEST_F(ClientConfigTest, AMissingConfigFileIsAnErrorOnlyWhenNamed) {
  EXPECT_TRUE(Resolve().ok());
  EXPECT_THAT(Error({.context = "prod"}),
              AllOf(HasSubstr("--context \"prod\""), HasSubstr("no config file"),
                    HasSubstr(home_ + "/.config/tally/config.yaml")));
  env_["TALLY_CONTEXT"] = "prod";
  EXPECT_THAT(Error(), HasSubstr("TALLY_CONTEXT \"prod\""));
  env_.erase("TALLY_CONTEXT");
  EXPECT_THAT(Error({.config_file = "/nonexistent/tally.yaml"}),
              AllOf(HasSubstr("--config_file /nonexistent/tally.yaml"), HasSubstr("No such file")));
  env_["TALLY_CONFIG"] = "/nonexistent/env.yaml";
  EXPECT_THAT(Error(), HasSubstr("TALLY_CONFIG /nonexistent/env.yaml"));
}

TEST_F(ClientConfigTest, AnUnknownContextListsTheKnownOnes) {
  const std::string file = WriteConfig(
      "contexts:\n  - {name: prod, address: 'p:1'}\n  - {name: local, address: 'l:1'}\n");
  EXPECT_THAT(Error({.context = "staging"}),
              AllOf(HasSubstr(file), HasSubstr("--context \"staging\" names no context"),
                    HasSubstr("known: prod, local")));
  WriteConfig("current_context: gone\ncontexts: [{name: prod, address: 'p:1'}]\n");
  EXPECT_THAT(Error(), AllOf(HasSubstr("current_context \"gone\""), HasSubstr("known: prod"),
                             HasSubstr("fix current_context")));
  WriteConfig("current_context: gone\n");
  EXPECT_THAT(Error(), HasSubstr("the file has none"));
}

TEST_F(ClientConfigTest, DuplicateContextNamesNameBothEntriesAndLines) {
  const std::string file = WriteConfig(
      "contexts:\n"
      "  - name: prod\n"
      "    address: a:1\n"
      "  - name: prod\n"
      "    address: b:1\n");
  EXPECT_THAT(Error(), AllOf(HasSubstr(file), HasSubstr("contexts[1].name (line 4)"),
                             HasSubstr("contexts[0] (line 2)"), HasSubstr("must be unique")));
}

TEST_F(ClientConfigTest, EachContextNeedsANameAndAnAddress) {
  WriteConfig("contexts:\n  - address: a:1\n");
  EXPECT_THAT(Error(), AllOf(HasSubstr("contexts[0] (line 2): name is required")));
  WriteConfig("contexts:\n  - name: prod\n");
  EXPECT_THAT(Error(), AllOf(HasSubstr("contexts[0] (\"prod\") (line 2): address is required"),
                             HasSubstr("host:port")));
  WriteConfig("contexts:\n  - {name: 'my prod', address: 'a:1'}\n");
  EXPECT_THAT(Error(), HasSubstr("contexts[0].name (line 2): \"my prod\" has a space"));
  WriteConfig("contexts:\n  - {name: p, address: 'a:1', tls_server_name: tally}\n");
  EXPECT_THAT(Error(), HasSubstr("set without ca_cert"));
}

TEST_F(ClientConfigTest, BadYamlIsRefusedNamingTheFileFieldAndLine) {
  struct Case {
    const char* text;
    const char* want;
  };
  for (const Case& c : {
           Case{"contexts:\n  - name: p\n    adress: a:1\n",
                "contexts[0].adress (line 3): unknown field; Context has: name, address"},
           Case{"current_context: p\ncontexts: prod\n", "contexts (line 2): expected a list"},
           Case{"contexts:\n  - &a {name: p, address: 'a:1'}\n  - *a\n", "line 2"},
           Case{"contexts: []\ncontexts: []\n", "given twice"},
           Case{"current_context: [a]\n", "current_context (line 1)"},
           Case{"contexts:\n  - name: p\n    address: {host: a}\n", "contexts[0].address"},
           Case{"contexts: [\n", "line"},
           Case{"- a\n- b\n", "expected a mapping"},
       }) {
    const std::string file = WriteConfig(c.text);
    EXPECT_THAT(Error(), AllOf(HasSubstr(file), HasSubstr(c.want))) << c.text;
  }
}

TEST_F(ClientConfigTest, AnOversizedConfigIsRefused) {
  WriteConfig("# " + std::string(kMaxConfigBytes, 'x') + "\n");
  EXPECT_THAT(Error(), HasSubstr("larger than"));
}

TEST_F(ClientConfigTest, AnUnreadableTokenFileNamesItsSourceAndPath) {
  EXPECT_THAT(Error({.token_file = home_ + "/missing.token"}),
              AllOf(HasSubstr("--token_file " + home_ + "/missing.token"),
                    HasSubstr("No such file"), HasSubstr("token create")));
  // A folder cannot be read as a file (chmod cannot stop root, a folder can).
  EXPECT_THAT(Error({.token_file = home_}),
              AllOf(HasSubstr("--token_file " + home_), HasSubstr("cannot read")));
  const std::string file = WriteConfig(
      "current_context: p\ncontexts:\n  - {name: p, address: 'a:1', token_file: nope}\n");
  EXPECT_THAT(Error(), AllOf(HasSubstr("context \"p\" of " + file + ", token_file"),
                             HasSubstr(home_ + "/.config/tally/nope")));
}

TEST_F(ClientConfigTest, ATokenFileIsTrimmedAndCheckedWithoutShowingTheToken) {
  Write("t", "  \n s3cret-token \n\n");
  absl::StatusOr<Connection> c = Resolve({.token_file = "~/t"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->token, "s3cret-token");
  EXPECT_EQ(c->token_source, "--token_file " + home_ + "/t");

  Write("t", "s3cret with-space\n");
  EXPECT_THAT(Error({.token_file = home_ + "/t"}),
              AllOf(HasSubstr("byte 7"), Not(HasSubstr("s3cret"))));
  Write("t", "\n\n");
  EXPECT_THAT(Error({.token_file = home_ + "/t"}), HasSubstr("the token is empty"));
  Write("t", std::string(kMaxTokenBytes + 1, 'a'));
  EXPECT_THAT(Error({.token_file = home_ + "/t"}), HasSubstr("over the limit"));
  env_["TALLY_TOKEN"] = "bad\x01token";
  EXPECT_THAT(Error(), AllOf(HasSubstr("TALLY_TOKEN"), Not(HasSubstr("bad"))));
}

TEST_F(ClientConfigTest, TokenAndTokenFileTogetherAreRefused) {
  Write("t", "x");
  EXPECT_THAT(Error({.token = "a", .token_file = home_ + "/t"}),
              HasSubstr("--token and --token_file are both set"));
}

TEST_F(ClientConfigTest, CaCertMustBeReadablePem) {
  Write("notpem", "hello\n");
  EXPECT_THAT(Error({.ca_cert = home_ + "/notpem"}),
              AllOf(HasSubstr("--ca_cert " + home_ + "/notpem"), HasSubstr("no PEM certificate")));
  Write("broken.pem", "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
  EXPECT_THAT(Error({.ca_cert = home_ + "/broken.pem"}), HasSubstr("does not parse"));
  EXPECT_THAT(Error({.ca_cert = home_ + "/missing.pem"}),
              AllOf(HasSubstr("--ca_cert " + home_ + "/missing.pem"), HasSubstr("No such file")));
  env_["TALLY_CA_CERT"] = home_ + "/notpem";
  EXPECT_THAT(Error(), HasSubstr("TALLY_CA_CERT " + home_ + "/notpem"));
  env_.erase("TALLY_CA_CERT");
  Write("two.pem", absl::StrCat(kCaPem, kCaPem));
  absl::StatusOr<Connection> c = Resolve({.ca_cert = home_ + "/two.pem"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ca_cert_source, "--ca_cert");
}

TEST_F(ClientConfigTest, TlsServerNameNeedsTlsAndComesFromFlagOrContext) {
  Write("ca.pem", kCaPem);
  EXPECT_THAT(Error({.tls_server_name = "tally"}), HasSubstr("without TLS roots"));
  EXPECT_EQ(Resolve({.ca_cert = home_ + "/ca.pem", .tls_server_name = "tally"})->tls_server_name,
            "tally");
  WriteConfig(
      "current_context: p\ncontexts:\n  - {name: p, address: '10.0.0.1:1', ca_cert: "
      "~/ca.pem, tls_server_name: tally.internal}\n");
  EXPECT_EQ(Resolve()->tls_server_name, "tally.internal");
  EXPECT_EQ(Resolve({.ca_cert = home_ + "/ca.pem", .tls_server_name = "other"})->tls_server_name,
            "other");
}

TEST_F(ClientConfigTest, HomeExpansion) {
  EXPECT_EQ(*ExpandHome("~", Env()), home_);
  EXPECT_EQ(*ExpandHome("~/a/b", Env()), home_ + "/a/b");
  EXPECT_EQ(*ExpandHome("/a/~", Env()), "/a/~");
  EXPECT_EQ(*ExpandHome("a", Env()), "a");
  EXPECT_FALSE(ExpandHome("~bob/x", Env()).ok());
  env_.erase("HOME");
  EXPECT_THAT(std::string(ExpandHome("~/x", Env()).status().message()),
              HasSubstr("HOME is not set"));
}

TEST(IsLoopbackAddressTest, Table) {
  for (const char* yes : {"127.0.0.1:50051", "localhost:1", "LOCALHOST:1", "[::1]:50051",
                          "127.1.2.3:9", "dns:///localhost:1", "ipv4:127.0.0.1:5"}) {
    EXPECT_TRUE(IsLoopbackAddress(yes)) << yes;
  }
  for (const char* no : {"10.0.0.1:50051", "tally.example.com:50051", "127.0.0.1.example:1",
                         "[::2]:1", "128.0.0.1:1", "127.0.0.300:1", "", "[::1"}) {
    EXPECT_FALSE(IsLoopbackAddress(no)) << no;
  }
}

}  // namespace
}  // namespace tally::cli
