#include "server/api/tls_files.h"

#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tally::api {

absl::Status CheckTlsFiles(const std::string& cert, const std::string& key, const std::string& ca,
                           const TlsFileFlags& flags) {
  auto open = [](const std::string& flag, const std::string& path) -> absl::StatusOr<FILE*> {
    FILE* f = std::fopen(path.c_str(), "r");
    if (f == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, ": cannot read ", path, ": ", std::strerror(errno)));
    }
    return f;
  };
  auto x509_error = [](const std::string& flag, const std::string& path, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", path, " holds no PEM ", what));
  };
  // A passphrase callback that gives none: an encrypted key fails instead of
  // prompting on the terminal.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  ASSIGN_OR_RETURN(FILE * cf, open(flags.cert, cert));
  X509* x = PEM_read_X509(cf, nullptr, no_passphrase, nullptr);
  std::fclose(cf);
  if (x == nullptr) return x509_error(flags.cert, cert, "certificate");
  absl::StatusOr<FILE*> kf = open(flags.key, key);
  if (!kf.ok()) {
    X509_free(x);
    return kf.status();
  }
  EVP_PKEY* k = PEM_read_PrivateKey(*kf, nullptr, no_passphrase, nullptr);
  std::fclose(*kf);
  if (k == nullptr) {
    X509_free(x);
    return x509_error(flags.key, key, "private key (an encrypted key is not supported)");
  }
  const bool match = X509_check_private_key(x, k) == 1;
  X509_free(x);
  EVP_PKEY_free(k);
  if (!match) {
    return absl::InvalidArgumentError(absl::StrCat("--", flags.key, ": ", key,
                                                   " is not the private key of the certificate "
                                                   "in --",
                                                   flags.cert, " ", cert));
  }
  if (!ca.empty()) {
    ASSIGN_OR_RETURN(FILE * af, open(flags.ca, ca));
    X509* root = PEM_read_X509(af, nullptr, no_passphrase, nullptr);
    std::fclose(af);
    if (root == nullptr) return x509_error(flags.ca, ca, "certificate");
    X509_free(root);
  }
  return absl::OkStatus();
}

}  // namespace tally::api
