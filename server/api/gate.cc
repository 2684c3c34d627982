#include "server/api/gate.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/auth_context.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "server/api/stream_limiter.h"

namespace tally::api {
namespace {

constexpr absl::string_view kTokenHint =
    "send `authorization: Bearer TOKEN` (tallyctl --token, TALLY_TOKEN or a --context with "
    "a token_file)";

constexpr absl::string_view kJwtRefused =
    "JWT refused: tallyd's --jwt_jwks file failed to load at the last reload, so every JWT "
    "is refused until it is fixed and tallyd reloaded (SIGHUP)";

// The leaf a verified client certificate, as gRPC hands it over.
std::optional<std::string> PeerCertificate(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) return std::nullopt;
  std::vector<grpc::string_ref> pem = auth->FindPropertyValues("x509_pem_cert");
  if (pem.empty()) return std::nullopt;
  return std::string(pem.front().data(), pem.front().size());
}

bool SamePrincipal(const auth::Principal& a, const auth::Principal& b) {
  return a.name == b.name && a.tenant == b.tenant && a.role == b.role && a.method == b.method;
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

bool IsGlobalAdmin(const auth::Principal& p) {
  return p.role == auth::Role::kAdmin && p.tenant.empty();
}

bool CanSee(const auth::Principal& p, const std::string& tenant) {
  return IsGlobalAdmin(p) || p.tenant == tenant;
}

Presented ReadPresented(const grpc::ServerContextBase& context) {
  Presented p;
  p.bearer = BearerToken(context);
  if (std::optional<std::string> pem = PeerCertificate(context)) {
    p.certificate = auth::ReadClientCertificate(*pem);
  }
  return p;
}

// One registered stream.
struct Gate::Watched {
  Presented presented;
  bool worker = false;
  Access access = Access::kRead;
  std::string what;
  auth::Principal user;   // admitted as, for a user stream
  std::string worker_as;  // WorkerIdentity::Describe(), for a worker stream
  RevokedFn on_revoked;
  bool revoked = false;  // guarded by the gate's streams_mu_
};

Gate::StreamWatch& Gate::StreamWatch::operator=(StreamWatch&& other) noexcept {
  if (this != &other) {
    Release();
    gate_ = other.gate_;
    id_ = other.id_;
    other.gate_ = nullptr;
  }
  return *this;
}

void Gate::StreamWatch::Release() {
  if (gate_ != nullptr) gate_->Unregister(id_);
  gate_ = nullptr;
}

Gate::Gate(const Clock* clock, Credentials credentials)
    : clock_(clock),
      credentials_(std::make_shared<const Credentials>(std::move(credentials))) {}

int Gate::Reload(Credentials credentials) {
  auto next = std::make_shared<const Credentials>(std::move(credentials));
  // First against the new credentials, before they admit anything: a
  // revoked worker leaves the scheduler before it could be offered work
  // under them. Then again, for a stream admitted by the old ones meanwhile.
  int ended = RecheckAgainst(*next);
  {
    absl::MutexLock lock(&mu_);
    credentials_ = next;
  }
  return ended + RecheckAgainst(*next);
}

Gate::StreamWatch Gate::WatchUserStream(Presented presented, Access access, std::string what,
                                        const auth::Principal& admitted,
                                        RevokedFn on_revoked) const {
  auto w = std::make_shared<Watched>();
  w->presented = std::move(presented);
  w->access = access;
  w->what = std::move(what);
  w->user = admitted;
  w->on_revoked = std::move(on_revoked);
  return Register(std::move(w));
}

Gate::StreamWatch Gate::WatchWorkerStream(Presented presented, const WorkerIdentity& admitted,
                                          RevokedFn on_revoked) const {
  auto w = std::make_shared<Watched>();
  w->presented = std::move(presented);
  w->worker = true;
  w->worker_as = admitted.Describe();
  w->on_revoked = std::move(on_revoked);
  return Register(std::move(w));
}

Gate::StreamWatch Gate::Register(std::shared_ptr<Watched> watched) const {
  absl::MutexLock lock(&streams_mu_);
  const int64_t id = next_stream_id_++;
  streams_.emplace(id, std::move(watched));
  return StreamWatch(this, id);
}

void Gate::Unregister(int64_t id) const {
  absl::MutexLock lock(&streams_mu_);
  streams_.erase(id);
}

int64_t Gate::num_watched_streams() const {
  absl::MutexLock lock(&streams_mu_);
  return static_cast<int64_t>(streams_.size());
}

int Gate::RecheckStreams() const { return RecheckAgainst(*Current()); }

int Gate::RecheckAgainst(const Credentials& c) const {
  std::vector<std::shared_ptr<Watched>> all;
  {
    absl::MutexLock lock(&streams_mu_);
    all.reserve(streams_.size());
    for (const auto& [id, w] : streams_) {
      if (!w->revoked) all.push_back(w);
    }
  }
  std::vector<std::pair<std::shared_ptr<Watched>, absl::Status>> refused;
  for (const std::shared_ptr<Watched>& w : all) {
    absl::Status why;
    if (w->worker) {
      absl::StatusOr<WorkerIdentity> id = AdmitWorkerWith(c, w->presented);
      if (!id.ok()) {
        why = id.status();
      } else if (id->Describe() != w->worker_as) {
        why = absl::PermissionDeniedError(absl::StrCat(
            "this stream's credential now speaks for ", id->Describe(), ", not ", w->worker_as,
            "; reconnect"));
      }
    } else {
      absl::StatusOr<auth::Principal> p = AdmitUserWith(c, w->presented, w->access, w->what);
      if (!p.ok()) {
        why = p.status();
      } else if (!SamePrincipal(*p, w->user)) {
        why = absl::PermissionDeniedError(
            "this stream's credential now names another principal, role or tenant; call again");
      }
    }
    if (!why.ok()) refused.emplace_back(w, std::move(why));
  }
  int told = 0;
  for (auto& [w, why] : refused) {
    {
      absl::MutexLock lock(&streams_mu_);
      if (w->revoked) continue;
      w->revoked = true;
    }
    ++told;
    w->on_revoked(absl::Status(
        why.code(), absl::StrCat("the credential of this stream was revoked or expired: ",
                                 why.message())));
  }
  return told;
}

std::shared_ptr<const Credentials> Gate::Current() const {
  absl::MutexLock lock(&mu_);
  return credentials_;
}

bool Gate::users_authenticated() const { return Current()->users_authenticated(); }
bool Gate::workers_authenticated() const { return Current()->workers_authenticated(); }

absl::Status Gate::Suspended() const {
  absl::MutexLock lock(&mu_);
  return suspended_;
}

int Gate::Suspend(const absl::Status& why) {
  {
    absl::MutexLock lock(&mu_);
    suspended_ = why;
  }
  std::vector<std::shared_ptr<Watched>> all;
  {
    absl::MutexLock lock(&streams_mu_);
    for (const auto& [id, w] : streams_) {
      if (!w->revoked) {
        w->revoked = true;
        all.push_back(w);
      }
    }
  }
  for (const auto& w : all) w->on_revoked(why);
  return static_cast<int>(all.size());
}

void Gate::Resume() {
  absl::MutexLock lock(&mu_);
  suspended_ = absl::OkStatus();
}

absl::StatusOr<auth::Principal> Gate::AdmitUser(const grpc::ServerContextBase& context,
                                                Access access,
                                                absl::string_view what) const {
  RETURN_IF_ERROR(Suspended());
  return AdmitUserWith(*Current(), ReadPresented(context), access, what);
}

absl::StatusOr<auth::Principal> Gate::AdmitUser(const Presented& presented, Access access,
                                                absl::string_view what) const {
  RETURN_IF_ERROR(Suspended());
  return AdmitUserWith(*Current(), presented, access, what);
}

absl::StatusOr<auth::Principal> Gate::AdmitUserWith(const Credentials& cr,
                                                    const Presented& presented, Access access,
                                                    absl::string_view what) const {
  const Credentials* c = &cr;
  if (!c->users_authenticated()) {
    auth::Principal anonymous;
    anonymous.name = "anonymous";
    anonymous.role = auth::Role::kAdmin;
    anonymous.method = "anonymous";
    return anonymous;
  }
  const absl::StatusOr<std::string>& token = presented.bearer;
  if (!token.ok()) return token.status();
  if (token->empty()) {
    if (presented.certificate.has_value()) {
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
  if (!p && c->jwt == nullptr && c->jwt_refused &&
      std::count(token->begin(), token->end(), '.') == 2) {
    return absl::UnauthenticatedError(kJwtRefused);
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
  RETURN_IF_ERROR(Suspended());
  return AdmitWorkerWith(*Current(), ReadPresented(context));
}

absl::StatusOr<WorkerIdentity> Gate::AdmitWorker(const Presented& presented) const {
  RETURN_IF_ERROR(Suspended());
  return AdmitWorkerWith(*Current(), presented);
}

absl::StatusOr<WorkerIdentity> Gate::AdmitWorkerWith(const Credentials& cr,
                                                     const Presented& presented) const {
  const Credentials* c = &cr;
  WorkerIdentity id;
  if (!c->workers_authenticated()) {
    id.anonymous = true;
    id.method = "anonymous";
    return id;
  }
  if (c->client_certificates && presented.certificate.has_value()) {
    const absl::StatusOr<auth::ClientCertificate>& cert = *presented.certificate;
    if (!cert.ok()) return cert.status();
    if (clock_->Now() >= cert->not_after) {
      return absl::UnauthenticatedError(
          "the client certificate has expired (notAfter passed); give the worker a new one");
    }
    id.method = "certificate";
    id.names = cert->names;
    return id;
  }
  const absl::StatusOr<std::string>& token = presented.bearer;
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
  if (c->jwt == nullptr && c->jwt_refused &&
      std::count(token->begin(), token->end(), '.') == 2) {
    return absl::UnauthenticatedError(kJwtRefused);
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

const Gate* GateOr(const Gate* gate) {
  static const RealClock clock;
  static const Gate* const open = new Gate(&clock, Credentials());
  return gate != nullptr ? gate : open;
}

}  // namespace tally::api
