// Fuzzes JwtVerifier (server/auth/jwt.h): what tallyd does with the
// --jwt_jwks file and with every bearer token a caller sends.
//
// Input: byte 0 picks what the rest is (bits 0-1):
//   0: a JWK Set. JwtVerifier::Create reads it; when it reads, two tokens
//      signed by the target's keys are verified against it.
//   1: a token, verified against a fixed verifier (the target's RSA-2048
//      and P-256 keys, kids "rsa-1" and "ec-1").
//   2, 3: a JWT payload (claims JSON). The target signs it with its RSA (2)
//      or EC (3) key, with the key's kid in the header when bit 2 is set,
//      and verifies it: the claim checks get fuzzed behind a valid signature.
// The keys are fixed test keys, used nowhere else, so seeds stay valid.
//
// Beyond "no crash, no sanitizer report" it checks:
// - a refused JWK Set is INVALID_ARGUMENT naming the source;
// - a refused token is UNAUTHENTICATED with one of the documented reasons;
// - a token the target signed is never refused for its signature, key or
//   alg;
// - an accepted token gives a principal the rules allow: method "jwt", a
//   name, a tenant for a user or viewer and none for a worker.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "openssl/bio.h"
#include "openssl/bn.h"
#include "openssl/core_names.h"
#include "openssl/ec.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "server/auth/jwt.h"

namespace {

using tally::auth::JwtOptions;
using tally::auth::JwtVerifier;
using tally::auth::Principal;
using tally::auth::Role;

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "jwt_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

// Test keys for this target only.
constexpr char kRsaPem[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDJrbY5rOkwW/Id\n"
    "s1AYdbFC8WbplipblLv6POgYgDmcd35m/wqX/Ry1mGhEvuXrUXH4nGQlXsVAwm5V\n"
    "bfk4o1kY/zR/Itzpd9vQzVhr3ciRJ43de0mZ71joH0AkQpAmsPMXjV+UmKrr/xZ3\n"
    "L0Lw79nF0xUAbRJy8yaY0R/27PeIa45USh2VoxLBcxdwKacZXVmwlaAg3TB6/3u1\n"
    "ldV4RjC7ICuRcAkMeeypFo6CB0NwiyeUBWm7t0j2oQQiYbDCP5L8xiOBMfCop9fY\n"
    "QnQzGrXOZ5qJaP7TxPvWZaWdDURf4W1acJqJ1jFuQ6JxHzhu5jr6OnTusGXDxp5c\n"
    "HjIOEiW5AgMBAAECggEAFRB0sO9zZ56i2iFJY1SfkAtgoVMS13/gZlGIOE7kNYhx\n"
    "hlZrB9bi8cCaW1vI7dwS2FGVUCXm2k20cm3LEvRUsPyuwfylMClZpyRbcOC4Oxjz\n"
    "g0eGN3K9SXlCHMdrAO+IZFRawE11xLJe6VHhXwLeLwBN+D5sJ99nj5yABy1W6UOL\n"
    "IMmi8P/I+vyUXCBYiL8UzqGJLhWn5pizoKfFlxFBRw97kD5gjDQ3kbpsVPj94lbM\n"
    "flQUCckU1Gxccyi+ce7OvU9f+ZE0iXnoKhZwA8BRl/C+QVP1zmEUbvQL2Uk89ZqD\n"
    "VKlQBfD8w3PsPqimATVGUO1MdJhx2soeh4w6G5lmUQKBgQDmiH1XTFnkLR83v1QF\n"
    "8utnsLPAbSUW5cOdS2DT1r4r9FylRR69rbq67rVxsVwqp9URjtRgXfPeS8oVNk2q\n"
    "SBWQ7iY9aHYR2LkHODYuYh8wbihyoqyesUjDcWmtjrO6/u050H9g7Qr707Ssln4I\n"
    "nSlDeMdhlZI3vSQZoY2tm+GlZQKBgQDf9TXD6AUT/zHTxXPhNlEgDJXY+/sx/tPj\n"
    "v+lzOC67pgK+cfGYw/V4MNyHY5lf8WnyX61Wydf2opEwFxSZ4YbruaYFjUOgeqUw\n"
    "SyDgRPvFGFomqhpknCZ4WLMCg/fW/R3nf77cERGRqj2XGWPdNYJ93+9qMaCv+wq9\n"
    "Nu1bIEPzxQKBgQCPVO9xVqRRLQjK1Wd9Z2Kbjo7EJlg4G1T7OEGUlGCa3Yy4qPgL\n"
    "ALgnv4EKljZywvTDvOUooWGdpcuYUrIJHFZkTN1zsr4uLGwmI/nz7sfriaIWXDQt\n"
    "WpaeBaap5R60Ngnyt0JrVhZNKnycDdmAq45bR/3XG3LUuwF1+i8ncNLjzQKBgCMZ\n"
    "S/7S+xDCOu3kkR+nopkyP73M5/ZS6KRV7GFZWcGg5+cu9l0pwOvARJ+XVW86547L\n"
    "vd/PLGCD49s0ks73EG0bIFDYbdPVxNPHwnRDe23NPju3BwHjkwfjZtKrGgmAi9I/\n"
    "LAtTRXydwJ9QpF0DyNqvYNc0xekun+U9mX9hlCS9AoGAbhrOpgVnCmKoeVfLVRHy\n"
    "/FJxP16/a+2n5JsYrzy8yHZ+KTYIZ1CDKFoTlf0A86y45uflewpqZrp7VPHX7iYx\n"
    "D7cXiYzU1Tayr0sJ8cz/WLL1/5mpM4Z3+v1xetysGmeGPZYP1v280iKmyX5i7bq+\n"
    "PHAo8vN09IEY0gA3yAa1fJQ=\n"
    "-----END PRIVATE KEY-----\n";
constexpr char kEcPem[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg0eeDkiTTHCUiodpd\n"
    "8iMFM0EiKbbWqCTbA2sWmC4NgsShRANCAAQbKtcPRq4b/Z2VXdLL9f4f4ZlFoEig\n"
    "+55o4kU22kk9YPgVEM3R7jVPzrQ/L2JbXgf55NyX0Ok1IQoMqDjvNN2+\n"
    "-----END PRIVATE KEY-----\n";

const absl::Time kNow = absl::FromUnixSeconds(1700000000);

EVP_PKEY* ReadKey(const char* pem) {
  BIO* bio = BIO_new_mem_buf(pem, -1);
  EVP_PKEY* key = PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (key == nullptr) Fail("cannot read a built-in key");
  return key;
}

std::string B64(absl::string_view bytes) {
  return absl::WebSafeBase64Escape(bytes);
}

std::string BignumParam(EVP_PKEY* key, const char* name, int pad_to) {
  BIGNUM* bn = nullptr;
  if (EVP_PKEY_get_bn_param(key, name, &bn) != 1)
    Fail("cannot read a key parameter");
  const int size = pad_to > 0 ? pad_to : BN_num_bytes(bn);
  std::string out(static_cast<size_t>(size), '\0');
  BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(out.data()), size);
  BN_free(bn);
  return out;
}

// header.payload signed with `key`; ES256 in JOSE's r||s form.
std::string Sign(EVP_PKEY* key, bool ec, absl::string_view header,
                 absl::string_view payload) {
  const std::string input = absl::StrCat(B64(header), ".", B64(payload));
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  size_t len = 0;
  const auto* in = reinterpret_cast<const unsigned char*>(input.data());
  if (EVP_DigestSignInit_ex(ctx, nullptr, "SHA256", nullptr, nullptr, key,
                            nullptr) != 1 ||
      EVP_DigestSign(ctx, nullptr, &len, in, input.size()) != 1) {
    Fail("cannot sign");
  }
  std::string sig(len, '\0');
  if (EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                     in, input.size()) != 1) {
    Fail("cannot sign");
  }
  EVP_MD_CTX_free(ctx);
  sig.resize(len);
  if (ec) {
    const auto* p = reinterpret_cast<const unsigned char*>(sig.data());
    ECDSA_SIG* der = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
    if (der == nullptr) Fail("cannot read an ECDSA signature");
    std::string raw(64, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(der),
                 reinterpret_cast<unsigned char*>(raw.data()), 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(der),
                 reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
    ECDSA_SIG_free(der);
    sig = raw;
  }
  return absl::StrCat(input, ".", B64(sig));
}

JwtOptions Options() {
  JwtOptions options;
  options.issuer = "https://idp.example.com";
  options.audience = "tallyd";
  return options;
}

// Built once; never freed (the process ends with the fuzzer).
struct Fixture {
  EVP_PKEY* rsa = ReadKey(kRsaPem);
  EVP_PKEY* ec = ReadKey(kEcPem);
  std::optional<JwtVerifier> verifier;
  std::string rsa_token;
  std::string ec_token;

  Fixture() {
    const std::string jwks = absl::StrCat(
        R"({"keys":[{"kty":"RSA","kid":"rsa-1","alg":"RS256","use":"sig","n":")",
        B64(BignumParam(rsa, OSSL_PKEY_PARAM_RSA_N, 0)), R"(","e":")",
        B64(BignumParam(rsa, OSSL_PKEY_PARAM_RSA_E, 0)),
        R"("},{"kty":"EC","kid":"ec-1","crv":"P-256","x":")",
        B64(BignumParam(ec, OSSL_PKEY_PARAM_EC_PUB_X, 32)), R"(","y":")",
        B64(BignumParam(ec, OSSL_PKEY_PARAM_EC_PUB_Y, 32)), R"("}]})");
    absl::StatusOr<JwtVerifier> v =
        JwtVerifier::Create(jwks, Options(), "fixed.json");
    if (!v.ok()) Fail("the fixed JWK Set is refused: " + v.status().ToString());
    verifier = *std::move(v);
    const std::string claims =
        R"({"iss":"https://idp.example.com","aud":"tallyd","sub":"alice",)"
        R"("tenant":"research","role":"user","exp":1700003600})";
    rsa_token = Sign(rsa, false, R"({"alg":"RS256","kid":"rsa-1"})", claims);
    ec_token = Sign(ec, true, R"({"alg":"ES256","kid":"ec-1"})", claims);
    if (!verifier->Verify(rsa_token, kNow).ok() ||
        !verifier->Verify(ec_token, kNow).ok()) {
      Fail("the fixed tokens are refused");
    }
  }
};

const Fixture& GetFixture() {
  static const Fixture* fixture = new Fixture();
  return *fixture;
}

bool KnownReason(absl::string_view reason) {
  for (absl::string_view r :
       {"malformed token", "unsupported alg", "unknown key", "bad signature",
        "token expired", "token not yet valid", "wrong issuer",
        "wrong audience", "bad role claim"}) {
    if (reason == r) return true;
  }
  // The lifetime refusal says which bound and how to fix it.
  if (absl::StartsWith(reason, "token lifetime too long: ")) return true;
  for (absl::string_view claim :
       {"exp", "nbf", "iat", "iss", "aud", "sub", "tenant", "role"}) {
    if (reason == absl::StrCat("missing claim ", claim) ||
        reason == absl::StrCat("bad claim ", claim)) {
      return true;
    }
  }
  return false;
}

// Checks one Verify result; returns the reason for a refusal, "" otherwise.
std::string Check(const absl::StatusOr<Principal>& p) {
  if (!p.ok()) {
    if (p.status().code() != absl::StatusCode::kUnauthenticated) {
      Fail("a refused token is not UNAUTHENTICATED: " + p.status().ToString());
    }
    if (!KnownReason(p.status().message())) {
      Fail("an undocumented reason: " + p.status().ToString());
    }
    return std::string(p.status().message());
  }
  if (p->method != "jwt") Fail("method is not \"jwt\"");
  if (p->name.empty()) Fail("a principal without a name");
  if ((p->role == Role::kUser || p->role == Role::kViewer) &&
      p->tenant.empty()) {
    Fail("a user or viewer without a tenant");
  }
  if (p->role == Role::kWorker && !p->tenant.empty())
    Fail("a worker with a tenant");
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Fixture& f = GetFixture();
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const absl::string_view rest(reinterpret_cast<const char*>(data) + 1,
                               size - 1);
  switch (mode & 3) {
    case 0: {
      absl::StatusOr<JwtVerifier> v =
          JwtVerifier::Create(rest, Options(), "fuzz.json");
      if (!v.ok()) {
        if (v.status().code() != absl::StatusCode::kInvalidArgument ||
            !absl::StartsWith(v.status().message(), "fuzz.json: ")) {
          Fail("a refused JWK Set is not INVALID_ARGUMENT naming the source: " +
               v.status().ToString());
        }
        return 0;
      }
      if (v->num_keys() == 0) Fail("a verifier without keys");
      Check(v->Verify(f.rsa_token, kNow));
      Check(v->Verify(f.ec_token, kNow));
      return 0;
    }
    case 1:
      Check(f.verifier->Verify(rest, kNow));
      return 0;
    default: {
      const bool ec = (mode & 3) == 3;
      const bool kid = (mode & 4) != 0;
      const std::string header = absl::StrCat(
          R"({"alg":")", ec ? "ES256" : "RS256", "\"",
          kid ? (ec ? R"(,"kid":"ec-1")" : R"(,"kid":"rsa-1")") : "", "}");
      const std::string token = Sign(ec ? f.ec : f.rsa, ec, header, rest);
      if (token.size() > tally::auth::kMaxJwtBytes) return 0;
      const std::string reason = Check(f.verifier->Verify(token, kNow));
      if (reason == "bad signature" || reason == "unknown key" ||
          reason == "unsupported alg") {
        Fail("a token signed by a known key is refused: " + reason);
      }
      return 0;
    }
  }
}
