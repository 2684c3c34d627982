#include "server/auth/client_cert.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "openssl/bio.h"
#include "openssl/ec.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"
#include "openssl/x509v3.h"

namespace tally::auth {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A PEM certificate with subject CN `cn` (none when empty) and the given
// extensions ({name, value} as in openssl.cnf), valid from 2020 to 2040.
std::string MakeCert(const std::string& cn,
                     const std::vector<std::pair<std::string, std::string>>& extensions) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 7);
  ASN1_TIME_set(X509_getm_notBefore(x), 1577836800);  // 2020-01-01
  ASN1_TIME_set(X509_getm_notAfter(x), 2208988800);   // 2040-01-01
  X509_set_pubkey(x, key);
  X509_NAME* subject = X509_get_subject_name(x);
  if (!cn.empty()) {
    X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  } else {
    X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("tally"), -1, -1, 0);
  }
  X509_set_issuer_name(x, subject);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  for (const auto& [name, value] : extensions) {
    X509_EXTENSION* ext = X509V3_EXT_conf(nullptr, &ctx, name.c_str(), value.c_str());
    EXPECT_NE(ext, nullptr) << name << "=" << value;
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  X509_sign(x, key, EVP_sha256());
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, x);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  X509_free(x);
  EVP_PKEY_free(key);
  return pem;
}

TEST(ClientCertTest, NamesComeFromTheCommonNameAndDnsSansOnly) {
  absl::StatusOr<ClientCertificate> c = ReadClientCertificate(MakeCert(
      "w1",
      {{"subjectAltName", "DNS:w1,DNS:w1.pool,URI:spiffe://w9,email:w8@example.com,IP:10.0.0.7"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->names, ElementsAre("w1", "w1.pool"));
  EXPECT_EQ(c->not_after, absl::FromUnixSeconds(2208988800));
}

TEST(ClientCertTest, AnIdOnlyInAUriEmailOrIpSanNamesNoWorker) {
  for (const char* san : {"URI:w1", "email:w1@example.com", "IP:10.0.0.1"}) {
    absl::StatusOr<ClientCertificate> c =
        ReadClientCertificate(MakeCert("", {{"subjectAltName", san}}));
    EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied) << san;
    EXPECT_THAT(c.status().message(), HasSubstr("names no worker")) << san;
  }
}

TEST(ClientCertTest, ACaLeafIsRefused) {
  absl::StatusOr<ClientCertificate> c =
      ReadClientCertificate(MakeCert("w1", {{"basicConstraints", "critical,CA:TRUE"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(c.status().message(), HasSubstr("CA:TRUE"));
  EXPECT_TRUE(ReadClientCertificate(MakeCert("w1", {{"basicConstraints", "CA:FALSE"}})).ok());
}

TEST(ClientCertTest, KeyUsageMustAllowDigitalSignatureWhenPresent) {
  absl::StatusOr<ClientCertificate> c =
      ReadClientCertificate(MakeCert("w1", {{"keyUsage", "keyEncipherment"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(c.status().message(), HasSubstr("digitalSignature"));
  EXPECT_TRUE(ReadClientCertificate(MakeCert("w1", {{"keyUsage", "digitalSignature"}})).ok());
  // Absent: no restriction (RFC 5280).
  EXPECT_TRUE(ReadClientCertificate(MakeCert("w1", {})).ok());
}

TEST(ClientCertTest, ExtendedKeyUsageMustAllowClientAuthWhenPresent) {
  absl::StatusOr<ClientCertificate> c =
      ReadClientCertificate(MakeCert("w1", {{"extendedKeyUsage", "serverAuth"}}));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(c.status().message(), HasSubstr("clientAuth"));
  EXPECT_TRUE(
      ReadClientCertificate(MakeCert("w1", {{"extendedKeyUsage", "serverAuth,clientAuth"}})).ok());
}

TEST(ClientCertTest, NotACertificate) {
  EXPECT_EQ(ReadClientCertificate("hello").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tally::auth
