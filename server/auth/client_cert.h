// Which worker ids a verified client certificate speaks for. The TLS layer
// has already checked the chain against --client_ca and the validity dates at
// the handshake; this reads the leaf (PEM) and applies tallyd's own rules:
//
// - a leaf with basicConstraints CA:TRUE is refused (a CA is not a worker);
// - keyUsage, when present, must include digitalSignature; when absent the
//   certificate is accepted (RFC 5280: no restriction);
// - extendedKeyUsage, when present, must include clientAuth (or
//   anyExtendedKeyUsage); when absent the certificate is accepted;
// - the worker ids are the subject's commonName and the DNS names of the
//   subjectAltName, and nothing else: URI, email and IP SANs never name a
//   worker. A leaf naming none is refused.
//
// Pure and thread-safe.
#ifndef TALLY_SERVER_AUTH_CLIENT_CERT_H_
#define TALLY_SERVER_AUTH_CLIENT_CERT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tally::auth {

struct ClientCertificate {
  // The commonName first (if any), then the DNS SANs, each once.
  std::vector<std::string> names;
  absl::Time not_after;  // the end of its validity
};

// The identity of the PEM leaf `pem`, or PERMISSION_DENIED naming the rule it
// breaks ("a CA certificate (basicConstraints CA:TRUE) cannot be a worker's
// client certificate", ...); INVALID_ARGUMENT when `pem` holds no
// certificate.
absl::StatusOr<ClientCertificate> ReadClientCertificate(absl::string_view pem);

}  // namespace tally::auth

#endif  // TALLY_SERVER_AUTH_CLIENT_CERT_H_
