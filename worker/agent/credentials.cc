#include "worker/agent/credentials.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/pem.h"

namespace tally::worker {
namespace {

absl::Status FileError(absl::string_view flag, const std::string& path,
                       absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, ": ", what));
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
    absl::StatusOr<std::string> pem = ReadFlagFile("ca_cert", files.ca_cert);
    if (!pem.ok()) return pem.status();
    if (absl::Status s = CheckPemCertificates("ca_cert", files.ca_cert, *pem); !s.ok()) return s;
    c.ca_pem = *std::move(pem);
  }
  if (!files.tls_cert.empty()) {
    absl::StatusOr<std::string> cert_pem = ReadFlagFile("tls_cert", files.tls_cert);
    if (!cert_pem.ok()) return cert_pem.status();
    if (absl::Status s = CheckPemCertificates("tls_cert", files.tls_cert, *cert_pem); !s.ok()) {
      return s;
    }
    absl::StatusOr<std::string> key_pem = ReadFlagFile("tls_key", files.tls_key);
    if (!key_pem.ok()) return key_pem.status();
    if (absl::Status s = CheckPemKeyPair("tls_cert", files.tls_cert, *cert_pem, "tls_key",
                                         files.tls_key, *key_pem);
        !s.ok()) {
      return s;
    }
    c.cert_pem = *std::move(cert_pem);
    c.key_pem = *std::move(key_pem);
  }
  if (!files.token.empty()) {
    absl::StatusOr<std::string> bytes = ReadSmallFile(files.token, kMaxPemFileBytes);
    if (!bytes.ok()) {
      return FileError("--token_file", files.token,
                       absl::StrCat("cannot read it: ", bytes.status().message()));
    }
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

}  // namespace tally::worker
