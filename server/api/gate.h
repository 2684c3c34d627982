// Gate: who is calling tallyd, and may they make this call. Every Jobs and
// Experiments handler and every Workers.Connect stream is admitted here
// first; the table of what each role may do lives in this one place.
//
// Users present `authorization: Bearer TOKEN`: a token from --auth_tokens, or
// a JWT checked against --jwt_jwks. Workers present a client certificate
// (verified against --client_ca; its CN or a DNS SAN names the worker ids it
// may use) or a token from --worker_tokens. With no user authentication
// configured every caller is the anonymous admin (tallyd allows that only on
// loopback or with --insecure); likewise for workers.
//
// Thread-safe; Reload swaps the credentials atomically (SIGHUP).
#ifndef TALLY_SERVER_API_GATE_H_
#define TALLY_SERVER_API_GATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/auth/jwt.h"
#include "server/auth/principal.h"
#include "server/auth/token_file.h"

namespace grpc {
class ServerContextBase;
}

namespace tally::api {

// What a user call does: reads (Get, List, Watch, checkpoints, estimates) or
// changes something (Submit, Cancel, Create and Cancel an experiment).
enum class Access { kRead, kWrite };

struct Credentials {
  std::shared_ptr<const auth::TokenTable> users;    // --auth_tokens; null: none
  std::shared_ptr<const auth::TokenTable> workers;  // --worker_tokens; null: none
  std::shared_ptr<const auth::JwtVerifier> jwt;     // --jwt_jwks; null: none
  // --client_ca: workers may authenticate with a client certificate.
  bool client_certificates = false;

  bool users_authenticated() const { return users != nullptr || jwt != nullptr; }
  bool workers_authenticated() const {
    return workers != nullptr || jwt != nullptr || client_certificates;
  }
};

// Who opened a Workers.Connect stream: the worker ids its credential names
// (any id when `anonymous`).
struct WorkerIdentity {
  bool anonymous = false;
  std::string method;              // "certificate", "token", "jwt", "anonymous"
  std::vector<std::string> names;  // the ids it may speak for
  bool Allows(const std::string& worker_id) const;
  std::string Describe() const;    // "certificate for w1", "anonymous"
};

// The bearer token of a call's `authorization` metadata; empty when there is
// none. INVALID... is not used: a malformed header is UNAUTHENTICATED.
absl::StatusOr<std::string> BearerToken(const grpc::ServerContextBase& context);

// May `p` see or act on something of `tenant`? Admins see every tenant.
bool CanSee(const auth::Principal& p, const std::string& tenant);

class Gate {
 public:
  Gate(const Clock* clock, Credentials credentials);

  void Reload(Credentials credentials);
  bool users_authenticated() const;
  bool workers_authenticated() const;

  // A Jobs or Experiments call. UNAUTHENTICATED without valid credentials,
  // PERMISSION_DENIED for a worker credential or a viewer's write. `what`
  // names the call in messages ("SubmitJob").
  absl::StatusOr<auth::Principal> AdmitUser(const grpc::ServerContextBase& context,
                                            Access access, absl::string_view what) const;

  // A Workers.Connect stream. UNAUTHENTICATED without a worker credential
  // (when workers must authenticate), PERMISSION_DENIED for a user's.
  absl::StatusOr<WorkerIdentity> AdmitWorker(const grpc::ServerContextBase& context) const;

 private:
  std::shared_ptr<const Credentials> Current() const;

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Credentials> credentials_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_GATE_H_
