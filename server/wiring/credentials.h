// tallyd's transport and credentials, built from its flags: the gRPC
// server's TLS credentials and the tables that authenticate callers.
#ifndef TALLY_SERVER_WIRING_CREDENTIALS_H_
#define TALLY_SERVER_WIRING_CREDENTIALS_H_

#include <grpcpp/security/server_credentials.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/api/gate.h"
#include "server/config/tallyd_options.h"

namespace tally::wiring {

// Reads the credentials files (--auth_tokens, --worker_tokens, --jwt_jwks);
// errors name the flag and the path. At start (`failed` null) the first bad
// file is the error. On a reload (`failed` set) a bad file fails closed: a
// token file becomes an empty table and a bad --jwt_jwks refuses every JWT,
// until a later reload reads it; each is appended to `failed` as
// {flag, error}. Expects options that passed Validate().
absl::StatusOr<api::Credentials> LoadCredentials(
    const config::TallydOptions& options,
    std::vector<std::pair<std::string, std::string>>* failed = nullptr);

// Plaintext without --tls_cert; else TLS from files that are watched (a
// renewed certificate is served within 5 s), asking for a client
// certificate signed by --client_ca when one is given.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const config::TallydOptions& options);

}  // namespace tally::wiring

#endif  // TALLY_SERVER_WIRING_CREDENTIALS_H_
