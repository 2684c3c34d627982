#include "server/auth/jwt.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "openssl/bn.h"
#include "openssl/core_names.h"
#include "openssl/ec.h"
#include "openssl/evp.h"
#include "openssl/hmac.h"
#include "openssl/pem.h"

namespace tally::auth {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;

// ---- test keys and signing -------------------------------------------------

struct PkeyFree {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

std::string B64(absl::string_view bytes) {
  return absl::WebSafeBase64Escape(bytes);
}

std::string BignumParam(EVP_PKEY* pkey, const char* name, int pad_to = 0) {
  BIGNUM* bn = nullptr;
  EXPECT_EQ(EVP_PKEY_get_bn_param(pkey, name, &bn), 1) << name;
  const int size = pad_to > 0 ? pad_to : BN_num_bytes(bn);
  std::string out(static_cast<size_t>(size), '\0');
  BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), size);
  BN_free(bn);
  return out;
}

Json RsaJwk(EVP_PKEY* pkey, absl::string_view kid) {
  Json jwk = {{"kty", "RSA"},
              {"n", B64(BignumParam(pkey, OSSL_PKEY_PARAM_RSA_N))},
              {"e", B64(BignumParam(pkey, OSSL_PKEY_PARAM_RSA_E))}};
  if (!kid.empty()) jwk["kid"] = kid;
  return jwk;
}

Json EcJwk(EVP_PKEY* pkey, absl::string_view kid) {
  Json jwk = {{"kty", "EC"},
              {"crv", "P-256"},
              {"x", B64(BignumParam(pkey, OSSL_PKEY_PARAM_EC_PUB_X, 32))},
              {"y", B64(BignumParam(pkey, OSSL_PKEY_PARAM_EC_PUB_Y, 32))}};
  if (!kid.empty()) jwk["kid"] = kid;
  return jwk;
}

// EVP_DigestSign over `input`; for an EC key, the DER signature.
std::string SignDigest(EVP_PKEY* pkey, absl::string_view input) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  size_t len = 0;
  EXPECT_EQ(EVP_DigestSignInit_ex(ctx, nullptr, "SHA256", nullptr, nullptr,
                                  pkey, nullptr),
            1);
  const auto* data = reinterpret_cast<const unsigned char*>(input.data());
  EXPECT_EQ(EVP_DigestSign(ctx, nullptr, &len, data, input.size()), 1);
  std::string sig(len, '\0');
  EXPECT_EQ(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()),
                           &len, data, input.size()),
            1);
  sig.resize(len);
  EVP_MD_CTX_free(ctx);
  return sig;
}

// JOSE's ES256 form: r||s, 32 bytes each.
std::string DerToRaw(absl::string_view der) {
  const auto* p = reinterpret_cast<const unsigned char*>(der.data());
  ECDSA_SIG* sig = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
  EXPECT_NE(sig, nullptr);
  std::string raw(64, '\0');
  BN_bn2binpad(ECDSA_SIG_get0_r(sig),
               reinterpret_cast<unsigned char*>(raw.data()), 32);
  BN_bn2binpad(ECDSA_SIG_get0_s(sig),
               reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
  ECDSA_SIG_free(sig);
  return raw;
}

std::string PublicKeyPem(EVP_PKEY* pkey) {
  BIO* bio = BIO_new(BIO_s_mem());
  EXPECT_EQ(PEM_write_bio_PUBKEY(bio, pkey), 1);
  char* data = nullptr;
  const long len = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(len));
  BIO_free(bio);
  return pem;
}

// header.payload, base64url without padding.
std::string SigningInput(const Json& header, const Json& payload) {
  return absl::StrCat(B64(header.dump()), ".", B64(payload.dump()));
}

std::string Sign(EVP_PKEY* pkey, absl::string_view alg, absl::string_view kid,
                 const Json& payload) {
  Json header = {{"alg", alg}, {"typ", "JWT"}};
  if (!kid.empty()) header["kid"] = kid;
  const std::string input = SigningInput(header, payload);
  std::string sig = SignDigest(pkey, input);
  if (alg == "ES256") sig = DerToRaw(sig);
  return absl::StrCat(input, ".", B64(sig));
}

// ---- fixture ---------------------------------------------------------------

const absl::Time kNow = absl::FromUnixSeconds(1700000000);
constexpr int64_t kNowSeconds = 1700000000;

class JwtTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    rsa_ = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{2048});
    other_rsa_ = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{2048});
    ec_ = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
    other_ec_ = EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256");
    ASSERT_NE(rsa_, nullptr);
    ASSERT_NE(other_rsa_, nullptr);
    ASSERT_NE(ec_, nullptr);
    ASSERT_NE(other_ec_, nullptr);
  }
  static void TearDownTestSuite() {
    for (EVP_PKEY* k : {rsa_, other_rsa_, ec_, other_ec_}) EVP_PKEY_free(k);
  }

  static JwtOptions Options() {
    JwtOptions options;
    options.issuer = "https://idp.example.com";
    options.audience = "tallyd";
    options.principal_claim = "email";
    options.tenant_claim = "org";
    options.role_claim = "tally_role";
    return options;
  }

  static std::string Jwks() {
    return Json{{"keys",
                 {RsaJwk(rsa_, "rsa-1"), EcJwk(ec_, "ec-1"),
                  Json{{"kty", "oct"}, {"k", "c2VjcmV0"}}}}}
        .dump();
  }

  static JwtVerifier Verifier() {
    absl::StatusOr<JwtVerifier> v =
        JwtVerifier::Create(Jwks(), Options(), "jwks.json");
    EXPECT_TRUE(v.ok()) << v.status();
    return *std::move(v);
  }

  static Json Claims() {
    return Json{{"iss", "https://idp.example.com"},
                {"aud", "tallyd"},
                {"email", "alice@example.com"},
                {"org", "research"},
                {"tally_role", "user"},
                {"sub", "ignored-subject"},
                {"iat", kNowSeconds - 10},
                {"exp", kNowSeconds + 3600}};
  }

  // The reason Verify refuses `token` with; "" when it accepts it.
  static std::string Refusal(absl::string_view token) {
    absl::StatusOr<Principal> p = Verifier().Verify(token, kNow);
    if (p.ok()) return "";
    EXPECT_EQ(p.status().code(), absl::StatusCode::kUnauthenticated)
        << p.status();
    return std::string(p.status().message());
  }

  static inline EVP_PKEY* rsa_ = nullptr;
  static inline EVP_PKEY* other_rsa_ = nullptr;
  static inline EVP_PKEY* ec_ = nullptr;
  static inline EVP_PKEY* other_ec_ = nullptr;
};

TEST_F(JwtTest, AcceptsRs256WithCustomClaimNames) {
  JwtVerifier verifier = Verifier();
  EXPECT_EQ(verifier.num_keys(), 2u) << "the oct key is skipped";
  absl::StatusOr<Principal> p =
      verifier.Verify(Sign(rsa_, "RS256", "rsa-1", Claims()), kNow);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "alice@example.com");
  EXPECT_EQ(p->tenant, "research");
  EXPECT_EQ(p->role, Role::kUser);
  EXPECT_EQ(p->method, "jwt");
}

TEST_F(JwtTest, AcceptsEs256) {
  Json claims = Claims();
  claims["tally_role"] = "viewer";
  claims["org"] = "vision";
  claims["email"] = "bob";
  absl::StatusOr<Principal> p =
      Verifier().Verify(Sign(ec_, "ES256", "ec-1", claims), kNow);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->name, "bob");
  EXPECT_EQ(p->tenant, "vision");
  EXPECT_EQ(p->role, Role::kViewer);
}

TEST_F(JwtTest, WithoutKidTriesEveryKeyOfTheAlgsType) {
  const std::string jwks =
      Json{{"keys", {RsaJwk(other_rsa_, ""), RsaJwk(rsa_, ""), EcJwk(ec_, "")}}}
          .dump();
  absl::StatusOr<JwtVerifier> v =
      JwtVerifier::Create(jwks, Options(), "jwks.json");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->Verify(Sign(rsa_, "RS256", "", Claims()), kNow).ok());
  EXPECT_TRUE(v->Verify(Sign(ec_, "ES256", "", Claims()), kNow).ok());
  // A kid the set does not name selects nothing, even if a key would verify.
  EXPECT_EQ(v->Verify(Sign(rsa_, "RS256", "rsa-1", Claims()), kNow)
                .status()
                .message(),
            "unknown key");
}

TEST_F(JwtTest, AdminAndWorkerTenants) {
  Json admin = Claims();
  admin["tally_role"] = "admin";
  admin.erase("org");
  absl::StatusOr<Principal> p =
      Verifier().Verify(Sign(rsa_, "RS256", "rsa-1", admin), kNow);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kAdmin);
  EXPECT_EQ(p->tenant, "") << "an admin without a tenant is every tenant's";

  admin["org"] = "research";
  p = Verifier().Verify(Sign(rsa_, "RS256", "rsa-1", admin), kNow);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tenant, "research");

  // Trimmed, and a label value; whitespace alone is not "every tenant".
  admin["org"] = " research ";
  p = Verifier().Verify(Sign(rsa_, "RS256", "rsa-1", admin), kNow);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->tenant, "research");
  for (const char* bad : {"  ", "re,search"}) {
    admin["org"] = bad;
    p = Verifier().Verify(Sign(rsa_, "RS256", "rsa-1", admin), kNow);
    EXPECT_EQ(p.status().message(), "bad claim org") << bad;
  }

  Json worker = Claims();
  worker["tally_role"] = "worker";
  worker["email"] = "gpu-node-7";
  p = Verifier().Verify(Sign(ec_, "ES256", "ec-1", worker), kNow);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->role, Role::kWorker);
  EXPECT_EQ(p->name, "gpu-node-7");
  EXPECT_EQ(p->tenant, "") << "a worker never acts in a tenant";
}

TEST_F(JwtTest, TimeChecksAllowTheLeeway) {
  Json claims = Claims();
  claims["exp"] = kNowSeconds - 61;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "token expired");
  claims["exp"] = kNowSeconds - 60;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "token expired");
  claims["exp"] = kNowSeconds - 59;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "");
  claims["exp"] = kNowSeconds - 59.5;  // NumericDate may have a fraction
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "");

  claims = Claims();
  claims["nbf"] = kNowSeconds + 61;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)),
            "token not yet valid");
  claims["nbf"] = kNowSeconds + 60;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "");

  JwtOptions strict = Options();
  strict.leeway = absl::ZeroDuration();
  absl::StatusOr<JwtVerifier> v =
      JwtVerifier::Create(Jwks(), strict, "jwks.json");
  ASSERT_TRUE(v.ok());
  claims = Claims();
  claims["exp"] = kNowSeconds;
  EXPECT_EQ(
      v->Verify(Sign(rsa_, "RS256", "rsa-1", claims), kNow).status().message(),
      "token expired");
  claims["exp"] = kNowSeconds + 1;
  EXPECT_TRUE(v->Verify(Sign(rsa_, "RS256", "rsa-1", claims), kNow).ok());
}

TEST_F(JwtTest, LifetimesAreBounded) {
  const std::string too_long =
      "token lifetime too long: exp must be at most 24h after iat and after now "
      "(--jwt_max_lifetime); issue shorter-lived tokens";
  Json claims = Claims();
  claims["iat"] = kNowSeconds - 10;
  claims["exp"] = kNowSeconds - 10 + 24 * 3600;  // exactly the maximum
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "");
  claims["exp"] = kNowSeconds - 10 + 24 * 3600 + 1;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), too_long);
  // No iat: exp - now is bounded (plus the leeway).
  claims.erase("iat");
  claims["exp"] = kNowSeconds + 24 * 3600 + 60;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "");
  claims["exp"] = kNowSeconds + 24 * 3600 + 61;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), too_long);
  // An iat in the future does not lengthen it.
  claims["iat"] = kNowSeconds + 24 * 3600;
  claims["exp"] = kNowSeconds + 30 * 3600;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), too_long);
  // No exp at all is refused.
  claims = Claims();
  claims.erase("exp");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "missing claim exp");

  JwtOptions shorter = Options();
  shorter.max_lifetime = absl::Hours(1);
  absl::StatusOr<JwtVerifier> v = JwtVerifier::Create(Jwks(), shorter, "jwks.json");
  ASSERT_TRUE(v.ok());
  claims = Claims();
  claims["iat"] = kNowSeconds;
  claims["exp"] = kNowSeconds + 7200;
  EXPECT_EQ(v->Verify(Sign(rsa_, "RS256", "rsa-1", claims), kNow).status().message(),
            "token lifetime too long: exp must be at most 1h after iat and after now "
            "(--jwt_max_lifetime); issue shorter-lived tokens");
  shorter.max_lifetime = absl::ZeroDuration();
  EXPECT_EQ(JwtVerifier::Create(Jwks(), shorter, "jwks.json").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JwtTest, IssuerAndAudience) {
  Json claims = Claims();
  claims["iss"] = "https://idp.example.com/";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "wrong issuer");
  claims["iss"] = 7;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "wrong issuer");
  claims.erase("iss");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "missing claim iss");

  claims = Claims();
  claims["aud"] = "tallyd-staging";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "wrong audience");
  claims["aud"] = Json::array({"grafana", "tallyd-staging"});
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "wrong audience");
  claims["aud"] = Json::array();
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "wrong audience");
  claims["aud"] = Json::array({"grafana", "tallyd"});
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "");
  claims.erase("aud");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "missing claim aud");
}

TEST_F(JwtTest, TamperedPayloadAndForeignKeys) {
  const std::string token = Sign(rsa_, "RS256", "rsa-1", Claims());
  const size_t dot1 = token.find('.');
  const size_t dot2 = token.find('.', dot1 + 1);
  Json admin = Claims();
  admin["tally_role"] = "admin";
  const std::string tampered = absl::StrCat(
      token.substr(0, dot1), ".", B64(admin.dump()), token.substr(dot2));
  EXPECT_EQ(Refusal(tampered), "bad signature");

  EXPECT_EQ(Refusal(Sign(other_rsa_, "RS256", "rsa-1", Claims())),
            "bad signature");
  EXPECT_EQ(Refusal(Sign(other_ec_, "ES256", "ec-1", Claims())),
            "bad signature");

  // A kid naming a key of the other type: no key for this alg.
  EXPECT_EQ(Refusal(Sign(ec_, "ES256", "rsa-1", Claims())), "unknown key");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "no-such-kid", Claims())),
            "unknown key");

  // ES256 with the DER signature OpenSSL makes, not JOSE's r||s.
  const Json header = {{"alg", "ES256"}, {"kid", "ec-1"}};
  const std::string input = SigningInput(header, Claims());
  EXPECT_EQ(Refusal(absl::StrCat(input, ".", B64(SignDigest(ec_, input)))),
            "bad signature");
  // Truncated RSA signature, canonically encoded; and non-canonical trailing
  // bits, which base64url decoders commonly ignore.
  std::string sig;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(token.substr(dot2 + 1), &sig));
  ASSERT_EQ(sig.size(), 256u);
  EXPECT_EQ(
      Refusal(absl::StrCat(token.substr(0, dot2 + 1), B64(sig.substr(0, 255)))),
      "bad signature");
  std::string loose = token;
  // 256 bytes end in a character with 4 unused bits: set the lowest.
  const std::string alphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  loose.back() = alphabet[alphabet.find(loose.back()) ^ 1];
  EXPECT_EQ(Refusal(loose), "malformed token");
}

TEST_F(JwtTest, RefusesAlgNoneAndHmac) {
  const std::string none_input =
      SigningInput(Json{{"alg", "none"}, {"typ", "JWT"}}, Claims());
  EXPECT_EQ(Refusal(absl::StrCat(none_input, ".")), "unsupported alg");
  const std::string none_kid_input =
      SigningInput(Json{{"alg", "none"}, {"kid", "rsa-1"}}, Claims());
  EXPECT_EQ(Refusal(absl::StrCat(none_kid_input, ".")), "unsupported alg");

  // The key-confusion attack: HS256 with the RSA public key as the secret.
  for (const std::string& secret : {PublicKeyPem(rsa_), Jwks()}) {
    const std::string input =
        SigningInput(Json{{"alg", "HS256"}, {"kid", "rsa-1"}}, Claims());
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    ASSERT_NE(HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
                   reinterpret_cast<const unsigned char*>(input.data()),
                   input.size(), mac, &mac_len),
              nullptr);
    const std::string token = absl::StrCat(
        input, ".",
        B64(absl::string_view(reinterpret_cast<char*>(mac), mac_len)));
    EXPECT_EQ(Refusal(token), "unsupported alg");
  }
  for (const char* alg : {"RS384", "PS256", "ES384", "EdDSA", "rs256", ""}) {
    const std::string input = SigningInput(Json{{"alg", alg}}, Claims());
    EXPECT_EQ(Refusal(absl::StrCat(input, ".AAAA")), "unsupported alg") << alg;
  }
}

TEST_F(JwtTest, ClaimRefusals) {
  Json claims = Claims();
  claims.erase("exp");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "missing claim exp");
  claims["exp"] = "tomorrow";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "bad claim exp");

  claims = Claims();
  claims["tally_role"] = "superuser";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "bad role claim");
  claims["tally_role"] = "Admin";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "bad role claim");
  claims["tally_role"] = Json::array({"admin"});
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "bad role claim");
  claims.erase("tally_role");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)),
            "missing claim tally_role");

  claims = Claims();
  claims.erase("email");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)),
            "missing claim email");
  claims["email"] = "";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)),
            "missing claim email");
  claims["email"] = "eve\x1b[2J";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "bad claim email");
  claims["email"] = std::string(129, 'e');
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "bad claim email");

  claims = Claims();
  claims.erase("org");
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "missing claim org");
  claims["org"] = "";
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "missing claim org");
  claims["org"] = 42;
  EXPECT_EQ(Refusal(Sign(rsa_, "RS256", "rsa-1", claims)), "bad claim org");
}

TEST_F(JwtTest, ReasonsCarryNoClaimValues) {
  Json claims = Claims();
  claims["iss"] = "https://evil.example.com";
  claims["tally_role"] = "root";
  const std::string reason = Refusal(Sign(rsa_, "RS256", "rsa-1", claims));
  EXPECT_EQ(reason, "wrong issuer");
  EXPECT_THAT(reason, ::testing::Not(HasSubstr("evil")));
}

TEST_F(JwtTest, MalformedTokens) {
  const std::string good = Sign(rsa_, "RS256", "rsa-1", Claims());
  const size_t dot1 = good.find('.');
  const size_t dot2 = good.find('.', dot1 + 1);
  const std::string header = good.substr(0, dot1);
  const std::string payload = good.substr(dot1 + 1, dot2 - dot1 - 1);
  const std::string sig = good.substr(dot2 + 1);
  const std::vector<std::string> malformed = {
      "",
      "abc",
      absl::StrCat(header, ".", payload),
      absl::StrCat(header, ".", payload, ".", sig, ".x"),
      absl::StrCat(header, "=.", payload, ".", sig),       // padding
      absl::StrCat(header, ".", payload, ".", sig, "=="),  // padding
      absl::StrCat(header, ".", payload, "+.", sig),       // not base64url
      absl::StrCat(header, " .", payload, ".", sig),
      absl::StrCat(B64("not json"), ".", payload, ".", sig),
      absl::StrCat(B64("[\"RS256\"]"), ".", payload, ".", sig),
      absl::StrCat(B64("{\"alg\":256}"), ".", payload, ".", sig),
      absl::StrCat(B64("{\"typ\":\"JWT\"}"), ".", payload, ".", sig),
      absl::StrCat(B64("{\"alg\":\"RS256\",\"kid\":1}"), ".", payload, ".",
                   sig),
      absl::StrCat(B64("{\"alg\":\"RS256\",\"alg\":\"RS256\"}"), ".", payload,
                   ".", sig),
      absl::StrCat(B64("{\"alg\":\"RS256\",\"crit\":[\"exp\"]}"), ".", payload,
                   ".", sig),
      std::string(kMaxJwtBytes + 1, 'a'),
  };
  for (const std::string& token : malformed) {
    EXPECT_EQ(Refusal(token), "malformed token") << token.substr(0, 100);
  }

  // Signed correctly, but the payload is not a JSON object or repeats a claim.
  auto signed_payload = [](absl::string_view payload_text) {
    const std::string input =
        absl::StrCat(B64(Json{{"alg", "RS256"}, {"kid", "rsa-1"}}.dump()), ".",
                     B64(payload_text));
    return absl::StrCat(input, ".", B64(SignDigest(rsa_, input)));
  };
  EXPECT_EQ(Refusal(signed_payload("[1]")), "malformed token");
  EXPECT_EQ(Refusal(signed_payload("{\"exp\":")), "malformed token");
  std::string twice = Claims().dump();
  twice.insert(1, "\"tally_role\":\"admin\",");
  EXPECT_EQ(Refusal(signed_payload(twice)), "malformed token");
  std::string deep = Claims().dump();
  deep.insert(1, absl::StrCat("\"x\":", std::string(20, '['),
                              std::string(20, ']'), ","));
  EXPECT_EQ(Refusal(signed_payload(deep)), "malformed token");
  EXPECT_EQ(Refusal(signed_payload(Claims().dump())), "");
}

// ---- JWK Sets --------------------------------------------------------------

class JwksTest : public JwtTest {
 protected:
  static absl::Status CreateError(absl::string_view jwks,
                                  JwtOptions options = Options()) {
    absl::StatusOr<JwtVerifier> v =
        JwtVerifier::Create(jwks, options, "jwks.json");
    EXPECT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument)
        << v.status();
    EXPECT_THAT(std::string(v.status().message()),
                ::testing::StartsWith("jwks.json: "));
    return v.status();
  }
};

TEST_F(JwksTest, OnlyUnsupportedKeys) {
  const std::string jwks = Json{
      {"keys",
       {Json{{"kty", "oct"}, {"k", "c2VjcmV0"}},
        Json{{"kty", "OKP"}, {"crv", "Ed25519"}, {"x", "AAAA"}},
        Json{{"kty", "EC"}, {"crv", "P-384"}, {"x", "AAAA"}, {"y", "AAAA"}},
        [] {
          Json k = RsaJwk(rsa_, "enc");
          k["use"] = "enc";
          return k;
        }(),
        [] {
          Json k = RsaJwk(rsa_, "ps");
          k["alg"] = "PS256";
          return k;
        }()}}}.dump();
  EXPECT_THAT(
      std::string(CreateError(jwks).message()),
      HasSubstr("jwks.json: keys: no usable key: tallyd verifies RS256"));
  EXPECT_THAT(std::string(CreateError(jwks).message()),
              HasSubstr("keys[0]: kty \"oct\""));
  EXPECT_THAT(std::string(CreateError(R"({"keys": []})").message()),
              HasSubstr("the set is empty"));
}

TEST_F(JwksTest, MalformedSets) {
  EXPECT_THAT(std::string(CreateError("{\"keys\": [").message()),
              HasSubstr("jwks.json: not a JWK Set: the JSON"));
  EXPECT_THAT(std::string(CreateError("").message()),
              HasSubstr("not a JWK Set"));
  EXPECT_THAT(std::string(CreateError("[]").message()),
              HasSubstr("expected a JSON object"));
  EXPECT_THAT(std::string(CreateError("{\"keys\": {}}").message()),
              HasSubstr("jwks.json: keys: must be an array"));
  EXPECT_THAT(
      std::string(CreateError("{\"keys\": [], \"keys\": []}").message()),
      HasSubstr("member \"keys\" is given twice"));
  EXPECT_THAT(std::string(CreateError(absl::StrCat("{\"keys\": [], \"x\": ",
                                                   std::string(100, '['),
                                                   std::string(100, ']'), "}"))
                              .message()),
              HasSubstr("nested deeper than 16 levels"));
  EXPECT_THAT(std::string(CreateError("{\"keys\": [7]}").message()),
              HasSubstr("keys[0]: must be a JSON object"));
  EXPECT_THAT(
      std::string(CreateError("{\"keys\": [{\"n\": \"AQAB\"}]}").message()),
      HasSubstr("keys[0].kty: is missing"));
}

TEST_F(JwksTest, RefusesOversizeSets) {
  std::string big = Jwks();
  big.insert(1, absl::StrCat("\"padding\": \"", std::string(kMaxJwksBytes, 'x'),
                             "\","));
  EXPECT_THAT(std::string(CreateError(big).message()),
              HasSubstr("larger than 1024 KiB"));

  Json many = {{"keys", Json::array()}};
  for (int i = 0; i < 101; ++i) many["keys"].push_back(Json{{"kty", "oct"}});
  EXPECT_THAT(std::string(CreateError(many.dump()).message()),
              HasSubstr("keys: holds 101 keys; at most 100"));
}

TEST_F(JwksTest, BrokenKeysOfUsableKindsAreErrors) {
  EVP_PKEY* small = EVP_PKEY_Q_keygen(nullptr, nullptr, "RSA", size_t{1024});
  ASSERT_NE(small, nullptr);
  EXPECT_THAT(
      std::string(
          CreateError(Json{{"keys", {RsaJwk(small, "")}}}.dump()).message()),
      HasSubstr("keys[0].n: the modulus is 1024 bits; use a key of 2048 to "
                "8192 bits"));
  EVP_PKEY_free(small);

  Json padded = RsaJwk(rsa_, "");
  padded["e"] = "AQAB=";
  EXPECT_THAT(
      std::string(CreateError(Json{{"keys", {padded}}}.dump()).message()),
      HasSubstr("keys[0].e: is not unpadded base64url"));
  Json even = RsaJwk(rsa_, "");
  even["e"] = B64("\x01\x00");
  EXPECT_THAT(std::string(CreateError(Json{{"keys", {even}}}.dump()).message()),
              HasSubstr("keys[0].e: must be an odd exponent"));
  Json no_n = RsaJwk(rsa_, "");
  no_n.erase("n");
  EXPECT_THAT(std::string(CreateError(Json{{"keys", {no_n}}}.dump()).message()),
              HasSubstr("keys[0].n: is missing"));

  Json off_curve = EcJwk(ec_, "");
  std::string y = BignumParam(ec_, OSSL_PKEY_PARAM_EC_PUB_Y, 32);
  y[31] ^= 1;
  off_curve["y"] = B64(y);
  EXPECT_THAT(
      std::string(CreateError(Json{{"keys", {off_curve}}}.dump()).message()),
      HasSubstr("keys[0].x: x and y are not a point on the P-256 curve"));
  Json short_x = EcJwk(ec_, "");
  short_x["x"] = B64(std::string(31, 'x'));
  EXPECT_THAT(
      std::string(CreateError(Json{{"keys", {short_x}}}.dump()).message()),
      HasSubstr("keys[0].x: is 31 bytes; a P-256 coordinate is 32 bytes"));

  Json with_private = EcJwk(ec_, "");
  with_private["d"] = B64(std::string(32, 'd'));
  EXPECT_THAT(
      std::string(CreateError(Json{{"keys", {with_private}}}.dump()).message()),
      HasSubstr("keys[0].d: is private key material"));
  Json kid_number = EcJwk(ec_, "");
  kid_number["kid"] = 3;
  EXPECT_THAT(
      std::string(CreateError(Json{{"keys", {kid_number}}}.dump()).message()),
      HasSubstr("keys[0].kid: must be a string"));
}

TEST_F(JwksTest, KeyAlgAndUseMustMatch) {
  Json rsa = RsaJwk(rsa_, "rsa-1");
  rsa["alg"] = "RS256";
  rsa["use"] = "sig";
  Json ec = EcJwk(ec_, "ec-1");
  ec["alg"] = "ES256";
  absl::StatusOr<JwtVerifier> v = JwtVerifier::Create(
      Json{{"keys", {rsa, ec}}}.dump(), Options(), "jwks.json");
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->num_keys(), 2u);
  EXPECT_TRUE(v->Verify(Sign(rsa_, "RS256", "rsa-1", Claims()), kNow).ok());
  EXPECT_TRUE(v->Verify(Sign(ec_, "ES256", "ec-1", Claims()), kNow).ok());
}

TEST_F(JwksTest, BadOptions) {
  JwtOptions options = Options();
  options.issuer = "";
  EXPECT_THAT(std::string(CreateError(Jwks(), options).message()),
              HasSubstr("--jwt_issuer"));
  options = Options();
  options.audience = "";
  EXPECT_THAT(std::string(CreateError(Jwks(), options).message()),
              HasSubstr("--jwt_audience"));
  options = Options();
  options.role_claim = "";
  EXPECT_THAT(std::string(CreateError(Jwks(), options).message()),
              HasSubstr("the role claim name is empty"));
  options = Options();
  options.tenant_claim = options.principal_claim;
  EXPECT_THAT(std::string(CreateError(Jwks(), options).message()),
              HasSubstr("different names"));
  options = Options();
  options.leeway = absl::Seconds(-1);
  EXPECT_THAT(std::string(CreateError(Jwks(), options).message()),
              HasSubstr("leeway"));
}

TEST_F(JwksTest, LoadReadsAFile) {
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/jwt_test_jwks.json");
  {
    std::ofstream out(path);
    out << Jwks();
  }
  absl::StatusOr<JwtVerifier> v = JwtVerifier::Load(path, Options());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->Verify(Sign(ec_, "ES256", "ec-1", Claims()), kNow).ok());
  {
    std::ofstream out(path);
    out << "{\"keys\": 1}";
  }
  v = JwtVerifier::Load(path, Options());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(v.status().message()),
              HasSubstr(absl::StrCat(path, ": keys:")));
  std::remove(path.c_str());
  v = JwtVerifier::Load(path, Options());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tally::auth
