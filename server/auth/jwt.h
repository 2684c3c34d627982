// JSON Web Tokens for tallyd (--jwt_jwks, --jwt_issuer, --jwt_audience): a
// bearer token signed by an identity provider whose public keys are in a JWK
// Set file (RFC 7517), verified without any network access.
//
// Keys. The file is {"keys": [...]}, at most kMaxJwksBytes bytes and
// kMaxJwksKeys keys. Usable keys are RSA (kty "RSA", n, e; modulus 2048 to
// 8192 bits; for RS256) and EC P-256 (kty "EC", crv "P-256", x, y; for
// ES256), each with an optional kid, use (only "sig" is usable) and alg (must
// then be RS256 or ES256 to match the key). Keys of any other kind (kty oct
// or OKP, other curves, use "enc", alg RS512, ...) are skipped. A usable kind
// of key whose fields are wrong (bad base64url, a point not on the curve, a
// short modulus) is an error, not skipped: an operator who put it there
// expects it to work. No usable key at all is an error. Every error is
// INVALID_ARGUMENT naming the source, the key (keys[i]) and the field.
//
// Tokens. Compact JWS only: header.payload.signature, each base64url
// WITHOUT padding ("=" is refused, as are characters outside the base64url
// alphabet and non-zero unused trailing bits), at most kMaxJwtBytes bytes.
// Header, payload and JWK Set must be JSON objects with no member name given
// twice, nested at most kMaxJsonDepth deep. Checks, in order:
// - header alg RS256 or ES256 ("none", HS256 and the rest: "unsupported
//   alg"); a "crit" header is refused ("malformed token"); keys embedded in
//   the header (jwk, jku, x5u, x5c) are never used;
// - with a kid, the keys with that kid and the alg's key type; without, every
//   key of that type ("unknown key" when there is none); the signature must
//   verify with one of them ("bad signature"). ES256 signatures are the
//   64-byte r||s of RFC 7518;
// - exp (required) and nbf (optional), NumericDate seconds, with `leeway`
//   for clock skew: expired when now >= exp + leeway, not yet valid when
//   now < nbf - leeway;
// - a bounded lifetime: exp - iat (when iat is present) and exp - now (always)
//   at most `max_lifetime` (exp - now: plus the leeway); otherwise "token
//   lifetime too long" naming the maximum;
// - iss equal to `issuer`; aud equal to `audience` or an array holding it;
// - principal, role and tenant claims (names set in JwtOptions): the
//   principal a non-empty printable string of at most
//   kMaxPrincipalFieldBytes bytes; the role one of admin, user, viewer,
//   worker; the tenant required (non-empty) for user and viewer, optional
//   for admin (absent or "": a global admin, every tenant; a tenant: an
//   admin of that tenant only) and ignored for a worker (whose tenant is
//   always ""). A worker's principal claim is the one worker id it may
//   connect as (api::Gate refuses a Hello naming another).
// A refused token is UNAUTHENTICATED with a short reason that carries no key
// material and no claim value, only claim names: "malformed token",
// "unsupported alg", "unknown key", "bad signature", "token expired",
// "token not yet valid", "token lifetime too long: ...", "wrong issuer",
// "wrong audience",
// "missing claim <name>" (absent, or an empty tenant), "bad claim <name>"
// (wrong type, not printable, too long; "bad claim iat" for an iat that is
// not a number; a tenant that is not a label value once trimmed: 1-64 of
// letters, digits and _ . : -) and "bad role claim".
//
// A JwtVerifier is immutable once built; Verify is thread-safe. Copies share
// the keys.
#ifndef TALLY_SERVER_AUTH_JWT_H_
#define TALLY_SERVER_AUTH_JWT_H_

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/auth/principal.h"

namespace tally::auth {
namespace jwt_internal {
struct Key;  // one usable public key; defined in jwt.cc
}  // namespace jwt_internal

inline constexpr size_t kMaxJwtBytes = size_t{16} << 10;
inline constexpr size_t kMaxJwksBytes = size_t{1} << 20;
inline constexpr size_t kMaxJwksKeys = 100;
inline constexpr int kMaxJsonDepth = 16;

struct JwtOptions {
  std::string issuer;  // required, exact match of "iss"
  // Required; "aud" may be a string or an array containing it.
  std::string audience;
  std::string principal_claim = "sub";
  std::string tenant_claim = "tenant";
  std::string role_claim = "role";  // its value: admin, user, viewer or worker
  absl::Duration leeway = absl::Seconds(60);  // clock skew allowed for exp/nbf
  // The longest a token may be valid (exp - iat, exp - now); positive.
  absl::Duration max_lifetime = absl::Hours(24);
};

class JwtVerifier {
 public:
  // The verifier for the keys in `jwks_json`; `source` (the file) starts
  // every error message. INVALID_ARGUMENT for a bad key set (see above) or
  // bad options: an empty issuer, audience or claim name, two claims with
  // one name, a negative leeway.
  static absl::StatusOr<JwtVerifier> Create(absl::string_view jwks_json,
                                            JwtOptions options,
                                            absl::string_view source);

  // Create on the file at `jwks_path`. NOT_FOUND when it cannot be read.
  static absl::StatusOr<JwtVerifier> Load(const std::string& jwks_path,
                                          JwtOptions options);

  // The principal `token` speaks for at time `now`, with method "jwt", or
  // UNAUTHENTICATED with the reason (see above).
  absl::StatusOr<Principal> Verify(absl::string_view token,
                                   absl::Time now) const;

  // The number of usable keys.
  size_t num_keys() const { return keys_.size(); }

 private:
  JwtVerifier(std::vector<std::shared_ptr<const jwt_internal::Key>> keys,
              JwtOptions options)
      : keys_(std::move(keys)), options_(std::move(options)) {}

  std::vector<std::shared_ptr<const jwt_internal::Key>> keys_;
  JwtOptions options_;
};

}  // namespace tally::auth

#endif  // TALLY_SERVER_AUTH_JWT_H_
