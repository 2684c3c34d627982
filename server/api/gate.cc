#include "server/api/gate.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/api/stream_limiter.h"

namespace tally::api {
namespace {

constexpr absl::string_view kTokenHint =
    "send `authorization: Bearer TOKEN` (tallyctl --token, TALLY_TOKEN or a --context with "
    "a token_file)";

// The names a verified client certificate carries: its CN and DNS SANs.
std::vector<std::string> CertificateNames(const grpc::ServerContextBase& context) {
  std::vector<std::string> names;
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return names;
  for (const char* property : {"x509_common_name", "x509_subject_alternative_name"}) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(property)) {
      std::string name(v.data(), v.size());
      if (!name.empty() && std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(std::move(name));
      }
    }
  }
  return names;
}

}  // namespace

bool WorkerIdentity::Allows(const std::string& worker_id) const {
  return anonymous || std::find(names.begin(), names.end(), worker_id) != names.end();
}

std::string WorkerIdentity::Describe() const {
  if (anonymous) return "anonymous";
  return absl::StrCat(method, " for ", absl::StrJoin(names, ", "));
}

absl::StatusOr<std::string> BearerToken(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto range = md.equal_range("authorization");
  if (range.first == range.second) return std::string();
  if (std::next(range.first) != range.second) {
    return absl::UnauthenticatedError("more than one authorization header; send one");
  }
  absl::string_view value(range.first->second.data(), range.first->second.size());
  constexpr absl::string_view kScheme = "bearer ";
  if (value.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kScheme.size()), kScheme)) {
    return absl::UnauthenticatedError(
        absl::StrCat("the authorization header is not a bearer token; ", kTokenHint));
  }
  return std::string(absl::StripAsciiWhitespace(value.substr(kScheme.size())));
}

bool CanSee(const auth::Principal& p, const std::string& tenant) {
  return p.role == auth::Role::kAdmin || p.tenant == tenant;
}

Gate::Gate(const Clock* clock, Credentials credentials)
    : clock_(clock),
      credentials_(std::make_shared<const Credentials>(std::move(credentials))) {}

void Gate::Reload(Credentials credentials) {
  auto next = std::make_shared<const Credentials>(std::move(credentials));
  absl::MutexLock lock(&mu_);
  credentials_ = std::move(next);
}

std::shared_ptr<const Credentials> Gate::Current() const {
  absl::MutexLock lock(&mu_);
  return credentials_;
}

bool Gate::users_authenticated() const { return Current()->users_authenticated(); }
bool Gate::workers_authenticated() const { return Current()->workers_authenticated(); }

absl::StatusOr<auth::Principal> Gate::AdmitUser(const grpc::ServerContextBase& context,
                                                Access access,
                                                absl::string_view what) const {
  std::shared_ptr<const Credentials> c = Current();
  if (!c->users_authenticated()) {
    auth::Principal anonymous;
    anonymous.name = "anonymous";
    anonymous.role = auth::Role::kAdmin;
    anonymous.method = "anonymous";
    return anonymous;
  }
  absl::StatusOr<std::string> token = BearerToken(context);
  if (!token.ok()) return token.status();
  if (token->empty()) {
    if (!CertificateNames(context).empty()) {
      return absl::PermissionDeniedError(absl::StrCat(
          "a worker certificate cannot call ", what, "; users ", kTokenHint));
    }
    return absl::UnauthenticatedError(absl::StrCat("no credentials: ", kTokenHint));
  }
  std::optional<auth::Principal> p;
  if (c->users != nullptr) p = c->users->Find(*token);
  if (!p && c->workers != nullptr && c->workers->Find(*token)) {
    return absl::PermissionDeniedError(
        absl::StrCat("a worker token cannot call ", what, "; use a user's token"));
  }
  if (!p && c->jwt != nullptr && std::count(token->begin(), token->end(), '.') == 2) {
    absl::StatusOr<auth::Principal> verified = c->jwt->Verify(*token, clock_->Now());
    if (!verified.ok()) {
      return absl::UnauthenticatedError(
          absl::StrCat("JWT refused: ", verified.status().message()));
    }
    p = std::move(*verified);
  }
  if (!p) return absl::UnauthenticatedError(absl::StrCat("unknown token; ", kTokenHint));
  if (p->role == auth::Role::kWorker) {
    return absl::PermissionDeniedError(
        absl::StrCat("a worker identity cannot call ", what, "; use a user's token"));
  }
  if (access == Access::kWrite && p->role == auth::Role::kViewer) {
    return absl::PermissionDeniedError(absl::StrCat(
        p->name, " is a viewer (read-only) and cannot call ", what,
        "; ask an admin for the user role"));
  }
  return *p;
}

absl::StatusOr<WorkerIdentity> Gate::AdmitWorker(const grpc::ServerContextBase& context) const {
  std::shared_ptr<const Credentials> c = Current();
  WorkerIdentity id;
  if (!c->workers_authenticated()) {
    id.anonymous = true;
    id.method = "anonymous";
    return id;
  }
  if (c->client_certificates) {
    std::vector<std::string> names = CertificateNames(context);
    if (!names.empty()) {
      id.method = "certificate";
      id.names = std::move(names);
      return id;
    }
  }
  absl::StatusOr<std::string> token = BearerToken(context);
  if (!token.ok()) return token.status();
  if (token->empty()) {
    return absl::UnauthenticatedError(
        "workers must authenticate: a client certificate signed by tallyd's --client_ca "
        "(tally-worker --tls_cert/--tls_key) or a worker token (tally-worker --token_file)");
  }
  if (c->workers != nullptr) {
    if (std::optional<auth::Principal> p = c->workers->Find(*token)) {
      id.method = "token";
      id.names = {p->name};
      return id;
    }
  }
  if (c->users != nullptr && c->users->Find(*token)) {
    return absl::PermissionDeniedError(
        "a user token cannot open a worker stream; give the worker a worker token "
        "(--worker_tokens) or a client certificate");
  }
  if (c->jwt != nullptr && std::count(token->begin(), token->end(), '.') == 2) {
    absl::StatusOr<auth::Principal> p = c->jwt->Verify(*token, clock_->Now());
    if (!p.ok()) {
      return absl::UnauthenticatedError(absl::StrCat("JWT refused: ", p.status().message()));
    }
    if (p->role != auth::Role::kWorker) {
      return absl::PermissionDeniedError(absl::StrCat(
          "a ", auth::RoleName(p->role), " identity cannot open a worker stream; its role "
          "claim must be worker"));
    }
    id.method = "jwt";
    id.names = {p->name};
    return id;
  }
  return absl::UnauthenticatedError("unknown worker token; check tally-worker --token_file");
}

}  // namespace tally::api
