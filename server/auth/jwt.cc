#include "server/auth/jwt.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/file/file_system.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/text.h"
#include "nlohmann/json.hpp"
#include "openssl/bn.h"
#include "openssl/core_names.h"
#include "openssl/ec.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/param_build.h"

namespace tally::auth {
namespace jwt_internal {

enum class KeyType { kRsa, kEc };

struct PkeyDeleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
};

struct Key {
  KeyType type;
  std::optional<std::string> kid;
  std::unique_ptr<EVP_PKEY, PkeyDeleter> pkey;
};

}  // namespace jwt_internal

namespace {

using jwt_internal::Key;
using jwt_internal::KeyType;
using Json = nlohmann::json;

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using BignumPtr = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;
using ParamBldPtr =
    std::unique_ptr<OSSL_PARAM_BLD,
                    Deleter<OSSL_PARAM_BLD, OSSL_PARAM_BLD_free>>;
using ParamPtr =
    std::unique_ptr<OSSL_PARAM, Deleter<OSSL_PARAM, OSSL_PARAM_free>>;
using PkeyCtxPtr =
    std::unique_ptr<EVP_PKEY_CTX, Deleter<EVP_PKEY_CTX, EVP_PKEY_CTX_free>>;
using MdCtxPtr =
    std::unique_ptr<EVP_MD_CTX, Deleter<EVP_MD_CTX, EVP_MD_CTX_free>>;
using EcdsaSigPtr =
    std::unique_ptr<ECDSA_SIG, Deleter<ECDSA_SIG, ECDSA_SIG_free>>;

constexpr int kMinRsaBits = 2048;
constexpr int kMaxRsaBits = 8192;
constexpr int kP256Bytes = 32;

// ---- base64url, strict -----------------------------------------------------

int Base64UrlValue(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-') return 62;
  if (c == '_') return 63;
  return -1;
}

// Unpadded base64url with canonical trailing bits, so each byte string has
// exactly one accepted encoding; nullopt for anything else.
std::optional<std::string> Base64UrlDecode(absl::string_view in) {
  if (in.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    const int v = Base64UrlValue(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  if ((acc & ((1u << bits) - 1)) != 0) return std::nullopt;
  return out;
}

// ---- strict JSON -----------------------------------------------------------

// Walks the JSON events before any value is built, refusing what
// nlohmann::json would accept silently: a member name given twice (it keeps
// the last, another parser may keep the first), nesting deeper than
// kMaxJsonDepth, and numbers out of double's range (read as infinity).
class StrictJsonChecker : public nlohmann::json_sax<Json> {
 public:
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t value, const string_t&) override {
    if (std::isfinite(value)) return true;
    return Refuse("a number is out of range");
  }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return Refuse("binary values"); }
  bool start_object(std::size_t) override {
    if (!Enter()) return false;
    names_.emplace_back();
    return true;
  }
  bool key(string_t& name) override {
    if (!names_.back().insert(name).second) {
      return Refuse(absl::StrCat("member ", QuoteForMessage(name),
                                 " is given twice in one object"));
    }
    return true;
  }
  bool end_object() override {
    names_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override { return Enter(); }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&,
                   const nlohmann::detail::exception& e) override {
    // e.what() is nlohmann's "[json.exception.parse_error.101] parse error
    // at line 1, column 2: ...": keep what follows the bracket.
    absl::string_view what = e.what();
    if (size_t end = what.find("] "); end != absl::string_view::npos) {
      what.remove_prefix(end + 2);
    }
    return Refuse(EscapeUnprintable(what.substr(0, 200)));
  }

  const std::string& error() const { return error_; }

 private:
  bool Enter() {
    if (++depth_ > kMaxJsonDepth) {
      return Refuse(
          absl::StrCat("nested deeper than ", kMaxJsonDepth, " levels"));
    }
    return true;
  }
  bool Refuse(std::string why) {
    if (error_.empty()) error_ = std::move(why);
    return false;
  }

  int depth_ = 0;
  std::vector<absl::flat_hash_set<std::string>> names_;
  std::string error_;
};

// The JSON value of `text`, or why it is refused.
absl::StatusOr<Json> ParseStrictJson(absl::string_view text) {
  try {
    StrictJsonChecker checker;
    if (!Json::sax_parse(text.begin(), text.end(), &checker)) {
      return absl::InvalidArgumentError(
          checker.error().empty() ? "is not valid JSON" : checker.error());
    }
    Json value = Json::parse(text.begin(), text.end(), nullptr,
                             /*allow_exceptions=*/false);
    if (value.is_discarded()) {
      return absl::InvalidArgumentError("is not valid JSON");
    }
    return value;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "could not be read as JSON: ", EscapeUnprintable(e.what())));
  }
}

// ---- keys ------------------------------------------------------------------

std::string RsaOrEcAlg(KeyType type) {
  return type == KeyType::kRsa ? "RS256" : "ES256";
}

// Errors while reading a JWK Set: INVALID_ARGUMENT under `source`.
class JwksErrors {
 public:
  explicit JwksErrors(absl::string_view source) : source_(source) {}
  absl::Status Error(absl::string_view where, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, source_.empty() ? "" : ": ", where,
                     where.empty() ? "" : ": ", what));
  }

 private:
  absl::string_view source_;
};

// An optional string member; INVALID_ARGUMENT when present and not a string.
absl::StatusOr<std::optional<std::string>> OptionalString(
    const Json& object, const char* name, const std::string& where,
    const JwksErrors& errors) {
  auto it = object.find(name);
  if (it == object.end()) return std::optional<std::string>();
  if (!it->is_string()) {
    return errors.Error(absl::StrCat(where, ".", name), "must be a string");
  }
  return std::optional<std::string>(it->get<std::string>());
}

// A required base64url member, decoded.
absl::StatusOr<std::string> RequiredBytes(const Json& object, const char* name,
                                          const std::string& where,
                                          const JwksErrors& errors) {
  const std::string field = absl::StrCat(where, ".", name);
  auto it = object.find(name);
  if (it == object.end()) return errors.Error(field, "is missing");
  if (!it->is_string()) {
    return errors.Error(field, "must be a base64url string");
  }
  std::optional<std::string> bytes = Base64UrlDecode(it->get<std::string>());
  if (!bytes.has_value() || bytes->empty()) {
    return errors.Error(field,
                        "is not unpadded base64url (RFC 7515 section 2: "
                        "A-Z a-z 0-9 - _, no \"=\")");
  }
  return *std::move(bytes);
}

BignumPtr ToBignum(absl::string_view bytes) {
  return BignumPtr(
      BN_bin2bn(reinterpret_cast<const unsigned char*>(bytes.data()),
                static_cast<int>(bytes.size()), nullptr));
}

// EVP_PKEY_fromdata on a public key's parameters; null on failure.
EVP_PKEY* PublicKeyFromParams(const char* type, OSSL_PARAM_BLD* bld) {
  ParamPtr params(OSSL_PARAM_BLD_to_param(bld));
  if (params == nullptr) return nullptr;
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr));
  if (ctx == nullptr || EVP_PKEY_fromdata_init(ctx.get()) != 1) return nullptr;
  EVP_PKEY* pkey = nullptr;
  if (EVP_PKEY_fromdata(ctx.get(), &pkey, EVP_PKEY_PUBLIC_KEY, params.get()) !=
      1) {
    return nullptr;
  }
  return pkey;
}

absl::Status ReadRsaKey(const Json& jwk, const std::string& where,
                        const JwksErrors& errors, Key* key) {
  ASSIGN_OR_RETURN(std::string n_bytes, RequiredBytes(jwk, "n", where, errors));
  ASSIGN_OR_RETURN(std::string e_bytes, RequiredBytes(jwk, "e", where, errors));
  if (n_bytes.size() > kMaxRsaBits / 8 + 1) {
    return errors.Error(absl::StrCat(where, ".n"),
                        absl::StrCat("the modulus is longer than ", kMaxRsaBits,
                                     " bits; use a key of 2048 to 8192 bits"));
  }
  BignumPtr n = ToBignum(n_bytes);
  BignumPtr e = ToBignum(e_bytes);
  if (n == nullptr || e == nullptr) {
    return errors.Error(where, "could not be read (out of memory)");
  }
  const int bits = BN_num_bits(n.get());
  if (bits < kMinRsaBits || bits > kMaxRsaBits) {
    return errors.Error(
        absl::StrCat(where, ".n"),
        absl::StrCat("the modulus is ", bits, " bits; use a key of ",
                     kMinRsaBits, " to ", kMaxRsaBits, " bits"));
  }
  // A public exponent is small and odd (65537 nearly always); a huge one
  // would only make each verification slow.
  if (!BN_is_odd(e.get()) || BN_num_bits(e.get()) < 2 ||
      BN_num_bits(e.get()) > 64) {
    return errors.Error(absl::StrCat(where, ".e"),
                        "must be an odd exponent from 3 to 2^64 (usually "
                        "65537, \"AQAB\")");
  }
  ParamBldPtr bld(OSSL_PARAM_BLD_new());
  if (bld == nullptr ||
      OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_N, n.get()) != 1 ||
      OSSL_PARAM_BLD_push_BN(bld.get(), OSSL_PKEY_PARAM_RSA_E, e.get()) != 1) {
    return errors.Error(where, "could not be built (out of memory)");
  }
  key->pkey.reset(PublicKeyFromParams("RSA", bld.get()));
  if (key->pkey == nullptr) {
    return errors.Error(where, "OpenSSL refuses this RSA public key");
  }
  return absl::OkStatus();
}

absl::Status ReadEcKey(const Json& jwk, const std::string& where,
                       const JwksErrors& errors, Key* key) {
  ASSIGN_OR_RETURN(std::string x, RequiredBytes(jwk, "x", where, errors));
  ASSIGN_OR_RETURN(std::string y, RequiredBytes(jwk, "y", where, errors));
  for (const auto& [name, bytes] :
       {std::pair<const char*, const std::string*>{"x", &x}, {"y", &y}}) {
    if (bytes->size() != kP256Bytes) {
      return errors.Error(
          absl::StrCat(where, ".", name),
          absl::StrCat("is ", bytes->size(), " bytes; a P-256 coordinate is ",
                       kP256Bytes, " bytes (43 base64url characters)"));
    }
  }
  std::string point = absl::StrCat("\x04", x, y);  // SEC 1 uncompressed
  ParamBldPtr bld(OSSL_PARAM_BLD_new());
  if (bld == nullptr ||
      OSSL_PARAM_BLD_push_utf8_string(bld.get(), OSSL_PKEY_PARAM_GROUP_NAME,
                                      "prime256v1", 0) != 1 ||
      OSSL_PARAM_BLD_push_octet_string(bld.get(), OSSL_PKEY_PARAM_PUB_KEY,
                                       point.data(), point.size()) != 1) {
    return errors.Error(where, "could not be built (out of memory)");
  }
  key->pkey.reset(PublicKeyFromParams("EC", bld.get()));
  bool valid = key->pkey != nullptr;
  if (valid) {
    PkeyCtxPtr check(
        EVP_PKEY_CTX_new_from_pkey(nullptr, key->pkey.get(), nullptr));
    valid = check != nullptr && EVP_PKEY_public_check(check.get()) == 1;
  }
  if (!valid) {
    return errors.Error(absl::StrCat(where, ".x"),
                        "x and y are not a point on the P-256 curve");
  }
  return absl::OkStatus();
}

// Reads keys[index]: a usable key, nullopt with `skipped` set for a kind of
// key that is not used here, or INVALID_ARGUMENT for a usable kind that is
// broken.
absl::StatusOr<std::optional<Key>> ReadJwk(const Json& jwk, size_t index,
                                           const JwksErrors& errors,
                                           std::string* skipped) {
  const std::string where = absl::StrCat("keys[", index, "]");
  if (!jwk.is_object()) return errors.Error(where, "must be a JSON object");
  ASSIGN_OR_RETURN(std::optional<std::string> kty,
                   OptionalString(jwk, "kty", where, errors));
  if (!kty.has_value()) {
    return errors.Error(absl::StrCat(where, ".kty"),
                        "is missing; use \"RSA\" or \"EC\"");
  }
  ASSIGN_OR_RETURN(std::optional<std::string> kid,
                   OptionalString(jwk, "kid", where, errors));
  ASSIGN_OR_RETURN(std::optional<std::string> use,
                   OptionalString(jwk, "use", where, errors));
  ASSIGN_OR_RETURN(std::optional<std::string> alg,
                   OptionalString(jwk, "alg", where, errors));
  KeyType type;
  if (*kty == "RSA") {
    type = KeyType::kRsa;
  } else if (*kty == "EC") {
    type = KeyType::kEc;
  } else {
    *skipped = absl::StrCat(where, ": kty ", QuoteForMessage(*kty, 16));
    return std::optional<Key>();
  }
  if (use.has_value() && *use != "sig") {
    *skipped = absl::StrCat(where, ": use ", QuoteForMessage(*use, 16));
    return std::optional<Key>();
  }
  if (alg.has_value() && *alg != RsaOrEcAlg(type)) {
    *skipped = absl::StrCat(where, ": alg ", QuoteForMessage(*alg, 16));
    return std::optional<Key>();
  }
  if (auto ops = jwk.find("key_ops"); ops != jwk.end()) {
    if (!ops->is_array()) {
      return errors.Error(absl::StrCat(where, ".key_ops"),
                          "must be an array of strings");
    }
    if (std::find(ops->begin(), ops->end(), Json("verify")) == ops->end()) {
      *skipped = absl::StrCat(where, ": key_ops without \"verify\"");
      return std::optional<Key>();
    }
  }
  if (type == KeyType::kEc) {
    ASSIGN_OR_RETURN(std::optional<std::string> crv,
                     OptionalString(jwk, "crv", where, errors));
    if (!crv.has_value()) {
      return errors.Error(absl::StrCat(where, ".crv"),
                          "is missing; only \"P-256\" is supported");
    }
    if (*crv != "P-256") {
      *skipped = absl::StrCat(where, ": crv ", QuoteForMessage(*crv, 16));
      return std::optional<Key>();
    }
  }
  // Private members (RFC 7518 section 6): a verifier needs none, and a file
  // tallyd reads should not hold a signing key.
  for (const char* private_member : {"d", "p", "q", "dp", "dq", "qi"}) {
    if (jwk.contains(private_member)) {
      return errors.Error(
          absl::StrCat(where, ".", private_member),
          "is private key material; publish only the public key (RSA: kty, "
          "n, e; EC: kty, crv, x, y)");
    }
  }

  Key key;
  key.type = type;
  key.kid = std::move(kid);
  if (type == KeyType::kRsa) {
    RETURN_IF_ERROR(ReadRsaKey(jwk, where, errors, &key));
  } else {
    RETURN_IF_ERROR(ReadEcKey(jwk, where, errors, &key));
  }
  return std::optional<Key>(std::move(key));
}

// ---- verification ----------------------------------------------------------

absl::Status Unauthenticated(absl::string_view reason) {
  return absl::UnauthenticatedError(reason);
}

// ES256's JOSE form is r||s, 32 bytes each; OpenSSL verifies DER.
std::optional<std::string> EcdsaRawToDer(absl::string_view raw) {
  if (raw.size() != 2 * kP256Bytes) return std::nullopt;
  BignumPtr r = ToBignum(raw.substr(0, kP256Bytes));
  BignumPtr s = ToBignum(raw.substr(kP256Bytes));
  EcdsaSigPtr sig(ECDSA_SIG_new());
  if (r == nullptr || s == nullptr || sig == nullptr ||
      ECDSA_SIG_set0(sig.get(), r.get(), s.get()) != 1) {
    return std::nullopt;
  }
  r.release();  // owned by sig now
  s.release();
  unsigned char* der = nullptr;
  const int len = i2d_ECDSA_SIG(sig.get(), &der);
  if (len <= 0) return std::nullopt;
  std::string out(reinterpret_cast<const char*>(der), static_cast<size_t>(len));
  OPENSSL_free(der);
  return out;
}

bool VerifySignature(const Key& key, absl::string_view signing_input,
                     absl::string_view signature) {
  std::string der;
  if (key.type == KeyType::kEc) {
    std::optional<std::string> converted = EcdsaRawToDer(signature);
    if (!converted.has_value()) return false;
    der = *std::move(converted);
    signature = der;
  } else if (signature.size() !=
             static_cast<size_t>(EVP_PKEY_get_size(key.pkey.get()))) {
    return false;
  }
  MdCtxPtr ctx(EVP_MD_CTX_new());
  const bool ok =
      ctx != nullptr &&
      EVP_DigestVerifyInit_ex(ctx.get(), nullptr, "SHA256", nullptr, nullptr,
                              key.pkey.get(), nullptr) == 1 &&
      EVP_DigestVerify(
          ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
          signature.size(),
          reinterpret_cast<const unsigned char*>(signing_input.data()),
          signing_input.size()) == 1;
  // A failed verification leaves errors on this thread's queue.
  ERR_clear_error();
  return ok;
}

// A NumericDate claim: absent (nullopt), or a finite number of seconds.
absl::StatusOr<std::optional<double>> NumericDate(const Json& claims,
                                                  const char* name) {
  auto it = claims.find(name);
  if (it == claims.end()) return std::optional<double>();
  if (!it->is_number()) {
    return Unauthenticated(absl::StrCat("bad claim ", name));
  }
  const double value = it->get<double>();
  if (!std::isfinite(value)) {
    return Unauthenticated(absl::StrCat("bad claim ", name));
  }
  return std::optional<double>(value);
}

// A name-like claim (principal, tenant): nullopt when absent; "bad claim"
// when not a printable string of at most kMaxPrincipalFieldBytes bytes.
absl::StatusOr<std::optional<std::string>> TextClaim(const Json& claims,
                                                     const std::string& name) {
  auto it = claims.find(name);
  if (it == claims.end()) return std::optional<std::string>();
  if (!it->is_string())
    return Unauthenticated(absl::StrCat("bad claim ", name));
  const std::string& value = it->get_ref<const std::string&>();
  if (value.size() > kMaxPrincipalFieldBytes ||
      UnprintableReason(value).has_value()) {
    return Unauthenticated(absl::StrCat("bad claim ", name));
  }
  return std::optional<std::string>(value);
}

// A token's header: the key type its alg names and its kid, if any.
struct JwtHeader {
  KeyType type;
  std::optional<std::string> kid;
};

// "malformed token", or "unsupported alg" for an alg other than RS256 and
// ES256.
absl::StatusOr<JwtHeader> ParseJwtHeader(absl::string_view encoded) {
  const absl::Status malformed = Unauthenticated("malformed token");
  std::optional<std::string> header_text = Base64UrlDecode(encoded);
  if (!header_text.has_value()) return malformed;
  absl::StatusOr<Json> header = ParseStrictJson(*header_text);
  if (!header.ok() || !header->is_object()) return malformed;
  auto alg = header->find("alg");
  if (alg == header->end() || !alg->is_string()) return malformed;
  JwtHeader parsed;
  if (*alg == "RS256") {
    parsed.type = KeyType::kRsa;
  } else if (*alg == "ES256") {
    parsed.type = KeyType::kEc;
  } else {
    return Unauthenticated("unsupported alg");
  }
  // No extension is understood, so none may be critical (RFC 7515 4.1.11).
  if (header->contains("crit")) return malformed;
  if (auto it = header->find("kid"); it != header->end()) {
    if (!it->is_string()) return malformed;
    parsed.kid = it->get<std::string>();
  }
  return parsed;
}

// exp (required) and nbf against `now`, and the lifetime bounds.
absl::Status CheckTokenTimes(const Json& claims, const JwtOptions& options, absl::Time now) {
  const double now_seconds = absl::ToDoubleSeconds(now - absl::UnixEpoch());
  const double leeway_seconds = absl::ToDoubleSeconds(options.leeway);
  ASSIGN_OR_RETURN(std::optional<double> exp, NumericDate(claims, "exp"));
  if (!exp.has_value()) return Unauthenticated("missing claim exp");
  ASSIGN_OR_RETURN(std::optional<double> nbf, NumericDate(claims, "nbf"));
  if (now_seconds >= *exp + leeway_seconds) {
    return Unauthenticated("token expired");
  }
  if (nbf.has_value() && now_seconds < *nbf - leeway_seconds) {
    return Unauthenticated("token not yet valid");
  }
  // Bounded lifetimes: issued for at most max_lifetime, and never valid for
  // longer than that from now (an iat in the future or absent does not
  // lengthen it).
  const double max_seconds = absl::ToDoubleSeconds(options.max_lifetime);
  ASSIGN_OR_RETURN(std::optional<double> iat, NumericDate(claims, "iat"));
  if ((iat.has_value() && *exp - *iat > max_seconds) ||
      *exp - now_seconds > max_seconds + leeway_seconds) {
    return Unauthenticated(absl::StrCat(
        "token lifetime too long: exp must be at most ",
        absl::FormatDuration(options.max_lifetime),
        " after iat and after now (--jwt_max_lifetime); issue shorter-lived tokens"));
  }
  return absl::OkStatus();
}

absl::Status CheckIssuerAndAudience(const Json& claims, const JwtOptions& options) {
  auto iss = claims.find("iss");
  if (iss == claims.end()) return Unauthenticated("missing claim iss");
  if (!iss->is_string() || *iss != options.issuer) {
    return Unauthenticated("wrong issuer");
  }
  auto aud = claims.find("aud");
  if (aud == claims.end()) return Unauthenticated("missing claim aud");
  bool audience_ok = false;
  if (aud->is_string()) {
    audience_ok = *aud == options.audience;
  } else if (aud->is_array()) {
    for (const Json& item : *aud) {
      if (item.is_string() && item == options.audience) audience_ok = true;
    }
  }
  if (!audience_ok) return Unauthenticated("wrong audience");
  return absl::OkStatus();
}

// The role, the principal's name and (for users and viewers, required;
// admins, optional) the tenant.
absl::StatusOr<Principal> ReadPrincipal(const Json& claims, const JwtOptions& options) {
  Principal principal;
  principal.method = "jwt";
  auto role = claims.find(options.role_claim);
  if (role == claims.end()) {
    return Unauthenticated(absl::StrCat("missing claim ", options.role_claim));
  }
  if (!role->is_string()) return Unauthenticated("bad role claim");
  absl::StatusOr<Role> parsed_role =
      ParseRole(role->get_ref<const std::string&>());
  if (!parsed_role.ok()) return Unauthenticated("bad role claim");
  principal.role = *parsed_role;

  ASSIGN_OR_RETURN(std::optional<std::string> name,
                   TextClaim(claims, options.principal_claim));
  if (!name.has_value() || name->empty()) {
    return Unauthenticated(
        absl::StrCat("missing claim ", options.principal_claim));
  }
  principal.name = *std::move(name);

  if (principal.role != Role::kWorker) {
    ASSIGN_OR_RETURN(std::optional<std::string> tenant,
                     TextClaim(claims, options.tenant_claim));
    const bool needs_tenant =
        principal.role == Role::kUser || principal.role == Role::kViewer;
    // A tenant names metric series: a label value, trimmed. The reason
    // names the claim, never its value.
    absl::StatusOr<std::string> name = TenantName("tenant", tenant.value_or(""));
    if (!name.ok()) return Unauthenticated(absl::StrCat("bad claim ", options.tenant_claim));
    if (needs_tenant && name->empty()) {
      return Unauthenticated(
          absl::StrCat("missing claim ", options.tenant_claim));
    }
    principal.tenant = *std::move(name);
  }
  return principal;
}

absl::Status ValidateOptions(const JwtOptions& options,
                             const JwksErrors& errors) {
  if (options.issuer.empty()) {
    return errors.Error("",
                        "no issuer: set --jwt_issuer to the identity "
                        "provider's \"iss\" value");
  }
  if (options.audience.empty()) {
    return errors.Error("",
                        "no audience: set --jwt_audience to the \"aud\" "
                        "value tokens for tallyd carry");
  }
  const std::pair<const char*, const std::string*> claims[] = {
      {"principal", &options.principal_claim},
      {"tenant", &options.tenant_claim},
      {"role", &options.role_claim}};
  for (const auto& [what, name] : claims) {
    if (name->empty()) {
      return errors.Error("", absl::StrCat("the ", what,
                                           " claim name is empty; name the "
                                           "claim that holds the ",
                                           what));
    }
  }
  if (options.principal_claim == options.tenant_claim ||
      options.principal_claim == options.role_claim ||
      options.tenant_claim == options.role_claim) {
    return errors.Error("",
                        "the principal, tenant and role claims must have "
                        "different names");
  }
  if (options.leeway < absl::ZeroDuration() ||
      options.leeway == absl::InfiniteDuration()) {
    return errors.Error("",
                        "the leeway must be a finite duration of zero "
                        "or more, e.g. 60s");
  }
  if (options.max_lifetime <= absl::ZeroDuration() ||
      options.max_lifetime == absl::InfiniteDuration()) {
    return errors.Error("",
                        "the maximum token lifetime must be a positive finite "
                        "duration, e.g. 24h");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JwtVerifier> JwtVerifier::Create(absl::string_view jwks_json,
                                                JwtOptions options,
                                                absl::string_view source) {
  const JwksErrors errors(source);
  RETURN_IF_ERROR(ValidateOptions(options, errors));
  if (jwks_json.size() > kMaxJwksBytes) {
    return errors.Error(
        "", absl::StrCat("the JWK Set is larger than ", kMaxJwksBytes >> 10,
                         " KiB; keep only the keys that sign tokens for "
                         "tallyd"));
  }
  absl::StatusOr<Json> jwks = ParseStrictJson(jwks_json);
  if (!jwks.ok()) {
    return errors.Error(
        "", absl::StrCat("not a JWK Set: the JSON ", jwks.status().message()));
  }
  if (!jwks->is_object()) {
    return errors.Error("",
                        "not a JWK Set: expected a JSON object "
                        "{\"keys\": [...]}");
  }
  auto keys_it = jwks->find("keys");
  if (keys_it == jwks->end() || !keys_it->is_array()) {
    return errors.Error("keys", "must be an array of JWKs ({\"keys\": [...]})");
  }
  if (keys_it->size() > kMaxJwksKeys) {
    return errors.Error(
        "keys", absl::StrCat("holds ", keys_it->size(), " keys; at most ",
                             kMaxJwksKeys, " are read"));
  }
  std::vector<std::shared_ptr<const Key>> keys;
  std::vector<std::string> skipped;
  for (size_t i = 0; i < keys_it->size(); ++i) {
    std::string why;
    ASSIGN_OR_RETURN(std::optional<Key> key,
                     ReadJwk((*keys_it)[i], i, errors, &why));
    if (key.has_value()) {
      keys.push_back(std::make_shared<const Key>(*std::move(key)));
    } else {
      skipped.push_back(std::move(why));
    }
  }
  if (keys.empty()) {
    if (skipped.size() > 4) {
      const size_t more = skipped.size() - 4;
      skipped.resize(4);
      skipped.push_back(absl::StrCat(more, " more"));
    }
    return errors.Error(
        "keys",
        absl::StrCat("no usable key: tallyd verifies RS256 with RSA keys "
                     "(kty \"RSA\", n, e) and ES256 with P-256 keys (kty "
                     "\"EC\", crv \"P-256\", x, y)",
                     skipped.empty() ? "; the set is empty" : "; skipped ",
                     absl::StrJoin(skipped, ", ")));
  }
  return JwtVerifier(std::move(keys), std::move(options));
}

absl::StatusOr<JwtVerifier> JwtVerifier::Load(const std::string& jwks_path,
                                              JwtOptions options) {
  std::ifstream in(jwks_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(
        jwks_path, ": cannot be read; check the path and permissions"));
  }
  // One byte past the limit is enough to refuse a file that is too long.
  absl::StatusOr<std::string> text = file::ReadAtMost(in, kMaxJwksBytes);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat(jwks_path, ": cannot be read"));
  return Create(*text, std::move(options), jwks_path);
}

absl::StatusOr<Principal> JwtVerifier::Verify(absl::string_view token,
                                              absl::Time now) const {
  const absl::Status malformed = Unauthenticated("malformed token");
  if (token.empty() || token.size() > kMaxJwtBytes) return malformed;
  const size_t dot1 = token.find('.');
  if (dot1 == absl::string_view::npos) return malformed;
  const size_t dot2 = token.find('.', dot1 + 1);
  if (dot2 == absl::string_view::npos ||
      token.find('.', dot2 + 1) != absl::string_view::npos) {
    return malformed;
  }
  const absl::string_view signing_input = token.substr(0, dot2);

  // Header: alg and kid pick the keys.
  ASSIGN_OR_RETURN(const JwtHeader header, ParseJwtHeader(token.substr(0, dot1)));

  std::optional<std::string> signature =
      Base64UrlDecode(token.substr(dot2 + 1));
  std::optional<std::string> payload_text =
      Base64UrlDecode(token.substr(dot1 + 1, dot2 - dot1 - 1));
  if (!signature.has_value() || !payload_text.has_value()) return malformed;

  bool any_key = false;
  bool verified = false;
  for (const std::shared_ptr<const Key>& key : keys_) {
    if (key->type != header.type) continue;
    if (header.kid.has_value() && key->kid != header.kid) continue;
    any_key = true;
    if (VerifySignature(*key, signing_input, *signature)) {
      verified = true;
      break;
    }
  }
  if (!any_key) return Unauthenticated("unknown key");
  if (!verified) return Unauthenticated("bad signature");

  // Claims, read only once the signature holds.
  absl::StatusOr<Json> claims = ParseStrictJson(*payload_text);
  if (!claims.ok() || !claims->is_object()) return malformed;

  RETURN_IF_ERROR(CheckTokenTimes(*claims, options_, now));
  RETURN_IF_ERROR(CheckIssuerAndAudience(*claims, options_));
  return ReadPrincipal(*claims, options_);
}

}  // namespace tally::auth
