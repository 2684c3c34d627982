// How a tally-worker proves who it is to tallyd, and checks tallyd:
//
// - --ca_cert: PEM certificates to verify tallyd's certificate against;
//   set, the worker connects with TLS.
// - --tls_cert / --tls_key: the worker's own certificate and private key
//   (PEM), for mutual TLS; both or neither, and only with --ca_cert. tallyd
//   accepts it when its CN or a DNS SAN equals the worker's --worker_id.
// - --token_file: a worker token, the file's content with surrounding
//   whitespace trimmed, sent as "authorization: Bearer TOKEN" metadata on the
//   Connect stream (over TLS or plaintext, for when TLS ends in front of
//   tallyd).
//
// The files are read when the worker starts and again before every
// connection, so certificates and tokens rotated on disk are picked up.
// Nothing here ever logs or formats the token.
#ifndef TALLY_WORKER_AGENT_CREDENTIALS_H_
#define TALLY_WORKER_AGENT_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/pem.h"

namespace tally::worker {

// The files named by the flags; an empty path: not used.
struct CredentialFiles {
  std::string ca_cert;
  std::string tls_cert;
  std::string tls_key;
  std::string token;

  // InvalidArgument naming the flags when they do not go together:
  // --tls_cert without --tls_key or the other way round, or either without
  // --ca_cert.
  absl::Status Validate() const;
  // "mutual TLS", "TLS" or "plaintext", then ", with a worker token" when
  // one is sent.
  std::string Describe() const;
};

// What the files held. Copyable; the token is a secret: never log it.
struct Credentials {
  std::string ca_pem;    // empty: plaintext
  std::string cert_pem;  // empty: no client certificate
  std::string key_pem;
  std::string token;     // empty: none sent
};

// Reads and checks every file named in `files` (which must Validate()).
// InvalidArgument naming the flag and the path when a file cannot be read,
// is larger than 1 MiB, holds no PEM certificate (--ca_cert, --tls_cert) or
// private key (--tls_key) OpenSSL can parse, when the key is not the
// certificate's, or when the token is empty or holds a character that cannot
// travel in gRPC metadata (outside printable ASCII).
absl::StatusOr<Credentials> LoadCredentials(const CredentialFiles& files);

// The names a PEM certificate carries (common/pem.h).
using ::tally::CertificateNames;

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_CREDENTIALS_H_
