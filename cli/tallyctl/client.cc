#include "cli/tallyctl/client.h"

#include <chrono>
#include <random>
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cli/tallyctl/flags.h"
#include "cli/tallyctl/output.h"
#include "common/controller_list.h"

namespace tally::cli {
namespace {

std::string CodeName(grpc::StatusCode code) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",          "UNKNOWN",        "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS", "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",    "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i <= 16 ? kNames[i] : absl::StrCat("status ", i);
}

// Plaintext, or TLS verified against the given roots (and name).
std::shared_ptr<grpc::Channel> MakeChannel(const Connection& conn) {
  if (conn.ca_cert_pem.empty()) {
    return grpc::CreateChannel(conn.address, grpc::InsecureChannelCredentials());
  }
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = conn.ca_cert_pem;
  grpc::ChannelArguments args;
  // GRPC_SSL_TARGET_NAME_OVERRIDE_ARG: the name checked in the certificate.
  if (!conn.tls_server_name.empty()) args.SetSslTargetNameOverride(conn.tls_server_name);
  return grpc::CreateCustomChannel(conn.address, grpc::SslCredentials(ssl), args);
}

// Whether an UNAVAILABLE message is about TLS (a handshake or certificate
// that failed), not about reaching the address.
bool IsTlsFailure(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  for (const char* word : {"ssl", "tls", "handshake", "certificate"}) {
    if (absl::StrContains(lower, word)) return true;
  }
  return false;
}

}  // namespace

int ExitFor(const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::OK:
      return kOk;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
      return kUsage;
    case grpc::StatusCode::NOT_FOUND:
      return kNotFound;
    case grpc::StatusCode::FAILED_PRECONDITION:
      return kFailedPrecondition;
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kUnavailable;
    default:
      return kError;
  }
}

bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::CANCELLED;
}

Client::Client(Connection conn) : conn_(std::move(conn)) {
  for (absl::string_view address : absl::StrSplit(conn_.address, ',', absl::SkipEmpty())) {
    Connection one = conn_;
    one.address = std::string(absl::StripAsciiWhitespace(address));
    Endpoint e;
    e.address = one.address;
    e.channel = MakeChannel(one);
    e.jobs = tally::v1::Jobs::NewStub(e.channel);
    e.experiments = tally::v1::Experiments::NewStub(e.channel);
    endpoints_.push_back(std::move(e));
  }
}

void Client::Prepare(grpc::ClientContext* ctx) const {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_timeout)));
  Authorize(ctx);
}

std::string Client::Redact(absl::string_view text) const {
  if (conn_.token.empty()) return std::string(text);
  return absl::StrReplaceAll(text, {{conn_.token, "<token>"}});
}

std::string Client::Addresses() const {
  std::vector<std::string> all;
  for (const Endpoint& e : endpoints_) all.push_back(e.address);
  return absl::StrJoin(all, ", ");
}

int Fail(const grpc::Status& s, const Client& c) {
  const std::string message =
      s.error_message().empty()
          ? absl::StrCat("tallyd answered ", CodeName(s.error_code()), " with no message")
          : Safe(c.Redact(s.error_message()));
  const Connection& conn = c.connection();
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      if (c.num_addresses() > 1) {
        std::cerr << "tallyctl: no tallyd of " << Safe(c.Addresses())
                  << " answered (each was tried); the last, " << Safe(c.controller())
                  << ", said: " << message << "\n";
      } else {
        std::cerr << "tallyctl: tallyd at " << Safe(c.controller())
                  << " is not reachable: " << message << "\n";
      }
      if (IsTlsFailure(s.error_message())) {
        std::cerr << "tallyctl: hint: the TLS handshake failed; check --ca_cert / "
                     "TALLY_CA_CERT and the server's name"
                  << (conn.ca_cert_pem.empty()
                          ? " (no CA certificate is set, so tallyctl spoke plaintext)"
                          : absl::StrCat(" (roots from ", Safe(conn.ca_cert_source), " ",
                                         Safe(conn.ca_cert_path),
                                         conn.tls_server_name.empty()
                                             ? "; the name checked is the address's host, "
                                               "--tls_server_name overrides it"
                                             : absl::StrCat("; the name checked is ",
                                                            Safe(conn.tls_server_name)),
                                         ")"))
                  << "\n";
      } else if (conn.ca_cert_pem.empty() &&
                 absl::StrContains(s.error_message(), "Socket closed")) {
        // What a TLS server does to a plaintext client.
        std::cerr << "tallyctl: hint: if tallyd uses TLS, set --ca_cert or TALLY_CA_CERT "
                     "(or choose a --context with a ca_cert)\n";
      }
      break;
    case grpc::StatusCode::UNAUTHENTICATED:
      std::cerr << "tallyctl: tallyd did not accept the call's credentials: " << message
                << "\n";
      std::cerr << "tallyctl: hint: "
                << (conn.token.empty()
                        ? std::string("no token was sent; ")
                        : absl::StrCat("the token from ", Safe(conn.token_source),
                                       " was refused; "))
                << "pass --token, set TALLY_TOKEN, or choose a --context with a token_file\n";
      break;
    case grpc::StatusCode::PERMISSION_DENIED:
      std::cerr << "tallyctl: tallyd refused the call: " << message << "\n";
      std::cerr << "tallyctl: hint: the token's role or tenant does not allow this; use a "
                   "token with the right role (admin, user, viewer) and tenant, which an "
                   "admin makes with tallyctl token create\n";
      break;
    default:
      std::cerr << "tallyctl: " << message << "\n";
  }
  return ExitFor(s);
}

std::string RequestId() {
  std::string request_id = absl::GetFlag(FLAGS_request_id);
  if (request_id.empty()) {
    std::mt19937_64 rng(std::random_device{}());
    request_id = absl::StrFormat("tallyctl-%016x%016x", rng(), rng());
  }
  return request_id;
}

int ResolveFlags(Connection* conn) {
  ConnectionFlags flags{.controller = absl::GetFlag(FLAGS_controller),
                        .token = absl::GetFlag(FLAGS_token),
                        .token_file = absl::GetFlag(FLAGS_token_file),
                        .ca_cert = absl::GetFlag(FLAGS_ca_cert),
                        .tls_server_name = absl::GetFlag(FLAGS_tls_server_name),
                        .context = absl::GetFlag(FLAGS_context),
                        .config_file = absl::GetFlag(FLAGS_config_file)};
  absl::StatusOr<Connection> resolved = ResolveConnection(flags, ProcessEnvironment());
  if (!resolved.ok()) {
    std::cerr << "tallyctl: " << resolved.status().message() << "\n";
    return kUsage;
  }
  *conn = *std::move(resolved);
  absl::StatusOr<std::vector<std::string>> addresses =
      ParseControllerList(conn->address, conn->address_source);
  if (!addresses.ok()) {
    std::cerr << "tallyctl: " << addresses.status().message() << "\n";
    return kUsage;
  }
  conn->address = absl::StrJoin(*addresses, ",");
  for (const std::string& address : *addresses) {
    if (!conn->token.empty() && conn->ca_cert_pem.empty() && !IsLoopbackAddress(address)) {
      std::cerr << "tallyctl: warning: the token goes to " << Safe(address)
                << " without TLS, readable by anyone on the path; set --ca_cert (or "
                   "TALLY_CA_CERT, or the context's ca_cert)\n";
      break;
    }
  }
  return kOk;
}

}  // namespace tally::cli
