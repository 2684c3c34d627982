// How tallyctl talks to tallyd: the connection the flags resolve to, a
// Client over tallyd's one or several addresses (a leader and its standbys),
// unary calls sent again where that is safe, and a failed call told on
// stderr and turned into tallyctl's exit code.
#ifndef TALLY_CLI_TALLYCTL_CLIENT_H_
#define TALLY_CLI_TALLYCTL_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/tallyctl/client_config.h"
#include "cli/tallyctl/exit_codes.h"
#include "tally/v1/experiments.grpc.pb.h"
#include "tally/v1/jobs.grpc.pb.h"

namespace tally::cli {

// The exit code for a call's status: kOk; kUsage for INVALID_ARGUMENT and
// ALREADY_EXISTS; kNotFound; kFailedPrecondition; kUnavailable for
// UNAVAILABLE and DEADLINE_EXCEEDED; kError for anything else.
int ExitFor(const grpc::Status& s);

// Whether a unary call may be sent again, to the next tallyd or after a
// wait: UNAVAILABLE (unreachable, draining, or a standby), or CANCELLED,
// which tallyctl never asks for on a unary call, so the tallyd serving it
// went away mid-call (a leader that lost its lease exits so). Submits carry
// a request id, so a retry makes no second job.
bool Retryable(const grpc::Status& s);

// Every call's context is made ready here: Prepare for unary calls,
// Authorize for streams (which have no deadline).
//
// conn.address may list several tallyds (checked by ParseControllerList):
// a leader and its standbys. Unary calls go through Call(), which moves on
// to the next address while the one it tried answers UNAVAILABLE (a standby,
// or a tallyd that is down; see Retryable) and keeps the one that answered
// for the calls after it; streams call Next() themselves before resuming.
class Client {
 public:
  // One endpoint per address of conn.address (comma-separated).
  explicit Client(Connection conn);

  // Runs `call` (a unary call) with a fresh Prepare()d context on the
  // current tallyd, then, while the answer is Retryable, on each other
  // address in the list's order; the address that answered stays current.
  // `call` reaches the tallyd through stub() or experiments(). A request
  // with a request_id makes nothing twice however many tallyds it reaches.
  template <typename F>
  grpc::Status Call(F call) {
    grpc::Status s;
    for (size_t tried = 0; tried < endpoints_.size(); ++tried) {
      grpc::ClientContext ctx;
      Prepare(&ctx);
      answered_ = current_;
      s = call(&ctx);
      if (!Retryable(s)) break;
      Next();
    }
    return s;
  }
  // Makes the next address in the list current (a stream that ended
  // UNAVAILABLE resumes there).
  void Next() {
    answered_ = current_;
    current_ = (current_ + 1) % endpoints_.size();
  }

  // --timeout's deadline, and the credentials.
  void Prepare(grpc::ClientContext* ctx) const;
  // The bearer token, if there is one.
  void Authorize(grpc::ClientContext* ctx) const {
    if (!conn_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + conn_.token);
  }
  // `text` (e.g. an error from tallyd) with the token, should it appear,
  // blanked out: tallyctl never prints it.
  std::string Redact(absl::string_view text) const;
  tally::v1::Jobs::Stub* stub() { return endpoints_[current_].jobs.get(); }
  tally::v1::Experiments::Stub* experiments() { return endpoints_[current_].experiments.get(); }
  // The address of the tallyd that gave the last answer (a failure's).
  const std::string& controller() const { return endpoints_[answered_].address; }
  // Every address, for messages: "a:1" or "a:1, b:2".
  std::string Addresses() const;
  size_t num_addresses() const { return endpoints_.size(); }
  const Connection& connection() const { return conn_; }

 private:
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<tally::v1::Jobs::Stub> jobs;
    std::unique_ptr<tally::v1::Experiments::Stub> experiments;
  };
  Connection conn_;
  std::vector<Endpoint> endpoints_;  // never empty
  size_t current_ = 0;
  size_t answered_ = 0;
};

// Says on stderr why the call failed, in tallyctl's words (the token never
// appears), with a hint for what usually causes it: tallyd unreachable (each
// address tried; a failed TLS handshake, or a TLS server spoken to in
// plaintext), the credentials refused, or the call not allowed. Returns
// ExitFor(s).
int Fail(const grpc::Status& s, const Client& c);

// --request_id, or a fresh random key (reused for this command's own
// retries, so a call whose answer was lost makes nothing twice).
std::string RequestId();

// Runs `call` (a unary call, through Client::Call: every address in turn)
// up to three times while tallyd is UNAVAILABLE (Retryable), backing off.
template <typename F>
grpc::Status WithRetries(Client& c, F call) {
  grpc::Status s;
  for (int attempt = 0; attempt < 3; ++attempt) {
    s = c.Call(call);
    if (!Retryable(s)) break;
    absl::SleepFor(absl::Milliseconds(300 << attempt));
  }
  return s;
}

// The connection from the flags, the environment and the config file
// (ResolveConnection), its addresses checked (ParseControllerList); a
// warning on stderr when a token would travel to a non-loopback address
// without TLS. kOk, or kUsage with the error printed.
int ResolveFlags(Connection* conn);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_CLIENT_H_
