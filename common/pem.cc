#include "common/pem.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/file/file_system.h"

namespace tally {
namespace {

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

BioPtr MemBio(const std::string& bytes) {
  return BioPtr(BIO_new_mem_buf(bytes.data(), static_cast<int>(bytes.size())));
}

X509Ptr FirstCertificate(const std::string& pem) {
  BioPtr bio = MemBio(pem);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  ERR_clear_error();
  return cert;
}

absl::Status NoPem(absl::string_view flag, const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", path, " holds no PEM ", what));
}

}  // namespace

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(std::strerror(errno));
  }
  absl::StatusOr<std::string> bytes = file::ReadAtMost(in, max_bytes);
  if (!bytes.ok()) return absl::InvalidArgumentError("a read failed");
  if (bytes->size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("larger than ", max_bytes, " bytes"));
  }
  return bytes;
}

absl::StatusOr<std::string> ReadFlagFile(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadSmallFile(path, kMaxPemFileBytes);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": cannot read ", path, ": ", bytes.status().message()));
  }
  return bytes;
}

absl::Status CheckPemCertificates(absl::string_view flag, const std::string& path,
                                  const std::string& pem) {
  if (!FirstCertificate(pem)) return NoPem(flag, path, "certificate");
  return absl::OkStatus();
}

absl::Status CheckPemKeyPair(absl::string_view cert_flag, const std::string& cert_path,
                             const std::string& cert_pem, absl::string_view key_flag,
                             const std::string& key_path, const std::string& key_pem) {
  X509Ptr cert = FirstCertificate(cert_pem);
  if (!cert) return NoPem(cert_flag, cert_path, "certificate");
  BioPtr bio = MemBio(key_pem);
  PkeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, NoPassphrase, nullptr) : nullptr);
  ERR_clear_error();
  if (!key) return NoPem(key_flag, key_path, "private key (an encrypted key is not supported)");
  const bool match = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!match) {
    return absl::InvalidArgumentError(absl::StrCat("--", key_flag, ": ", key_path,
                                                   " is not the private key of the certificate "
                                                   "in --",
                                                   cert_flag, " ", cert_path));
  }
  return absl::OkStatus();
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

}  // namespace tally
