#include "server/wiring/credentials.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/auth/jwt.h"
#include "server/auth/token_file.h"

namespace tally::wiring {

absl::StatusOr<api::Credentials> LoadCredentials(
    const config::TallydOptions& options,
    std::vector<std::pair<std::string, std::string>>* failed) {
  api::Credentials c;
  c.client_certificates = !options.client_ca.empty();
  const auto load_tokens = [&](const std::string& flag, const std::string& path,
                               auth::TokenTable::Kind kind,
                               std::shared_ptr<const auth::TokenTable>* out) -> absl::Status {
    if (path.empty()) return absl::OkStatus();
    auto t = auth::TokenTable::Load(path, kind);
    if (t.ok()) {
      *out = std::make_shared<const auth::TokenTable>(std::move(*t));
      return absl::OkStatus();
    }
    absl::Status error(t.status().code(), absl::StrCat("--", flag, ": ", t.status().message()));
    if (failed == nullptr) return error;
    failed->emplace_back(flag, std::string(error.message()));
    *out = std::make_shared<const auth::TokenTable>(*auth::TokenTable::Parse("", kind, path));
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(load_tokens("auth_tokens", options.auth_tokens,
                              auth::TokenTable::Kind::kUsers, &c.users));
  RETURN_IF_ERROR(load_tokens("worker_tokens", options.worker_tokens,
                              auth::TokenTable::Kind::kWorkers, &c.workers));
  if (options.jwt_jwks.empty()) return c;
  auth::JwtOptions jo;
  jo.issuer = options.jwt_issuer;
  jo.audience = options.jwt_audience;
  jo.principal_claim = options.jwt_principal_claim;
  jo.tenant_claim = options.jwt_tenant_claim;
  jo.role_claim = options.jwt_role_claim;
  jo.max_lifetime = options.jwt_max_lifetime;
  auto v = auth::JwtVerifier::Load(options.jwt_jwks, jo);
  if (!v.ok()) {
    absl::Status error(v.status().code(), absl::StrCat("--jwt_jwks: ", v.status().message()));
    if (failed == nullptr) return error;
    failed->emplace_back("jwt_jwks", std::string(error.message()));
    c.jwt_refused = true;
    return c;
  }
  c.jwt = std::make_shared<const auth::JwtVerifier>(std::move(*v));
  return c;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(const config::TallydOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  const std::string& client_ca = options.client_ca;
  // The files are watched: a renewed certificate is served within 5 s.
  constexpr unsigned kRefreshSeconds = 5;
  auto provider =
      client_ca.empty()
          ? std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                options.tls_key, options.tls_cert, kRefreshSeconds)
          : std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
                options.tls_key, options.tls_cert, client_ca, kRefreshSeconds);
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_identity_key_cert_pairs();
  if (client_ca.empty()) {
    tls.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  } else {
    // Requested, not required: users call the same port with tokens.
    tls.watch_root_certs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  }
  return grpc::experimental::TlsServerCredentials(tls);
}

}  // namespace tally::wiring
