// Reading and checking the worker's TLS and token files (testdata/README.md
// says how the certificates were made).
#include "worker/agent/credentials.h"

#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::worker {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kTestdata = TALLY_AGENT_TESTDATA;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

class CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tally_creds_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  std::string dir_;
};

TEST_F(CredentialsTest, NothingNamedIsPlaintextWithNoToken) {
  CredentialFiles files;
  absl::StatusOr<Credentials> c = LoadCredentials(files);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->ca_pem.empty());
  EXPECT_TRUE(c->token.empty());
  EXPECT_EQ(files.Describe(), "plaintext");
}

TEST_F(CredentialsTest, MutualTlsFilesAreReadWhole) {
  CredentialFiles files{kTestdata + "/ca.pem", kTestdata + "/worker.pem",
                        kTestdata + "/worker-key.pem", ""};
  absl::StatusOr<Credentials> c = LoadCredentials(files);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->ca_pem, Read(kTestdata + "/ca.pem"));
  EXPECT_EQ(c->cert_pem, Read(kTestdata + "/worker.pem"));
  EXPECT_EQ(c->key_pem, Read(kTestdata + "/worker-key.pem"));
  EXPECT_EQ(files.Describe(), "mutual TLS");
}

TEST_F(CredentialsTest, TheTokenIsTrimmedAndNeverEmpty) {
  CredentialFiles files;
  files.token = Write("token", "  s3cret-token.v1\n\n");
  absl::StatusOr<Credentials> c = LoadCredentials(files);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->token, "s3cret-token.v1");
  EXPECT_EQ(files.Describe(), "plaintext, with a worker token");

  files.token = Write("empty", " \n\t\n");
  absl::Status s = LoadCredentials(files).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("--token_file"), HasSubstr(files.token),
                                 HasSubstr("is empty")));

  files.token = Write("two-lines", "first\nsecond\n");
  s = LoadCredentials(files).status();
  EXPECT_THAT(s.message(), AllOf(HasSubstr("--token_file"), HasSubstr("printable ASCII"),
                                 Not(HasSubstr("first")), Not(HasSubstr("second"))));
}

TEST_F(CredentialsTest, AnUnreadableFileIsNamedWithItsFlag) {
  const std::string missing = dir_ + "/missing.pem";
  struct Case {
    CredentialFiles files;
    std::string flag;
  };
  for (const Case& c : {
           Case{{missing, "", "", ""}, "--ca_cert"},
           Case{{kTestdata + "/ca.pem", missing, kTestdata + "/worker-key.pem", ""},
                "--tls_cert"},
           Case{{kTestdata + "/ca.pem", kTestdata + "/worker.pem", missing, ""}, "--tls_key"},
           Case{{"", "", "", missing}, "--token_file"},
           Case{{dir_, "", "", ""}, "--ca_cert"},  // a directory
       }) {
    SCOPED_TRACE(c.flag);
    absl::Status s = LoadCredentials(c.files).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(c.flag + ": "));
  }
}

TEST_F(CredentialsTest, AFileThatIsNotPemIsRefusedNamingFlagAndPath) {
  const std::string junk = Write("junk.pem", "not a certificate\n");
  CredentialFiles ca{junk, "", "", ""};
  EXPECT_THAT(LoadCredentials(ca).status().message(),
              AllOf(HasSubstr("--ca_cert: " + junk), HasSubstr("no PEM certificate")));
  // A private key is not a certificate, and the other way round.
  CredentialFiles key_as_ca{kTestdata + "/worker-key.pem", "", "", ""};
  EXPECT_THAT(LoadCredentials(key_as_ca).status().message(), HasSubstr("--ca_cert"));
  CredentialFiles cert_junk{kTestdata + "/ca.pem", junk, kTestdata + "/worker-key.pem", ""};
  EXPECT_THAT(LoadCredentials(cert_junk).status().message(),
              AllOf(HasSubstr("--tls_cert: " + junk), HasSubstr("no PEM certificate")));
  CredentialFiles key_junk{kTestdata + "/ca.pem", kTestdata + "/worker.pem",
                           kTestdata + "/worker.pem", ""};
  EXPECT_THAT(LoadCredentials(key_junk).status().message(),
              AllOf(HasSubstr("--tls_key: " + kTestdata + "/worker.pem"),
                    HasSubstr("no PEM private key")));
}

TEST_F(CredentialsTest, AKeyThatIsNotTheCertificatesIsRefused) {
  CredentialFiles files{kTestdata + "/ca.pem", kTestdata + "/worker.pem",
                        kTestdata + "/other-key.pem", ""};
  absl::Status s = LoadCredentials(files).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("--tls_key"), HasSubstr("other-key.pem"),
                                 HasSubstr("--tls_cert"), HasSubstr("worker.pem")));
}

TEST_F(CredentialsTest, CertificateAndKeyGoTogetherAndNeedACa) {
  CredentialFiles cert_only{kTestdata + "/ca.pem", kTestdata + "/worker.pem", "", ""};
  absl::Status s = cert_only.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("--tls_cert"), HasSubstr("--tls_key")));
  CredentialFiles key_only{kTestdata + "/ca.pem", "", kTestdata + "/worker-key.pem", ""};
  EXPECT_THAT(key_only.Validate().message(),
              AllOf(HasSubstr("--tls_cert"), HasSubstr("--tls_key")));
  CredentialFiles no_ca{"", kTestdata + "/worker.pem", kTestdata + "/worker-key.pem", ""};
  EXPECT_THAT(no_ca.Validate().message(), HasSubstr("--ca_cert"));
  EXPECT_FALSE(LoadCredentials(no_ca).ok());
}

TEST_F(CredentialsTest, AnEncryptedKeyIsRefusedWithoutPrompting) {
  // Encrypted with a passphrase the loader does not have: it must fail, not
  // wait for a terminal.
  const std::string encrypted = kTestdata + "/worker-key-encrypted.pem";
  CredentialFiles files{kTestdata + "/ca.pem", kTestdata + "/worker.pem", encrypted, ""};
  EXPECT_THAT(LoadCredentials(files).status().message(), HasSubstr("--tls_key"));
}

TEST_F(CredentialsTest, FilesAreReadAgainOnEachLoad) {
  CredentialFiles files;
  files.token = Write("token", "first\n");
  EXPECT_EQ(LoadCredentials(files)->token, "first");
  Write("token", "second\n");
  EXPECT_EQ(LoadCredentials(files)->token, "second");
}

TEST(CertificateNamesTest, CommonNameThenDnsNames) {
  absl::StatusOr<std::vector<std::string>> names =
      CertificateNames(Read(kTestdata + "/worker.pem"));
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ElementsAre("w1", "w1.workers.tally", "w1-alt"));
  // IP SANs are not names.
  EXPECT_THAT(*CertificateNames(Read(kTestdata + "/server.pem")),
              ElementsAre("localhost", "localhost"));
  EXPECT_FALSE(CertificateNames("junk").ok());
}

}  // namespace
}  // namespace tally::worker
