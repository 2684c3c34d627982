// Start-up (and SIGHUP) checks of the PEM files tallyd serves TLS with, so a
// bad file is refused with the flag and path named before anything is
// served.
#ifndef TALLY_SERVER_API_TLS_FILES_H_
#define TALLY_SERVER_API_TLS_FILES_H_

#include <string>

#include "absl/status/status.h"

namespace tally::api {

// The flags the files came from, named in errors (without "--").
struct TlsFileFlags {
  std::string cert = "tls_cert";
  std::string key = "tls_key";
  std::string ca = "client_ca";
};

// OK when `cert` holds a PEM certificate, `key` an unencrypted PEM private
// key matching it and, unless `ca` is empty, `ca` a PEM certificate.
// InvalidArgument otherwise, naming the flag and the path: unreadable, no
// PEM certificate or key in it, or "is not the private key of". Reads the
// files; thread-safe.
absl::Status CheckTlsFiles(const std::string& cert, const std::string& key, const std::string& ca,
                           const TlsFileFlags& flags = {});

}  // namespace tally::api

#endif  // TALLY_SERVER_API_TLS_FILES_H_
