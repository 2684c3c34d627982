// Gate: who is calling tallyd, and may they make this call. Every Jobs and
// Experiments handler and every Workers.Connect stream is admitted here
// first; what each role may do (read or write, its own tenant or every
// tenant) lives in this one place. Each handler names its method's access
// (Access::kRead or kWrite) where it is admitted (services.cc's ADMIT_USER);
// gate_test pins every method's access against the protos' descriptors.
//
// Users present `authorization: Bearer TOKEN`: a token from --auth_tokens, or
// a JWT checked against --jwt_jwks. Workers present a client certificate
// (verified against --client_ca, then checked by auth::ReadClientCertificate:
// no CA:TRUE leaf, keyUsage/extendedKeyUsage fit for a client when present;
// its CN or a DNS SAN names the worker ids it may use), a token from
// --worker_tokens, or a JWT whose role claim is "worker": that JWT speaks for
// exactly one worker id, the value of its principal claim (`sub` by default).
// With no user authentication configured every caller is the anonymous admin
// (tallyd allows that only on loopback or with --insecure); likewise for
// workers.
//
// Tenancy: a principal with a tenant (viewer, user, or an admin with a
// tenant) sees and acts on its own tenant's jobs and experiments only; only an
// admin with an empty tenant is global (CanSee).
//
// Streams: a stream registered with WatchUserStream or WatchWorkerStream keeps
// what its caller presented. Reload and RecheckStreams admit it again (at the
// clock's now, so an expired JWT or client certificate is refused); a stream
// whose credential no longer admits the same principal is told once, through
// its callback, and ends itself. Reload re-checks against the new credentials
// before they take effect and again after, so by the time Reload returns every
// revoked stream has been told. main calls RecheckStreams every
// kStreamRecheckInterval, which bounds how long a stream outlives its
// credential's expiry (a JWT's exp plus the verifier's leeway, a
// certificate's notAfter).
//
// Thread-safe; Reload swaps the credentials atomically (SIGHUP).
#ifndef TALLY_SERVER_API_GATE_H_
#define TALLY_SERVER_API_GATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/auth/client_cert.h"
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
  // --jwt_jwks is configured but its file failed to load on a reload: every
  // JWT is refused (fail closed) until a reload succeeds. A token file that
  // fails to load on a reload is an empty table, likewise.
  bool jwt_refused = false;

  bool users_authenticated() const {
    return users != nullptr || jwt != nullptr || jwt_refused;
  }
  bool workers_authenticated() const {
    return workers != nullptr || jwt != nullptr || jwt_refused || client_certificates;
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

// Is `p` a global admin: role admin with an empty tenant (also the anonymous
// admin of a tallyd without user authentication)?
bool IsGlobalAdmin(const auth::Principal& p);

// May `p` see or act on something of `tenant`? A global admin sees every
// tenant; everyone else (a tenant admin included) only its own.
bool CanSee(const auth::Principal& p, const std::string& tenant);

// How often main re-checks open streams' credentials for expiry.
inline constexpr absl::Duration kStreamRecheckInterval = absl::Seconds(5);

// What a caller presented: its bearer token and its verified client
// certificate, read once from the call and kept by a stream to be admitted
// again later.
struct Presented {
  absl::StatusOr<std::string> bearer = std::string();  // "" when none
  // Set when the TLS layer verified a client certificate: its identity, or
  // why tallyd refuses it.
  std::optional<absl::StatusOr<auth::ClientCertificate>> certificate;
};
Presented ReadPresented(const grpc::ServerContextBase& context);

class Gate {
 public:
  // While alive, a stream registered with Watch*Stream is re-checked;
  // destroying it unregisters the stream. Move-only.
  class StreamWatch {
   public:
    StreamWatch() = default;
    StreamWatch(StreamWatch&& other) noexcept { *this = std::move(other); }
    StreamWatch& operator=(StreamWatch&& other) noexcept;
    ~StreamWatch() { Release(); }
    void Release();

   private:
    friend class Gate;
    StreamWatch(const Gate* gate, int64_t id) : gate_(gate), id_(id) {}
    const Gate* gate_ = nullptr;
    int64_t id_ = 0;
  };
  // Told once that a stream's credential was revoked or expired (the
  // refusal: UNAUTHENTICATED or PERMISSION_DENIED). Never called with the
  // gate's lock held; it may run on any thread, even while the stream is
  // being destroyed, so it should hold the stream weakly.
  using RevokedFn = std::function<void(const absl::Status&)>;

  Gate(const Clock* clock, Credentials credentials);

  // Swaps in `credentials` and ends every open stream they no longer admit
  // (see above). Returns the number of streams told.
  int Reload(Credentials credentials);
  bool users_authenticated() const;
  bool workers_authenticated() const;

  // A Jobs or Experiments call. UNAUTHENTICATED without valid credentials,
  // PERMISSION_DENIED for a worker credential or a viewer's write. `what`
  // names the call in messages ("SubmitJob").
  absl::StatusOr<auth::Principal> AdmitUser(const grpc::ServerContextBase& context,
                                            Access access, absl::string_view what) const;
  absl::StatusOr<auth::Principal> AdmitUser(const Presented& presented, Access access,
                                            absl::string_view what) const;

  // A Workers.Connect stream. UNAUTHENTICATED without a worker credential
  // (when workers must authenticate) or with an expired one,
  // PERMISSION_DENIED for a user's or for a client certificate that breaks
  // auth::ReadClientCertificate's rules.
  absl::StatusOr<WorkerIdentity> AdmitWorker(const grpc::ServerContextBase& context) const;
  absl::StatusOr<WorkerIdentity> AdmitWorker(const Presented& presented) const;

  // Registers an open stream admitted as `admitted` from `presented`;
  // `on_revoked` runs once if a later check admits someone else or nobody.
  StreamWatch WatchUserStream(Presented presented, Access access, std::string what,
                              const auth::Principal& admitted, RevokedFn on_revoked) const;
  StreamWatch WatchWorkerStream(Presented presented, const WorkerIdentity& admitted,
                                RevokedFn on_revoked) const;

  // Admits every registered stream again with the current credentials at
  // the clock's now; returns the number told they were revoked.
  int RecheckStreams() const;

  int64_t num_watched_streams() const;

  // Refuses every call with `why` (UNAVAILABLE: clients try another address
  // or retry) and ends every open stream with it, until Resume: a leader
  // whose lease lapsed, which may no longer be the leader. Returns the
  // number of streams ended.
  int Suspend(const absl::Status& why);
  void Resume();

 private:
  struct Watched;

  std::shared_ptr<const Credentials> Current() const;
  absl::StatusOr<auth::Principal> AdmitUserWith(const Credentials& c, const Presented& presented,
                                                Access access, absl::string_view what) const;
  absl::StatusOr<WorkerIdentity> AdmitWorkerWith(const Credentials& c,
                                                 const Presented& presented) const;
  absl::Status Suspended() const;
  StreamWatch Register(std::shared_ptr<Watched> watched) const;
  void Unregister(int64_t id) const;
  int RecheckAgainst(const Credentials& c) const;

  const Clock* const clock_;
  mutable absl::Mutex mu_;
  std::shared_ptr<const Credentials> credentials_ ABSL_GUARDED_BY(mu_);
  absl::Status suspended_ ABSL_GUARDED_BY(mu_);  // OK: serving
  mutable absl::Mutex streams_mu_;
  mutable int64_t next_stream_id_ ABSL_GUARDED_BY(streams_mu_) = 1;
  mutable std::map<int64_t, std::shared_ptr<Watched>> streams_ ABSL_GUARDED_BY(streams_mu_);
};

// `gate`, or without one (null) a gate that admits every caller as the
// anonymous admin.
const Gate* GateOr(const Gate* gate);

}  // namespace tally::api

#endif  // TALLY_SERVER_API_GATE_H_
