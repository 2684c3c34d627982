#include "worker/agent/credentials.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tally::worker {
namespace {

constexpr size_t kMaxFileBytes = 1 << 20;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using BioPtr = std::unique_ptr<BIO, BioFree>;
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

// Never prompts on the terminal for an encrypted key's passphrase.
int NoPassphrase(char*, int, int, void*) { return 0; }

absl::Status FileError(absl::string_view flag, const std::string& path,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, ": ", what));
}

absl::StatusOr<std::string> ReadFile(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return FileError(flag, path, absl::StrCat("cannot read it: ", std::strerror(errno)));
  std::string bytes;
  char buf[8192];
  while (in.read(buf, sizeof(buf)) || in.gcount() > 0) {
    bytes.append(buf, static_cast<size_t>(in.gcount()));
    if (bytes.size() > kMaxFileBytes) {
      return FileError(flag, path, absl::StrCat("larger than ", kMaxFileBytes, " bytes"));
    }
  }
  if (in.bad()) return FileError(flag, path, "cannot read it");
  return bytes;
}

BioPtr MemBio(const std::string& bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

// The first certificate in `pem`, or null.
X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  ERR_clear_error();
  return cert;
}

int CountCertificates(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  int n = 0;
  while (bio) {
    X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr));
    if (!cert) break;
    ++n;
  }
  ERR_clear_error();
  return n;
}

}  // namespace

absl::Status CredentialFiles::Validate() const {
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_cert and --tls_key go together (the worker's certificate and its private key "
        "for mutual TLS); only ",
        tls_cert.empty() ? "--tls_key" : "--tls_cert", " is set"));
  }
  if (!tls_cert.empty() && ca_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key need --ca_cert (or $TALLY_CA_CERT): the certificates "
        "that tallyd's certificate is checked against");
  }
  return absl::OkStatus();
}

std::string CredentialFiles::Describe() const {
  return absl::StrCat(ca_cert.empty()    ? "plaintext"
                      : tls_cert.empty() ? "TLS"
                                         : "mutual TLS",
                      token.empty() ? "" : ", with a worker token");
}

absl::StatusOr<Credentials> LoadCredentials(const CredentialFiles& files) {
  if (absl::Status s = files.Validate(); !s.ok()) return s;
  Credentials c;
  if (!files.ca_cert.empty()) {
    absl::StatusOr<std::string> pem = ReadFile("--ca_cert", files.ca_cert);
    if (!pem.ok()) return pem.status();
    if (CountCertificates(*pem) == 0) {
      return FileError("--ca_cert", files.ca_cert, "holds no PEM certificate");
    }
    c.ca_pem = *std::move(pem);
  }
  if (!files.tls_cert.empty()) {
    absl::StatusOr<std::string> cert_pem = ReadFile("--tls_cert", files.tls_cert);
    if (!cert_pem.ok()) return cert_pem.status();
    X509Ptr cert = FirstCertificate(*cert_pem);
    if (!cert) return FileError("--tls_cert", files.tls_cert, "holds no PEM certificate");
    absl::StatusOr<std::string> key_pem = ReadFile("--tls_key", files.tls_key);
    if (!key_pem.ok()) return key_pem.status();
    BioPtr bio = MemBio(*key_pem);
    PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr)
                    : nullptr);
    ERR_clear_error();
    if (!key) {
      return FileError("--tls_key", files.tls_key,
                       "holds no PEM private key (an encrypted key is not supported)");
    }
    const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
    ERR_clear_error();
    if (!match) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tls_key: ", files.tls_key, " is not the private key of the "
                       "certificate in --tls_cert ", files.tls_cert));
    }
    c.cert_pem = *std::move(cert_pem);
    c.key_pem = *std::move(key_pem);
  }
  if (!files.token.empty()) {
    absl::StatusOr<std::string> bytes = ReadFile("--token_file", files.token);
    if (!bytes.ok()) return bytes.status();
    const absl::string_view token = absl::StripAsciiWhitespace(*bytes);
    if (token.empty()) return FileError("--token_file", files.token, "is empty");
    for (const char ch : token) {
      if (ch < 0x20 || ch > 0x7e) {
        return FileError("--token_file", files.token,
                         "the token holds a character outside printable ASCII (a line break "
                         "inside it?), which cannot be sent as gRPC metadata");
      }
    }
    c.token = std::string(token);
  }
  return c;
}

absl::StatusOr<std::vector<std::string>> CertificateNames(const std::string& cert_pem) {
  X509Ptr cert = FirstCertificate(cert_pem);
  if (!cert) return absl::InvalidArgumentError("holds no PEM certificate");
  std::vector<std::string> names;
  X509_NAME* subject = X509_get_subject_name(cert.get());
  const int cn = subject ? X509_NAME_get_index_by_NID(subject, NID_commonName, -1) : -1;
  if (cn >= 0) {
    unsigned char* utf8 = nullptr;
    const int n =
        ASN1_STRING_to_UTF8(&utf8, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, cn)));
    if (n >= 0) names.emplace_back(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
    OPENSSL_free(utf8);
  }
  auto* sans = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr));
  if (sans) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans); ++i) {
      const GENERAL_NAME* name = sk_GENERAL_NAME_value(sans, i);
      if (name->type != GEN_DNS) continue;
      const ASN1_STRING* dns = name->d.dNSName;
      names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                         static_cast<size_t>(ASN1_STRING_length(dns)));
    }
    GENERAL_NAMES_free(sans);
  }
  ERR_clear_error();
  return names;
}

}  // namespace tally::worker
