#include "server/api/tls_files.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::api {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("tls_files_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A P-256 key and a self-signed certificate for it: {cert, key} paths.
  std::pair<std::string, std::string> MakePair(const std::string& name) {
    EVP_PKEY* key = EVP_EC_gen("P-256");
    X509* x = X509_new();
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("t"), -1, -1, 0);
    X509_set_issuer_name(x, X509_get_subject_name(x));
    X509_sign(x, key, EVP_sha256());
    const std::string cert = (dir_ / (name + ".pem")).string();
    const std::string key_path = (dir_ / (name + ".key")).string();
    FILE* f = std::fopen(cert.c_str(), "w");
    PEM_write_X509(f, x);
    std::fclose(f);
    f = std::fopen(key_path.c_str(), "w");
    PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    std::fclose(f);
    X509_free(x);
    EVP_PKEY_free(key);
    return {cert, key_path};
  }

  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(TlsFilesTest, AcceptsAMatchingPairAndACa) {
  auto [cert, key] = MakePair("server");
  EXPECT_TRUE(CheckTlsFiles(cert, key, "").ok());
  EXPECT_TRUE(CheckTlsFiles(cert, key, cert).ok());
}

TEST_F(TlsFilesTest, ErrorsNameTheFlagAndThePath) {
  auto [cert, key] = MakePair("server");
  auto [other_cert, other_key] = MakePair("other");
  const std::string junk = Write("junk.pem", "not PEM\n");
  const TlsFileFlags metrics{"metrics_tls_cert", "metrics_tls_key", "client_ca"};
  struct Case {
    std::string cert, key, ca;
    TlsFileFlags flags;
    std::string prefix, needle;
  } cases[] = {
      {"/nonexistent/c.pem", key, "", {}, "--tls_cert: cannot read /nonexistent/c.pem", ""},
      {junk, key, "", {}, "--tls_cert: " + junk, "holds no PEM certificate"},
      {cert, junk, "", {}, "--tls_key: " + junk, "holds no PEM private key"},
      {cert,
       other_key,
       "",
       {},
       "--tls_key: " + other_key,
       "is not the private key of the certificate in --tls_cert " + cert},
      {cert, key, junk, {}, "--client_ca: " + junk, "holds no PEM certificate"},
      {cert, other_key, "", metrics, "--metrics_tls_key: " + other_key,
       "in --metrics_tls_cert " + cert},
      {"/nonexistent/c.pem", key, "", metrics, "--metrics_tls_cert: cannot read", ""},
  };
  for (const Case& c : cases) {
    const absl::Status s = CheckTlsFiles(c.cert, c.key, c.ca, c.flags);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.prefix;
    EXPECT_THAT(std::string(s.message()), AllOf(StartsWith(c.prefix), HasSubstr(c.needle)));
  }
}

}  // namespace
}  // namespace tally::api
