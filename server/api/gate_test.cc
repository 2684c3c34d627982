#include "server/api/gate.h"

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "openssl/bn.h"
#include "openssl/core_names.h"
#include "openssl/evp.h"
#include "openssl/rsa.h"
#include "server/api/gate_test_util.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/jobs.pb.h"

namespace tally::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string B64(absl::string_view data) {
  std::string out;
  absl::WebSafeBase64Escape(data, &out);
  return out;
}

std::string BnBytes(const BIGNUM* bn) {
  std::string out(BN_num_bytes(bn), '\0');
  BN_bn2bin(bn, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

// An RSA key, its JWK Set, and RS256 tokens signed with it.
class Issuer {
 public:
  Issuer() : key_(EVP_RSA_gen(2048)) {}
  ~Issuer() { EVP_PKEY_free(key_); }

  std::shared_ptr<const auth::JwtVerifier> Verifier() const {
    BIGNUM* n = nullptr;
    BIGNUM* e = nullptr;
    EVP_PKEY_get_bn_param(key_, OSSL_PKEY_PARAM_RSA_N, &n);
    EVP_PKEY_get_bn_param(key_, OSSL_PKEY_PARAM_RSA_E, &e);
    Json jwks = {
        {"keys",
         {{{"kty", "RSA"}, {"kid", "k1"}, {"n", B64(BnBytes(n))}, {"e", B64(BnBytes(e))}}}}};
    BN_free(n);
    BN_free(e);
    auth::JwtOptions options;
    options.issuer = "iss";
    options.audience = "tally";
    absl::StatusOr<auth::JwtVerifier> v = auth::JwtVerifier::Create(jwks.dump(), options, "jwks");
    EXPECT_TRUE(v.ok()) << v.status();
    return std::make_shared<const auth::JwtVerifier>(*std::move(v));
  }

  std::string Token(const std::string& sub, const std::string& role, absl::Time exp,
                    const std::string& tenant = "") const {
    Json claims = {{"iss", "iss"},
                   {"aud", "tally"},
                   {"sub", sub},
                   {"role", role},
                   {"exp", absl::ToUnixSeconds(exp)}};
    if (!tenant.empty()) claims["tenant"] = tenant;
    const std::string input =
        absl::StrCat(B64(Json{{"alg", "RS256"}, {"kid", "k1"}}.dump()), ".", B64(claims.dump()));
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key_);
    size_t len = 0;
    EVP_DigestSign(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(input.data()),
                   input.size());
    std::string sig(len, '\0');
    EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                   reinterpret_cast<const unsigned char*>(input.data()), input.size());
    EVP_MD_CTX_free(ctx);
    sig.resize(len);
    return absl::StrCat(input, ".", B64(sig));
  }

 private:
  EVP_PKEY* key_;
};

Presented Bearer(const std::string& token) {
  Presented p;
  p.bearer = token;
  return p;
}

// What a stream's revocation callback saw.
struct Told {
  int times = 0;
  absl::Status why;
  Gate::RevokedFn Fn() {
    return [this](const absl::Status& s) {
      ++times;
      why = s;
    };
  }
};

class GateTest : public ::testing::Test {
 protected:
  Credentials Base() const {
    Credentials c;
    c.users = TokenTableOf({{"alice", "research", "user", "tok-alice"},
                            {"bob", "dev", "user", "tok-bob"},
                            {"ra", "research", "admin", "tok-ra"},
                            {"ops", "", "admin", "tok-ops"}},
                           auth::TokenTable::Kind::kUsers);
    c.workers = TokenTableOf({{"w1", "", "worker", "tok-w1"}, {"w2", "", "worker", "tok-w2"}},
                             auth::TokenTable::Kind::kWorkers);
    c.jwt = issuer_.Verifier();
    c.client_certificates = true;
    return c;
  }

  FakeClock clock_;
  Issuer issuer_;
};

TEST_F(GateTest, OnlyAnAdminWithNoTenantIsGlobal) {
  Gate gate(&clock_, Base());
  absl::StatusOr<auth::Principal> ra =
      gate.AdmitUser(Bearer("tok-ra"), Access::kWrite, "CancelJob");
  absl::StatusOr<auth::Principal> ops =
      gate.AdmitUser(Bearer("tok-ops"), Access::kWrite, "CancelJob");
  absl::StatusOr<auth::Principal> alice =
      gate.AdmitUser(Bearer("tok-alice"), Access::kRead, "GetJob");
  ASSERT_TRUE(ra.ok() && ops.ok() && alice.ok());
  EXPECT_FALSE(IsGlobalAdmin(*ra));
  EXPECT_TRUE(CanSee(*ra, "research"));
  EXPECT_FALSE(CanSee(*ra, "dev")) << "a tenant admin acts within its tenant only";
  EXPECT_TRUE(IsGlobalAdmin(*ops));
  EXPECT_TRUE(CanSee(*ops, "dev"));
  EXPECT_TRUE(CanSee(*ops, "research"));
  EXPECT_FALSE(IsGlobalAdmin(*alice));
  EXPECT_FALSE(CanSee(*alice, "dev"));
}

TEST_F(GateTest, AReloadEndsTheStreamsOfRemovedTokensBeforeItReturns) {
  Gate gate(&clock_, Base());
  Told alice_told, bob_told, w1_told, w2_told;
  absl::StatusOr<auth::Principal> alice =
      gate.AdmitUser(Bearer("tok-alice"), Access::kRead, "WatchJob");
  absl::StatusOr<auth::Principal> bob =
      gate.AdmitUser(Bearer("tok-bob"), Access::kRead, "WatchJob");
  absl::StatusOr<WorkerIdentity> w1 = gate.AdmitWorker(Bearer("tok-w1"));
  absl::StatusOr<WorkerIdentity> w2 = gate.AdmitWorker(Bearer("tok-w2"));
  ASSERT_TRUE(alice.ok() && bob.ok() && w1.ok() && w2.ok());
  Gate::StreamWatch a =
      gate.WatchUserStream(Bearer("tok-alice"), Access::kRead, "WatchJob", *alice, alice_told.Fn());
  Gate::StreamWatch b =
      gate.WatchUserStream(Bearer("tok-bob"), Access::kRead, "WatchJob", *bob, bob_told.Fn());
  Gate::StreamWatch x = gate.WatchWorkerStream(Bearer("tok-w1"), *w1, w1_told.Fn());
  Gate::StreamWatch y = gate.WatchWorkerStream(Bearer("tok-w2"), *w2, w2_told.Fn());
  EXPECT_EQ(gate.num_watched_streams(), 4);
  EXPECT_EQ(gate.RecheckStreams(), 0);

  Credentials next = Base();
  next.users = TokenTableOf({{"bob", "dev", "user", "tok-bob"}}, auth::TokenTable::Kind::kUsers);
  next.workers = TokenTableOf({{"w2", "", "worker", "tok-w2"}}, auth::TokenTable::Kind::kWorkers);
  EXPECT_EQ(gate.Reload(next), 2);
  EXPECT_EQ(alice_told.times, 1);
  EXPECT_EQ(alice_told.why.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(alice_told.why.message(), HasSubstr("revoked or expired"));
  EXPECT_EQ(w1_told.times, 1);
  EXPECT_EQ(w1_told.why.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(bob_told.times, 0);
  EXPECT_EQ(w2_told.times, 0);
  // Told once, however many checks follow.
  EXPECT_EQ(gate.Reload(next), 0);
  EXPECT_EQ(gate.RecheckStreams(), 0);
  EXPECT_EQ(alice_told.times, 1);
  // A stream that ended is not checked any more.
  b = Gate::StreamWatch();
  y.Release();
  EXPECT_EQ(gate.num_watched_streams(), 2);
  EXPECT_EQ(gate.Reload(Credentials{.users = next.users}), 0);
  EXPECT_EQ(bob_told.times, 0);
}

TEST_F(GateTest, SuspendRefusesEveryCallAndEndsEveryStreamUntilResume) {
  Gate gate(&clock_, Base());
  Told alice_told, w1_told;
  absl::StatusOr<auth::Principal> alice =
      gate.AdmitUser(Bearer("tok-alice"), Access::kRead, "WatchJob");
  absl::StatusOr<WorkerIdentity> w1 = gate.AdmitWorker(Bearer("tok-w1"));
  ASSERT_TRUE(alice.ok() && w1.ok());
  Gate::StreamWatch a =
      gate.WatchUserStream(Bearer("tok-alice"), Access::kRead, "WatchJob", *alice, alice_told.Fn());
  Gate::StreamWatch x = gate.WatchWorkerStream(Bearer("tok-w1"), *w1, w1_told.Fn());
  const absl::Status why = absl::UnavailableError("the lease has lapsed");
  EXPECT_EQ(gate.Suspend(why), 2);
  EXPECT_EQ(alice_told.times, 1);
  EXPECT_EQ(alice_told.why, why);
  EXPECT_EQ(w1_told.times, 1);
  EXPECT_EQ(w1_told.why, why);
  EXPECT_EQ(gate.AdmitUser(Bearer("tok-alice"), Access::kRead, "GetJob").status(), why);
  EXPECT_EQ(gate.AdmitWorker(Bearer("tok-w1")).status(), why);
  // Ended streams are not told again; a check finds nothing to end.
  EXPECT_EQ(gate.Suspend(why), 0);
  EXPECT_EQ(gate.RecheckStreams(), 0);
  gate.Resume();
  EXPECT_TRUE(gate.AdmitUser(Bearer("tok-alice"), Access::kRead, "GetJob").ok());
  EXPECT_TRUE(gate.AdmitWorker(Bearer("tok-w1")).ok());
  // Bad credentials are still refused as such.
  EXPECT_EQ(gate.AdmitUser(Bearer("tok-nobody"), Access::kRead, "GetJob").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(GateTest, AStreamWhoseTokenNowNamesAnotherRoleOrTenantEnds) {
  Gate gate(&clock_, Base());
  Told told;
  absl::StatusOr<auth::Principal> alice =
      gate.AdmitUser(Bearer("tok-alice"), Access::kRead, "WatchJob");
  ASSERT_TRUE(alice.ok());
  Gate::StreamWatch a =
      gate.WatchUserStream(Bearer("tok-alice"), Access::kRead, "WatchJob", *alice, told.Fn());
  Credentials next = Base();
  next.users =
      TokenTableOf({{"alice", "dev", "user", "tok-alice"}}, auth::TokenTable::Kind::kUsers);
  EXPECT_EQ(gate.Reload(next), 1);
  EXPECT_EQ(told.why.code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(GateTest, AnExpiredJwtEndsItsStreamAtTheNextRecheck) {
  Gate gate(&clock_, Base());
  // exp two minutes from now; the verifier allows 60 s of skew.
  const std::string token =
      issuer_.Token("alice", "user", clock_.Now() + absl::Minutes(2), "research");
  absl::StatusOr<auth::Principal> alice = gate.AdmitUser(Bearer(token), Access::kRead, "WatchJob");
  ASSERT_TRUE(alice.ok()) << alice.status();
  Told told;
  Gate::StreamWatch a =
      gate.WatchUserStream(Bearer(token), Access::kRead, "WatchJob", *alice, told.Fn());
  clock_.Advance(absl::Seconds(179));
  EXPECT_EQ(gate.RecheckStreams(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(gate.RecheckStreams(), 1);
  EXPECT_EQ(told.why.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(told.why.message(), HasSubstr("token expired"));
}

TEST_F(GateTest, RemovingTheJwtKeyEndsJwtStreams) {
  Gate gate(&clock_, Base());
  const std::string token =
      issuer_.Token("alice", "user", clock_.Now() + absl::Hours(1), "research");
  absl::StatusOr<auth::Principal> alice = gate.AdmitUser(Bearer(token), Access::kRead, "WatchJob");
  ASSERT_TRUE(alice.ok()) << alice.status();
  Told told;
  Gate::StreamWatch a =
      gate.WatchUserStream(Bearer(token), Access::kRead, "WatchJob", *alice, told.Fn());
  Credentials next = Base();
  next.jwt = Issuer().Verifier();  // another key only (same kid)
  EXPECT_EQ(gate.Reload(next), 1);
  EXPECT_EQ(told.why.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(told.why.message(), HasSubstr("JWT refused: bad signature"));
}

TEST_F(GateTest, AJwtKeyFileThatFailedToReloadRefusesEveryJwt) {
  Credentials c = Base();
  c.jwt = nullptr;
  c.users = nullptr;
  c.jwt_refused = true;
  Gate gate(&clock_, c);
  EXPECT_TRUE(gate.users_authenticated()) << "failing closed never opens tallyd to anyone";
  const std::string token =
      issuer_.Token("alice", "user", clock_.Now() + absl::Hours(1), "research");
  absl::StatusOr<auth::Principal> p = gate.AdmitUser(Bearer(token), Access::kRead, "GetJob");
  EXPECT_EQ(p.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(p.status().message(), HasSubstr("failed to load at the last reload"));
  EXPECT_EQ(gate.AdmitWorker(Bearer(issuer_.Token("w1", "worker", clock_.Now() + absl::Hours(1))))
                .status()
                .code(),
            absl::StatusCode::kUnauthenticated);
}

TEST_F(GateTest, AWorkerJwtSpeaksForItsSubjectOnly) {
  Gate gate(&clock_, Base());
  absl::StatusOr<WorkerIdentity> id =
      gate.AdmitWorker(Bearer(issuer_.Token("w1", "worker", clock_.Now() + absl::Hours(1))));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->method, "jwt");
  EXPECT_THAT(id->names, ElementsAre("w1"));
  EXPECT_TRUE(id->Allows("w1"));
  EXPECT_FALSE(id->Allows("w2"));
  EXPECT_FALSE(id->anonymous);
}

TEST_F(GateTest, ClientCertificates) {
  Gate gate(&clock_, Base());
  Presented cert;
  cert.certificate = auth::ClientCertificate{{"w1", "w1.pool"}, clock_.Now() + absl::Seconds(30)};
  absl::StatusOr<WorkerIdentity> id = gate.AdmitWorker(cert);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(id->Allows("w1.pool"));
  Told told;
  Gate::StreamWatch s = gate.WatchWorkerStream(cert, *id, told.Fn());
  clock_.Advance(absl::Seconds(29));
  EXPECT_EQ(gate.RecheckStreams(), 0);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(gate.RecheckStreams(), 1);
  EXPECT_THAT(told.why.message(), HasSubstr("client certificate has expired"));

  // One tallyd refuses (a CA leaf, ...) is refused with its reason, even
  // with a valid token beside it.
  Presented refused = Bearer("tok-w1");
  refused.certificate = absl::PermissionDeniedError("client certificate: a CA certificate");
  EXPECT_EQ(gate.AdmitWorker(refused).status().code(), absl::StatusCode::kPermissionDenied);
}

// The access each user-facing RPC asks the gate for, as its handler in
// services.cc passes it to AdmitUser.
struct Rpc {
  std::string name;  // "tally.v1.Jobs.SubmitJob"
  Access access;
};

const std::vector<Rpc>& UserRpcs() {
  static const std::vector<Rpc> rpcs = {
      {"tally.v1.Jobs.SubmitJob", Access::kWrite},
      {"tally.v1.Jobs.GetJob", Access::kRead},
      {"tally.v1.Jobs.ListJobs", Access::kRead},
      {"tally.v1.Jobs.CancelJob", Access::kWrite},
      {"tally.v1.Jobs.WatchJob", Access::kRead},
      {"tally.v1.Jobs.ListCheckpoints", Access::kRead},
      {"tally.v1.Jobs.EstimateCost", Access::kRead},
      {"tally.v1.Jobs.GetJobLogs", Access::kRead},
      {"tally.v1.Jobs.WatchJobLogs", Access::kRead},
      {"tally.v1.Experiments.CreateExperiment", Access::kWrite},
      {"tally.v1.Experiments.GetExperiment", Access::kRead},
      {"tally.v1.Experiments.ListExperiments", Access::kRead},
      {"tally.v1.Experiments.CancelExperiment", Access::kWrite},
      {"tally.v1.Experiments.WatchExperiment", Access::kRead},
  };
  return rpcs;
}

// A method added to Jobs or Experiments must be classified above (and its
// access pinned down by the tables below and by services_test).
TEST(UserRpcsTest, ListEveryMethodOfJobsAndExperiments) {
  std::set<std::string> in_protos;
  for (const google::protobuf::ServiceDescriptor* service :
       {tally::v1::Job::descriptor()->file()->FindServiceByName("Jobs"),
        tally::v1::Experiment::descriptor()->file()->FindServiceByName("Experiments")}) {
    ASSERT_NE(service, nullptr);
    for (int i = 0; i < service->method_count(); ++i) {
      in_protos.insert(service->method(i)->full_name());
    }
  }
  std::set<std::string> classified;
  for (const Rpc& rpc : UserRpcs()) classified.insert(rpc.name);
  EXPECT_EQ(classified, in_protos);
}

// What the gate makes of a caller and an object of a tenant: it sees the
// object, it is admitted but the object is another tenant's (the handlers
// answer NOT_FOUND, as for a missing one), or it is refused.
enum Outcome { kSees, kHidden, kUnauthenticated, kPermissionDenied };

std::string OutcomeName(Outcome o) {
  switch (o) {
    case kSees:
      return "sees";
    case kHidden:
      return "hidden";
    case kUnauthenticated:
      return absl::StatusCodeToString(absl::StatusCode::kUnauthenticated);
    case kPermissionDenied:
      return absl::StatusCodeToString(absl::StatusCode::kPermissionDenied);
  }
  return "?";
}

// As OutcomeName names it; any other refusal by its code.
std::string OutcomeOf(const absl::StatusOr<auth::Principal>& p, const std::string& tenant) {
  if (!p.ok()) return absl::StatusCodeToString(p.status().code());
  return OutcomeName(CanSee(*p, tenant) ? kSees : kHidden);
}

TEST_F(GateTest, EveryUserRpcByRoleAndTenant) {
  Credentials c = Base();
  c.users = TokenTableOf({{"alice", "research", "user", "tok-alice"},
                          {"vera", "research", "viewer", "tok-vera"},
                          {"ra", "research", "admin", "tok-ra"},
                          {"ops", "", "admin", "tok-ops"}},
                         auth::TokenTable::Kind::kUsers);
  const Gate gate(&clock_, c);
  const Gate open(&clock_, Credentials());  // no user authentication configured
  const absl::Time later = clock_.Now() + absl::Hours(1);
  Presented certificate;
  certificate.certificate = auth::ClientCertificate{{"w1"}, later};
  Presented malformed;
  malformed.bearer = absl::UnauthenticatedError("the authorization header is not a bearer token");

  struct Caller {
    std::string who;
    const Gate* gate;
    Presented presented;
    // Reading, then writing, an object of its own tenant (research) and of
    // another (dev).
    Outcome read_own, read_other, write_own, write_other;
    std::string message;  // in the refusal's message; with the RPC's name for PERMISSION_DENIED
  };
  const std::vector<Caller> callers = {
      {"global admin", &gate, Bearer("tok-ops"), kSees, kSees, kSees, kSees, ""},
      {"anonymous admin of an open tallyd", &open, Presented(), kSees, kSees, kSees, kSees, ""},
      {"tenant admin", &gate, Bearer("tok-ra"), kSees, kHidden, kSees, kHidden, ""},
      {"user", &gate, Bearer("tok-alice"), kSees, kHidden, kSees, kHidden, ""},
      {"user by JWT", &gate, Bearer(issuer_.Token("al", "user", later, "research")), kSees, kHidden,
       kSees, kHidden, ""},
      {"tenant admin by JWT", &gate, Bearer(issuer_.Token("ad", "admin", later, "research")), kSees,
       kHidden, kSees, kHidden, ""},
      {"viewer", &gate, Bearer("tok-vera"), kSees, kHidden, kPermissionDenied, kPermissionDenied,
       "is a viewer (read-only) and cannot call"},
      {"viewer by JWT", &gate, Bearer(issuer_.Token("vi", "viewer", later, "research")), kSees,
       kHidden, kPermissionDenied, kPermissionDenied, "is a viewer (read-only) and cannot call"},
      {"worker token", &gate, Bearer("tok-w1"), kPermissionDenied, kPermissionDenied,
       kPermissionDenied, kPermissionDenied, "a worker token cannot call"},
      {"worker JWT", &gate, Bearer(issuer_.Token("w1", "worker", later)), kPermissionDenied,
       kPermissionDenied, kPermissionDenied, kPermissionDenied, "a worker identity cannot call"},
      {"worker certificate", &gate, certificate, kPermissionDenied, kPermissionDenied,
       kPermissionDenied, kPermissionDenied, "a worker certificate cannot call"},
      {"no token", &gate, Presented(), kUnauthenticated, kUnauthenticated, kUnauthenticated,
       kUnauthenticated, "no credentials: send `authorization: Bearer TOKEN`"},
      {"unknown token", &gate, Bearer("tok-nobody"), kUnauthenticated, kUnauthenticated,
       kUnauthenticated, kUnauthenticated, "unknown token"},
      {"malformed authorization header", &gate, malformed, kUnauthenticated, kUnauthenticated,
       kUnauthenticated, kUnauthenticated, "not a bearer token"},
      {"expired JWT", &gate,
       Bearer(issuer_.Token("al", "user", clock_.Now() - absl::Hours(1), "research")),
       kUnauthenticated, kUnauthenticated, kUnauthenticated, kUnauthenticated,
       "JWT refused: token expired"},
      {"JWT of another key", &gate, Bearer(Issuer().Token("al", "user", later, "research")),
       kUnauthenticated, kUnauthenticated, kUnauthenticated, kUnauthenticated,
       "JWT refused: bad signature"},
  };
  for (const Rpc& rpc : UserRpcs()) {
    const std::string method = rpc.name.substr(rpc.name.rfind('.') + 1);
    for (const Caller& caller : callers) {
      SCOPED_TRACE(absl::StrCat(method, " by ", caller.who));
      const absl::StatusOr<auth::Principal> p =
          caller.gate->AdmitUser(caller.presented, rpc.access, method);
      const bool write = rpc.access == Access::kWrite;
      EXPECT_EQ(OutcomeOf(p, "research"), OutcomeName(write ? caller.write_own : caller.read_own));
      EXPECT_EQ(OutcomeOf(p, "dev"), OutcomeName(write ? caller.write_other : caller.read_other));
      if (p.ok()) continue;
      EXPECT_THAT(p.status().message(), HasSubstr(caller.message));
      if (p.status().code() == absl::StatusCode::kPermissionDenied) {
        EXPECT_THAT(p.status().message(), HasSubstr(method)) << "names the call refused";
      }
    }
  }
}

// Workers.Connect admission: a worker credential speaks for its own worker
// ids and no other; a user's credential opens no worker stream.
TEST_F(GateTest, AWorkerCredentialIsAdmittedForItsOwnWorkerIdOnly) {
  const Gate gate(&clock_, Base());
  const absl::Time later = clock_.Now() + absl::Hours(1);
  Presented certificate;
  certificate.certificate = auth::ClientCertificate{{"w1", "w1.pool"}, later};
  Presented expired_certificate;
  expired_certificate.certificate =
      auth::ClientCertificate{{"w1"}, clock_.Now() - absl::Seconds(1)};
  struct Row {
    std::string who;
    Presented presented;
    absl::StatusCode code;
    std::vector<std::string> names;  // when admitted
    std::string message;             // in the refusal
  };
  const std::vector<Row> rows = {
      {"worker token w1", Bearer("tok-w1"), absl::StatusCode::kOk, {"w1"}, ""},
      {"worker token w2", Bearer("tok-w2"), absl::StatusCode::kOk, {"w2"}, ""},
      {"worker JWT w2",
       Bearer(issuer_.Token("w2", "worker", later)),
       absl::StatusCode::kOk,
       {"w2"},
       ""},
      {"certificate", certificate, absl::StatusCode::kOk, {"w1", "w1.pool"}, ""},
      {"user token",
       Bearer("tok-alice"),
       absl::StatusCode::kPermissionDenied,
       {},
       "a user token cannot open a worker stream"},
      {"global admin token",
       Bearer("tok-ops"),
       absl::StatusCode::kPermissionDenied,
       {},
       "a user token cannot open a worker stream"},
      {"user JWT",
       Bearer(issuer_.Token("w1", "user", later, "research")),
       absl::StatusCode::kPermissionDenied,
       {},
       "role claim must be worker"},
      {"no token",
       Presented(),
       absl::StatusCode::kUnauthenticated,
       {},
       "workers must authenticate"},
      {"unknown token",
       Bearer("tok-nobody"),
       absl::StatusCode::kUnauthenticated,
       {},
       "unknown worker token"},
      {"expired worker JWT",
       Bearer(issuer_.Token("w1", "worker", clock_.Now() - absl::Hours(1))),
       absl::StatusCode::kUnauthenticated,
       {},
       "JWT refused: token expired"},
      {"expired certificate",
       expired_certificate,
       absl::StatusCode::kUnauthenticated,
       {},
       "client certificate has expired"},
  };
  const std::vector<std::string> ids = {"w1", "w1.pool", "w2", "w3"};
  for (const Row& row : rows) {
    SCOPED_TRACE(row.who);
    absl::StatusOr<WorkerIdentity> id = gate.AdmitWorker(row.presented);
    EXPECT_EQ(id.status().code(), row.code) << id.status();
    if (!id.ok()) {
      EXPECT_THAT(id.status().message(), HasSubstr(row.message));
      continue;
    }
    EXPECT_FALSE(id->anonymous);
    EXPECT_EQ(id->names, row.names);
    for (const std::string& worker : ids) {
      const bool own = std::find(row.names.begin(), row.names.end(), worker) != row.names.end();
      EXPECT_EQ(id->Allows(worker), own) << worker;
    }
  }
}

}  // namespace
}  // namespace tally::api
