#include "server/api/gate.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "openssl/bn.h"
#include "openssl/core_names.h"
#include "openssl/evp.h"
#include "openssl/rsa.h"
#include "openssl/sha.h"

namespace tally::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string Hex(absl::string_view token) {
  unsigned char d[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d);
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d), sizeof(d)));
}

std::shared_ptr<const auth::TokenTable> Table(const std::vector<std::vector<std::string>>& rows,
                                              auth::TokenTable::Kind kind) {
  std::string yaml = "principals:\n";
  for (const auto& r : rows) {  // name, tenant, role, token
    absl::StrAppend(&yaml, "  - {name: ", r[0], ", tenant: \"", r[1], "\", role: ", r[2],
                    ", token_sha256: \"", Hex(r[3]), "\"}\n");
  }
  absl::StatusOr<auth::TokenTable> t = auth::TokenTable::Parse(yaml, kind, "t.yaml");
  EXPECT_TRUE(t.ok()) << t.status();
  return std::make_shared<const auth::TokenTable>(*std::move(t));
}

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
    c.users = Table({{"alice", "research", "user", "tok-alice"},
                     {"bob", "dev", "user", "tok-bob"},
                     {"ra", "research", "admin", "tok-ra"},
                     {"ops", "", "admin", "tok-ops"}},
                    auth::TokenTable::Kind::kUsers);
    c.workers = Table({{"w1", "", "worker", "tok-w1"}, {"w2", "", "worker", "tok-w2"}},
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
  next.users = Table({{"bob", "dev", "user", "tok-bob"}}, auth::TokenTable::Kind::kUsers);
  next.workers = Table({{"w2", "", "worker", "tok-w2"}}, auth::TokenTable::Kind::kWorkers);
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

TEST_F(GateTest, AStreamWhoseTokenNowNamesAnotherRoleOrTenantEnds) {
  Gate gate(&clock_, Base());
  Told told;
  absl::StatusOr<auth::Principal> alice =
      gate.AdmitUser(Bearer("tok-alice"), Access::kRead, "WatchJob");
  ASSERT_TRUE(alice.ok());
  Gate::StreamWatch a =
      gate.WatchUserStream(Bearer("tok-alice"), Access::kRead, "WatchJob", *alice, told.Fn());
  Credentials next = Base();
  next.users = Table({{"alice", "dev", "user", "tok-alice"}}, auth::TokenTable::Kind::kUsers);
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

}  // namespace
}  // namespace tally::api
