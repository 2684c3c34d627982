#include "server/auth/client_cert.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "openssl/asn1.h"
#include "openssl/bio.h"
#include "openssl/objects.h"
#include "openssl/pem.h"
#include "openssl/x509.h"
#include "openssl/x509v3.h"
#include "server/auth/principal.h"

namespace tally::auth {
namespace {

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct NamesFree {
  void operator()(GENERAL_NAMES* n) const { GENERAL_NAMES_free(n); }
};

// A name usable as a worker id: bounded, no NUL, printable ASCII.
bool UsableName(const unsigned char* data, int length) {
  if (data == nullptr || length <= 0 || static_cast<size_t>(length) > kMaxPrincipalFieldBytes) {
    return false;
  }
  return std::all_of(data, data + length, [](unsigned char c) { return c > 0x20 && c < 0x7f; });
}

void AddName(std::vector<std::string>* names, const unsigned char* data, int length) {
  if (!UsableName(data, length)) return;
  std::string name(reinterpret_cast<const char*>(data), static_cast<size_t>(length));
  if (std::find(names->begin(), names->end(), name) == names->end()) {
    names->push_back(std::move(name));
  }
}

}  // namespace

absl::StatusOr<ClientCertificate> ReadClientCertificate(absl::string_view pem) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  if (bio == nullptr) return absl::InvalidArgumentError("client certificate: cannot be read");
  std::unique_ptr<X509, X509Free> cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError("client certificate: no PEM certificate in it");
  }
  // Caches the extensions and flags them; an unparsable one is invalid.
  const uint32_t flags = X509_get_extension_flags(cert.get());
  if (flags & EXFLAG_INVALID) {
    return absl::PermissionDeniedError(
        "client certificate: an extension cannot be parsed; issue a new certificate");
  }
  if (X509_check_ca(cert.get()) != 0 || (flags & EXFLAG_CA)) {
    return absl::PermissionDeniedError(
        "client certificate: a CA certificate (basicConstraints CA:TRUE) cannot be a worker's "
        "client certificate; issue a leaf with CA:FALSE");
  }
  if ((flags & EXFLAG_KUSAGE) && !(X509_get_key_usage(cert.get()) & KU_DIGITAL_SIGNATURE)) {
    return absl::PermissionDeniedError(
        "client certificate: its keyUsage lacks digitalSignature; issue it with keyUsage "
        "digitalSignature");
  }
  if ((flags & EXFLAG_XKUSAGE) &&
      !(X509_get_extended_key_usage(cert.get()) & (XKU_SSL_CLIENT | XKU_ANYEKU))) {
    return absl::PermissionDeniedError(
        "client certificate: its extendedKeyUsage lacks clientAuth; issue it with "
        "extendedKeyUsage clientAuth");
  }

  ClientCertificate out;
  const X509_NAME* subject = X509_get_subject_name(cert.get());
  for (int i = X509_NAME_get_index_by_NID(subject, NID_commonName, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(subject, NID_commonName, i)) {
    const ASN1_STRING* cn = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, i));
    AddName(&out.names, ASN1_STRING_get0_data(cn), ASN1_STRING_length(cn));
  }
  std::unique_ptr<GENERAL_NAMES, NamesFree> sans(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  if (sans != nullptr) {
    for (int i = 0; i < sk_GENERAL_NAME_num(sans.get()); ++i) {
      const GENERAL_NAME* san = sk_GENERAL_NAME_value(sans.get(), i);
      // DNS names only: URI, email and IP SANs never name a worker.
      if (san->type != GEN_DNS) continue;
      AddName(&out.names, ASN1_STRING_get0_data(san->d.dNSName),
              ASN1_STRING_length(san->d.dNSName));
    }
  }
  if (out.names.empty()) {
    return absl::PermissionDeniedError(
        "client certificate: names no worker; put the worker id in the subject CN or a DNS "
        "subjectAltName (URI, email and IP names are not used)");
  }

  struct tm tm = {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &tm) != 1) {
    return absl::PermissionDeniedError("client certificate: its notAfter cannot be read");
  }
  out.not_after = absl::FromTM(tm, absl::UTCTimeZone());
  return out;
}

}  // namespace tally::auth
