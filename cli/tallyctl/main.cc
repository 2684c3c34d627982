// tallyctl: the command-line client for tallyd's Jobs and Experiments APIs.
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <sstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/tallyctl/client_config.h"
#include "cli/tallyctl/experiment_report.h"
#include "cli/tallyctl/job_format.h"
#include "cli/tallyctl/tokens.h"
#include "common/controller_list.h"
#include "common/experiment_spec.h"
#include "common/watch_metadata.h"
#include "common/spec_validation.h"
#include "common/spec_yaml.h"
#include "common/text.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/time_util.h"
#include "tally/v1/experiments.grpc.pb.h"
#include "tally/v1/jobs.grpc.pb.h"

ABSL_FLAG(std::string, controller, "",
          "tallyd's gRPC address HOST:PORT, or several separated by commas (a leader "
          "and its standbys): each call tries them in order while one answers "
          "UNAVAILABLE (default: $TALLY_CONTROLLER, else the context's address, else "
          "127.0.0.1:50051)");
ABSL_FLAG(std::string, token, "",
          "bearer token sent to tallyd on every call (default: $TALLY_TOKEN, else "
          "the context's token_file); visible to other users in the process list, "
          "so prefer --token_file or $TALLY_TOKEN");
ABSL_FLAG(std::string, token_file, "",
          "a file holding the bearer token (surrounding whitespace is ignored)");
ABSL_FLAG(std::string, ca_cert, "",
          "PEM file of the CA certificate(s) that signed tallyd's certificate; set "
          "means TLS (default: $TALLY_CA_CERT, else the context's ca_cert, else "
          "plaintext)");
ABSL_FLAG(std::string, tls_server_name, "",
          "with TLS: the name to check in tallyd's certificate, when it is not the "
          "address's host (e.g. the address is an IP)");
ABSL_FLAG(std::string, context, "",
          "the context of the config file to use (default: $TALLY_CONTEXT, else "
          "the file's current_context)");
ABSL_FLAG(std::string, config_file, "",
          "tallyctl's config file (default: $TALLY_CONFIG, else "
          "~/.config/tally/config.yaml)");
ABSL_FLAG(std::string, tenant, "",
          "list, experiment list: only this tenant's (admins); token create: the "
          "token's tenant");
ABSL_FLAG(std::string, name, "",
          "token create: the principal the token speaks for (a worker: its id)");
ABSL_FLAG(std::string, role, "",
          "token create: admin, user, viewer or worker");
ABSL_FLAG(std::string, output, "text", "output format: text or json");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "deadline for each call (watch: for each reconnect)");
ABSL_FLAG(std::string, file, "", "submit: the job spec, YAML or JSON (- for stdin)");
ABSL_FLAG(std::string, request_id, "",
          "submit: idempotency key; a retried submit with the same key makes no "
          "second job (default: a fresh random key, reused for this command's "
          "own retries)");
ABSL_FLAG(std::string, state, "",
          "list: only jobs in these states, comma-separated (e.g. queued,running)");
ABSL_FLAG(int, page_size, 50, "list: jobs per page");
ABSL_FLAG(std::string, page_token, "", "list: continue from a previous page");
ABSL_FLAG(std::string, reason, "", "cancel: why, recorded in the job's events");
ABSL_FLAG(int64_t, after, 0, "watch: start after this event sequence number");
ABSL_FLAG(bool, wait, true, "submit: false to return right after submitting");
ABSL_FLAG(std::string, svg, "",
          "experiment report: write the loss-against-dollars chart to this SVG file");
ABSL_FLAG(std::string, svg_x, "recipe",
          "experiment report: the chart's x axis, recipe (each variant's steps at its own "
          "median step time and price; billed when a variant has no step times) or billed "
          "(what tallyd billed)");
ABSL_FLAG(std::string, svg_y, "target",
          "experiment report: the chart's y axis, target (the region around the target "
          "loss) or full (every loss)");

namespace tally::cli {
namespace {

using google::protobuf::util::TimeUtil;

// Exit codes, by what the caller should do.
enum Exit {
  kOk = 0,
  kError = 1,           // anything else
  kUsage = 2,           // bad flags or a bad spec: fix the input
  kNotFound = 3,
  kFailedPrecondition = 4,  // e.g. cancelling a job that has ended
  kUnavailable = 5,     // tallyd not reachable: retry later
  kJobUnsuccessful = 6, // watch: the job ended FAILED, CANCELLED or BUDGET_EXHAUSTED
};

constexpr char kUsageText[] = R"(tallyctl: submit and follow Tally training jobs.

Usage: tallyctl [flags] COMMAND [ARGS]

Commands:
  submit -f job.yaml     submit a job spec (YAML or JSON); prints the job name
  get JOB                show one job (JOB is jobs/ID or just ID)
  list                   list jobs, newest first (--state, --page_size;
                         admins: --tenant=T for one tenant's)
  watch JOB              follow a job's events until it ends (progress bar on
                         a terminal, one line per event otherwise)
  cancel JOB             cancel a queued or running job (--reason)
  checkpoints JOB        list a job's checkpoints, with their cost
  cost JOB               what a job cost: estimate beside actual, dollars per
                         checkpoint, dollars lost to failures and redone
                         after preemptions
  estimate -f job.yaml   price a spec before submitting it (and on spot
                         capacity, where tallyd has a spot price)
  validate -f job.yaml   check a spec locally without submitting

  experiment create -f exp.yaml   run a recipe experiment (variants of one
                         base spec, judged by dollars to a target loss);
                         prints experiments/ID
  experiment get EXP     the experiment and its variants' figures
  experiment list        experiments, newest first (--page_size, --tenant)
  experiment watch EXP   follow it until it ends (a live table on a
                         terminal, one line per event otherwise)
  experiment cancel EXP  cancel it and its running variants (--reason)
  experiment report EXP --svg=FILE [--svg_x=recipe|billed] [--svg_y=target|full]
                         the table, and validation loss against dollars for
                         every variant with the target, as an SVG (recipe
                         dollars and the region around the target by
                         default)
  experiment validate -f exp.yaml  check an experiment file locally

  token create --name=NAME --tenant=TENANT --role=ROLE
                         a fresh token (64 hex characters from 32 random
                         bytes) on the first line, and on the second the
                         entry that admits it in tallyd's token file; roles:
                         admin (no --tenant: every tenant), user and viewer
                         (--tenant required): --auth_tokens; worker (--name
                         is the worker id, no tenant): --worker_tokens
  token hash             the SHA-256 (hex) of a token read on stdin

Common flags: --output=json, --timeout=10s, and how to reach tallyd, each
taken from the first that is set: the flag, the environment variable, the
chosen context, the default:
  --controller=HOST:PORT   $TALLY_CONTROLLER  address          127.0.0.1:50051
                           (or HOST:PORT,HOST:PORT,...: a leader and its
                           standbys, tried in order while one answers
                           UNAVAILABLE)
  --ca_cert=PEM_FILE       $TALLY_CA_CERT     ca_cert          plaintext
                           (set: TLS, verifying tallyd against these roots)
  --tls_server_name=NAME                      tls_server_name  the host
  --token=TOKEN, --token_file=FILE
                           $TALLY_TOKEN       token_file       none
                           (sent as "authorization: Bearer TOKEN")
  --context=NAME           $TALLY_CONTEXT     (current_context)
  --config_file=FILE       $TALLY_CONFIG      (~/.config/tally/config.yaml)

The config file names contexts (a missing file is fine unless named):
  current_context: prod
  contexts:
    - name: prod
      address: tally.example.com:50051
      ca_cert: /etc/tally/ca.pem
      token_file: ~/.config/tally/prod.token
    - name: local
      address: 127.0.0.1:50051
Paths may start with ~ ($HOME); relative ones are beside the config file.

Exit codes: 0 ok; 1 error (a refused token or permission included); 2 bad
input (flags, a spec, the config file, a token or CA file); 3 not found;
4 wrong state; 5 tallyd unavailable (or the TLS handshake failed); 6 (watch)
the job ended FAILED, CANCELLED or BUDGET_EXHAUSTED (experiment watch: the
experiment ended CANCELLED or BUDGET_EXHAUSTED).
)";

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

// Text from tallyd (names, reasons, paths) as it may be shown on a terminal:
// records written before specs were validated may hold control characters.
std::string Safe(absl::string_view text) { return EscapeUnprintable(text); }

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

std::string StateName(tally::v1::JobState s) {
  absl::string_view name = tally::v1::JobState_Name(s);
  absl::ConsumePrefix(&name, "JOB_STATE_");
  return std::string(name);
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  if (auto s = google::protobuf::util::MessageToJsonString(m, &out, opts); !s.ok()) {
    std::cerr << "tallyctl: cannot print as JSON: " << Safe(s.ToString()) << "\n";
  }
  return out;
}

std::string Time(const google::protobuf::Timestamp& t) {
  return FormatTimestamp(t, absl::LocalTimeZone());
}

// "  tenant:    T   submitted by: A   cancelled by: B", the parts that are
// set; empty when none is (tallyd without authentication).
std::string OwnershipLine(absl::string_view tenant, absl::string_view by_label,
                          absl::string_view by, absl::string_view cancelled_by) {
  std::vector<std::string> parts;
  if (!tenant.empty()) parts.push_back(absl::StrCat("tenant:    ", Safe(tenant)));
  if (!by.empty()) parts.push_back(absl::StrCat(by_label, ": ", Safe(by)));
  if (!cancelled_by.empty()) parts.push_back(absl::StrCat("cancelled by: ", Safe(cancelled_by)));
  if (parts.empty()) return "";
  return absl::StrCat("  ", absl::StrJoin(parts, "   "), "\n");
}

// " by PRINCIPAL" for an event a caller's request made, else empty.
std::string ByPrincipal(absl::string_view principal) {
  return principal.empty() ? std::string() : absl::StrCat(" by ", Safe(principal));
}

std::string NormalizeName(const std::string& arg) {
  return absl::StartsWith(arg, "jobs/") ? arg : absl::StrCat("jobs/", arg);
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

// Whether a unary call may be sent again, to the next tallyd or after a
// wait: UNAVAILABLE (unreachable, draining, or a standby), or CANCELLED,
// which tallyctl never asks for on a unary call, so the tallyd serving it
// went away mid-call (a leader that lost its lease exits so). Submits carry
// a request id, so a retry makes no second job.
bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::CANCELLED;
}

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
  explicit Client(Connection conn) : conn_(std::move(conn)) {
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
  void Prepare(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_timeout)));
    Authorize(ctx);
  }
  // The bearer token, if there is one.
  void Authorize(grpc::ClientContext* ctx) const {
    if (!conn_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + conn_.token);
  }
  // `text` (e.g. an error from tallyd) with the token, should it appear,
  // blanked out: tallyctl never prints it.
  std::string Redact(absl::string_view text) const {
    if (conn_.token.empty()) return std::string(text);
    return absl::StrReplaceAll(text, {{conn_.token, "<token>"}});
  }
  tally::v1::Jobs::Stub* stub() { return endpoints_[current_].jobs.get(); }
  tally::v1::Experiments::Stub* experiments() { return endpoints_[current_].experiments.get(); }
  // The address of the tallyd that gave the last answer (a failure's).
  const std::string& controller() const { return endpoints_[answered_].address; }
  // Every address, for messages: "a:1" or "a:1, b:2".
  std::string Addresses() const {
    std::vector<std::string> all;
    for (const Endpoint& e : endpoints_) all.push_back(e.address);
    return absl::StrJoin(all, ", ");
  }
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

// Whether an UNAVAILABLE message is about TLS (a handshake or certificate
// that failed), not about reaching the address.
bool IsTlsFailure(absl::string_view message) {
  const std::string lower = absl::AsciiStrToLower(message);
  for (const char* word : {"ssl", "tls", "handshake", "certificate"}) {
    if (absl::StrContains(lower, word)) return true;
  }
  return false;
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

bool IsTerminalState(tally::v1::JobState s) {
  return s == tally::v1::JOB_STATE_SUCCEEDED || s == tally::v1::JOB_STATE_EARLY_STOPPED ||
         s == tally::v1::JOB_STATE_BUDGET_EXHAUSTED || s == tally::v1::JOB_STATE_CANCELLED ||
         s == tally::v1::JOB_STATE_FAILED;
}

void PrintJob(const tally::v1::Job& j) {
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << Json(j) << "\n";
    return;
  }
  const auto& spec = j.spec();
  std::cout << Safe(j.name()) << "  " << StateName(j.state());
  if (!j.state_reason().empty()) std::cout << "  (" << Safe(j.state_reason()) << ")";
  std::cout << "\n";
  if (!spec.display_name().empty()) {
    std::cout << "  name:      " << Safe(spec.display_name()) << "\n";
  }
  std::cout << "  model:     " << spec.model().num_layers() << " layers, d_model "
            << spec.model().d_model() << ", " << spec.model().num_heads() << " heads"
            << (spec.model().moe().num_experts() > 0
                    ? absl::StrCat(", MoE ", spec.model().moe().num_experts(), "x top-",
                                   spec.model().moe().top_k())
                    : "")
            << "\n";
  std::cout << ModelOriginLines(spec) << ResourcesLine(spec) << ProgressLine(j);
  if (j.worker_ids_size() > 0) {
    std::cout << "  workers:   " << Safe(absl::StrJoin(j.worker_ids(), ", ")) << "\n";
  }
  std::cout << OwnershipLine(j.tenant(), "submitted by", j.submitted_by(), j.cancelled_by());
  std::cout << "  created:   " << Time(j.create_time()) << "   started: "
            << Time(j.start_time()) << "   ended: " << Time(j.end_time()) << "\n";
  std::cout << absl::StrFormat("  cost:      $%.4f (%.1f GPU-seconds at $%.4f/GPU-hour)",
                               j.cost().cost_usd(), j.cost().gpu_seconds(),
                               j.cost().usd_per_gpu_hour());
  if (j.cost().lost_usd() > 0) {
    std::cout << absl::StrFormat(", $%.4f lost to failures", j.cost().lost_usd());
  }
  if (spec.budget().max_dollars() > 0) {
    std::cout << absl::StrFormat(", budget $%.4f", spec.budget().max_dollars());
  }
  std::cout << "\n" << SpotUsageLine(j) << PreemptionLines(j, absl::LocalTimeZone());
  const auto& es = j.early_stopping();
  if (es.has_best()) {
    std::cout << absl::StrFormat("  val loss:  latest %.4f, best %.4f at step %d", j.val_loss(),
                                 es.best_val_loss(), es.best_step());
    if (spec.early_stopping().patience() > 0) {
      std::cout << absl::StrFormat(", patience left %d of %d", es.patience_left(),
                                   spec.early_stopping().patience());
    }
    std::cout << "\n";
  }
  if (!es.best_checkpoint().empty()) {
    std::cout << "  best checkpoint: " << Safe(es.best_checkpoint()) << "\n";
  }
  if (j.target_val_loss() > 0) {
    std::cout << absl::StrFormat("  target:    val loss %.4f", j.target_val_loss());
    if (j.has_target_reached()) {
      const auto& t = j.target_reached();
      std::cout << absl::StrFormat(
          ", reached at step %d (val %.4f, $%.4f); to the target itself $%.4f, %.0f tokens, "
          "%.1f GPU-seconds",
          t.step(), t.val_loss(), t.cost_usd(), t.cost_to_target_usd(), t.tokens_to_target(),
          t.gpu_seconds_to_target());
    } else {
      std::cout << ", not reached";
    }
    std::cout << "\n";
  }
  if (j.forecast().valid()) {
    const auto& f = j.forecast();
    std::cout << absl::StrFormat(
        "  forecast:  val loss %.4f (%.4f-%.4f) at step %d, from %d evals up to step %d\n",
        f.final_val_loss(), f.low(), f.high(), spec.training().max_steps(), f.evals_used(),
        f.step());
  } else if (!j.forecast().reason().empty() && !IsTerminalState(j.state())) {
    std::cout << "  forecast:  none yet (" << Safe(j.forecast().reason()) << ")\n";
  }
  if (j.has_pending_stop()) {
    std::cout << "  stopping:  " << Safe(j.pending_stop().reason())
              << " (waiting for the workers' final checkpoint)\n";
  }
}

// Reads -f (a file, or - for stdin) into `spec` and checks it with
// PrepareJobSpec, the check tallyd makes; kOk or the exit code. `spec` is the
// spec as written, without defaults: tallyd applies its own. `prepared`, when
// given, receives it with defaults applied.
int ReadSpecFlag(const char* cmd, tally::v1::JobSpec* spec,
                 tally::v1::JobSpec* prepared = nullptr) {
  const std::string file = absl::GetFlag(FLAGS_file);
  if (file.empty()) {
    std::cerr << "tallyctl " << cmd << ": -f job.yaml is required\n";
    return kUsage;
  }
  absl::StatusOr<tally::v1::JobSpec> parsed =
      file == "-" ? ReadJobSpecStream(std::cin, "<stdin>") : ReadJobSpecFile(file);
  if (!parsed.ok()) {
    std::cerr << "tallyctl: " << parsed.status().message() << "\n";
    return parsed.status().code() == absl::StatusCode::kNotFound ? kNotFound : kUsage;
  }
  tally::v1::JobSpec checked = *parsed;
  if (absl::Status s = PrepareJobSpec(&checked); !s.ok()) {
    std::cerr << "tallyctl: " << (file == "-" ? "<stdin>" : Safe(file)) << ": "
              << s.message() << "\n";
    return kUsage;
  }
  *spec = *std::move(parsed);
  if (prepared != nullptr) *prepared = std::move(checked);
  return kOk;
}

// --request_id, or a fresh random key (reused for this command's own
// retries, so a call whose answer was lost makes nothing twice).
std::string RequestId() {
  std::string request_id = absl::GetFlag(FLAGS_request_id);
  if (request_id.empty()) {
    std::mt19937_64 rng(std::random_device{}());
    request_id = absl::StrFormat("tallyctl-%016x%016x", rng(), rng());
  }
  return request_id;
}

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

// One message as one line of JSON (watch --output=json).
std::string JsonLine(const google::protobuf::Message& m) {
  std::string line;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &line, opts);
  return line;
}

int Watch(Client& c, const std::string& name);

int Submit(Client& c) {
  tally::v1::SubmitJobRequest req;
  if (int rc = ReadSpecFlag("submit", req.mutable_spec()); rc != kOk) return rc;
  req.set_request_id(RequestId());
  tally::v1::Job job;
  // Retries reuse the request id, so a submit whose answer was lost makes
  // no second job.
  grpc::Status s = WithRetries(
      c, [&](grpc::ClientContext* ctx) { return c.stub()->SubmitJob(ctx, req, &job); });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << Json(job) << "\n";
  } else {
    std::cout << Safe(job.name()) << "\n";
  }
  return kOk;
}

int Estimate(Client& c) {
  tally::v1::EstimateCostRequest req;
  if (int rc = ReadSpecFlag("estimate", req.mutable_spec()); rc != kOk) return rc;
  tally::v1::CostEstimate e;
  grpc::Status s = c.Call(
      [&](grpc::ClientContext* ctx) { return c.stub()->EstimateCost(ctx, req, &e); });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << Json(e) << "\n";
  } else {
    std::cout << EstimateText(e);
  }
  return kOk;
}

int Checkpoints(Client& c, const std::string& name);

int Cost(Client& c, const std::string& name) {
  tally::v1::GetJobRequest req;
  req.set_name(NormalizeName(name));
  tally::v1::Job j;
  grpc::Status s = c.Call([&](grpc::ClientContext* ctx) { return c.stub()->GetJob(ctx, req, &j); });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << Json(j.cost()) << "\n";
    return kOk;
  }
  const auto& cost = j.cost();
  std::cout << Safe(j.name()) << "  " << StateName(j.state()) << "  "
            << j.spec().resources().gpu_count() << " x " << Safe(j.spec().resources().gpu_type())
            << absl::StrFormat(" at $%.4f/GPU-hour\n", cost.usd_per_gpu_hour());
  std::cout << "  estimate:  " << EstimateText(cost.estimate(), "  ");
  std::cout << absl::StrFormat("  actual:    $%.4f: %.1f GPU-seconds, %d tokens", cost.cost_usd(),
                               cost.gpu_seconds(), j.tokens());
  if (cost.estimate().cost_usd() > 0 && j.has_end_time()) {
    std::cout << absl::StrFormat(" (%.2fx the estimate)",
                                 cost.cost_usd() / cost.estimate().cost_usd());
  }
  std::cout << absl::StrFormat("\n  lost to failures: $%.4f\n", cost.lost_usd())
            << RedoneLine(j) << SpotUsageLine(j);
  if (j.spec().budget().max_dollars() > 0) {
    std::cout << absl::StrFormat("  budget:    $%.4f (%.0f%% used)\n",
                                 j.spec().budget().max_dollars(),
                                 100 * cost.cost_usd() / j.spec().budget().max_dollars());
  }
  std::cout << "\n";
  return Checkpoints(c, name);
}

int Get(Client& c, const std::string& name) {
  tally::v1::GetJobRequest req;
  req.set_name(NormalizeName(name));
  tally::v1::Job job;
  grpc::Status s = c.Call(
      [&](grpc::ClientContext* ctx) { return c.stub()->GetJob(ctx, req, &job); });
  if (!s.ok()) return Fail(s, c);
  PrintJob(job);
  return kOk;
}

int List(Client& c) {
  tally::v1::ListJobsRequest req;
  req.set_page_size(absl::GetFlag(FLAGS_page_size));
  req.set_page_token(absl::GetFlag(FLAGS_page_token));
  req.set_tenant(absl::GetFlag(FLAGS_tenant));
  for (absl::string_view s :
       absl::StrSplit(absl::GetFlag(FLAGS_state), ',', absl::SkipEmpty())) {
    tally::v1::JobState state;
    std::string full = absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(s));
    if (!tally::v1::JobState_Parse(full, &state) ||
        state == tally::v1::JOB_STATE_UNSPECIFIED) {
      std::cerr << "tallyctl list: --state: unknown state \"" << s
                << "\"; use queued, running, succeeded, early_stopped, "
                   "budget_exhausted, cancelled, failed\n";
      return kUsage;
    }
    req.add_states(state);
  }
  tally::v1::ListJobsResponse resp;
  grpc::Status s = c.Call(
      [&](grpc::ClientContext* ctx) { return c.stub()->ListJobs(ctx, req, &resp); });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << Json(resp) << "\n";
    return kOk;
  }
  std::cout << absl::StrFormat("%-12s %-17s %-8s %-12s %s\n", "JOB", "STATE", "ATTEMPT",
                               "STEP", "NAME");
  for (const auto& j : resp.jobs()) {
    std::cout << absl::StrFormat(
        "%-12s %-17s %-8s %-12s %s\n", Safe(j.name()), StateName(j.state()),
        absl::StrCat(j.attempt(), "/", j.spec().max_attempts()),
        absl::StrCat(j.step(), "/", j.spec().training().max_steps()),
        Safe(j.spec().display_name()));
  }
  if (!resp.next_page_token().empty()) {
    std::cout << "more: --page_token=" << Safe(resp.next_page_token()) << "\n";
  }
  return kOk;
}

int Cancel(Client& c, const std::string& name) {
  tally::v1::CancelJobRequest req;
  req.set_name(NormalizeName(name));
  req.set_reason(absl::GetFlag(FLAGS_reason));
  tally::v1::Job job;
  int sent = 0;
  grpc::Status first;
  grpc::Status s = c.Call([&](grpc::ClientContext* ctx) {
    grpc::Status r = c.stub()->CancelJob(ctx, req, &job);
    if (sent++ == 0) first = r;
    return r;
  });
  if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION && sent > 1 &&
      first.error_code() == grpc::StatusCode::CANCELLED) {
    // The first tallyd went away mid-call (a leader losing its lease), so it
    // may have committed this cancel before it did: a job now CANCELLED is
    // this cancel's doing, not an error.
    tally::v1::GetJobRequest get;
    get.set_name(req.name());
    tally::v1::Job now;
    grpc::Status g =
        c.Call([&](grpc::ClientContext* ctx) { return c.stub()->GetJob(ctx, get, &now); });
    if (g.ok() && now.state() == tally::v1::JOB_STATE_CANCELLED) {
      PrintJob(now);
      return kOk;
    }
  }
  if (!s.ok()) return Fail(s, c);
  PrintJob(job);
  return kOk;
}

int Checkpoints(Client& c, const std::string& name) {
  tally::v1::ListCheckpointsRequest req;
  req.set_name(NormalizeName(name));
  tally::v1::ListCheckpointsResponse resp;
  grpc::Status s = c.Call(
      [&](grpc::ClientContext* ctx) { return c.stub()->ListCheckpoints(ctx, req, &resp); });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << Json(resp) << "\n";
    return kOk;
  }
  // Checkpoints a worker found damaged (the job lists them): marked, and
  // never the best. Without the job (an older tallyd) none are known.
  std::map<std::string, std::string> damaged;
  {
    tally::v1::GetJobRequest get;
    get.set_name(NormalizeName(name));
    tally::v1::Job job;
    if (c.Call([&](grpc::ClientContext* ctx) { return c.stub()->GetJob(ctx, get, &job); })
            .ok()) {
      for (const auto& d : job.damaged_checkpoints()) damaged[d.path()] = d.reason();
    }
  }
  // The best: the lowest validation loss (0: not evaluated); with none
  // evaluated, the latest.
  int best = -1;
  for (int i = 0; i < resp.checkpoints_size(); ++i) {
    const auto& ck = resp.checkpoints(i);
    if (damaged.count(ck.path())) continue;
    if (ck.val_loss() != 0 && (best < 0 || resp.checkpoints(best).val_loss() == 0 ||
                               ck.val_loss() < resp.checkpoints(best).val_loss())) {
      best = i;
    } else if (best < 0 || (resp.checkpoints(best).val_loss() == 0 && ck.val_loss() == 0 &&
                            ck.step() >= resp.checkpoints(best).step())) {
      best = i;
    }
  }
  std::cout << absl::StrFormat("%-5s %-7s %-8s %-10s %-9s %-10s %-10s %-12s %s\n", "BEST",
                               "ATTEMPT", "STEP", "TOKENS", "VAL_LOSS", "COST_USD", "SINCE_USD",
                               "USD_PER_GAIN", "PATH");
  for (int i = 0; i < resp.checkpoints_size(); ++i) {
    const auto& ck = resp.checkpoints(i);
    // 0 means no evaluation at the checkpoint's step, or no gain.
    const std::string val =
        ck.val_loss() != 0 ? absl::StrFormat("%.4f", ck.val_loss()) : std::string("-");
    const std::string per_gain = ck.usd_per_val_loss_improvement() != 0
                                     ? absl::StrFormat("%.6f", ck.usd_per_val_loss_improvement())
                                     : std::string("-");
    const bool bad = damaged.count(ck.path()) > 0;
    std::cout << absl::StrFormat("%-5s %-7d %-8d %-10d %-9s %-10.6f %-10.6f %-12s %s%s\n",
                                 i == best ? "*" : (bad ? "bad" : ""), ck.attempt(), ck.step(),
                                 ck.tokens(), val, ck.cost_usd(), ck.cost_since_previous_usd(),
                                 per_gain, Safe(ck.path()),
                                 bad ? "  (damaged: " + Safe(damaged[ck.path()]) + ")" : "");
  }
  if (best >= 0) {
    const auto& b = resp.checkpoints(best);
    const std::string job = NormalizeName(name);
    std::cout << "\nbest: step " << b.step()
              << (b.val_loss() != 0 ? absl::StrFormat(" (val loss %.4f)", b.val_loss())
                                    : std::string(" (latest; none evaluated)"))
              << ", $" << absl::StrFormat("%.6f", b.cost_usd()) << "\n"
              << "export it as a Hugging Face model:\n  tally-export --job=" << Safe(job)
              << " --which=best --out=DIR\n  (or tally-export --checkpoint=" << Safe(b.path())
              << " --out=DIR)\n";
  } else {
    std::cout << "no checkpoints yet\n";
  }
  return kOk;
}

// A watch rides through tallyd restarting or briefly unreachable.
// UNAVAILABLE: tallyd draining or unreachable. CANCELLED we did not ask for:
// a call that reached a tallyd mid-shutdown. Both are worth a retry, for a
// while: 20 tries take about a minute and a half, 5 about six seconds.
struct Retry {
  int limit = 20;
  absl::Duration backoff = absl::Milliseconds(200);
  int failures = 0;

  bool Again(const grpc::Status& s) {
    const bool retryable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           s.error_code() == grpc::StatusCode::CANCELLED;
    return retryable && ++failures <= limit;
  }
  void Wait() {
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  void Reset() { failures = 0, backoff = absl::Milliseconds(200); }
};

// A watch's connection as the user hears of it: once when the stream to
// tallyd is lost, however many attempts the reconnection takes, and once
// when a stream is back (tallyd's "tally-watch-established" initial
// metadata, or an event).
class WatchConnection {
 public:
  void Lost(const std::string& why, int64_t after) {
    if (lost_) return;
    lost_ = true;
    std::cerr << "tallyctl: lost the watch stream (" << why << "); reconnecting, to resume "
              << "after event " << after << "\n";
  }
  // After each new stream's initial metadata (or its first event): true
  // when tallyd accepted the watch.
  bool Check(const grpc::ClientContext& ctx, bool got_event, int64_t after) {
    const auto& md = ctx.GetServerInitialMetadata();
    const bool established = got_event || md.find(kWatchEstablishedKey) != md.end();
    if (established && lost_) {
      lost_ = false;
      std::cerr << "tallyctl: reconnected; resuming after event " << after << "\n";
    }
    return established;
  }

 private:
  bool lost_ = false;
};

int Watch(Client& c, const std::string& arg) {
  const std::string name = NormalizeName(arg);
  const bool tty = isatty(STDOUT_FILENO) && absl::GetFlag(FLAGS_output) != "json";
  // A mistyped --controller fails in seconds; a watch under way waits longer.
  Retry retry{.limit = 5};
  int64_t max_steps = 0;
  tally::v1::Job job;
  while (true) {
    tally::v1::GetJobRequest req;
    req.set_name(name);
    grpc::Status s = c.Call(
        [&](grpc::ClientContext* ctx) { return c.stub()->GetJob(ctx, req, &job); });
    if (s.ok()) {
      max_steps = job.spec().training().max_steps();
      break;
    }
    if (!retry.Again(s)) return Fail(s, c);
    if (retry.failures == 1) {
      std::cerr << "tallyctl: waiting for tallyd at " << Safe(c.Addresses()) << " ("
                << Safe(c.Redact(s.error_message())) << ")\n";
    }
    retry.Wait();
  }
  retry = Retry();
  int64_t after = absl::GetFlag(FLAGS_after);
  PreemptionTally preemptions(job.preemption().count(), job.last_event_sequence(), after);
  tally::v1::JobState last_state = tally::v1::JOB_STATE_UNSPECIFIED;
  bool bar_shown = false;
  WatchConnection connection;
  while (true) {
    tally::v1::WatchJobRequest req;
    req.set_name(name);
    req.set_after_sequence(after);
    grpc::ClientContext ctx;
    c.Authorize(&ctx);
    auto reader = c.stub()->WatchJob(&ctx, req);
    reader->WaitForInitialMetadata();
    if (connection.Check(ctx, false, after)) retry.Reset();  // an idle watch is no failure
    tally::v1::JobEvent e;
    while (reader->Read(&e)) {
      connection.Check(ctx, true, after);
      retry.Reset();
      after = e.sequence();
      last_state = e.state();
      preemptions.Observe(e);
      if (absl::GetFlag(FLAGS_output) == "json") {
        std::cout << JsonLine(e) << std::endl;
        continue;
      }
      if (tty && e.type() == "progress") {
        std::cout << "\r" << ProgressBar(e, max_steps, preemptions.count()) << "   "
                  << std::flush;
        bar_shown = true;
        continue;
      }
      if (bar_shown) std::cout << "\n";
      bar_shown = false;
      std::cout << EventLine(e, absl::LocalTimeZone(), preemptions.count()) << std::endl;
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) break;
    if (bar_shown) std::cout << "\n";
    bar_shown = false;
    if (!retry.Again(s)) return Fail(s, c);
    // tallyd restarting or unreachable: resume after the last event seen,
    // at the next address when there are several.
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) c.Next();
    connection.Lost(Safe(c.Redact(s.error_message())), after);
    retry.Wait();
  }
  if (bar_shown) std::cout << "\n";
  switch (last_state) {
    case tally::v1::JOB_STATE_SUCCEEDED:
    case tally::v1::JOB_STATE_EARLY_STOPPED:
      return kOk;
    default:
      return kJobUnsuccessful;
  }
}

// The same reading and checks as submit (ReadSpecFlag), without the call.
int Validate() {
  tally::v1::JobSpec spec, prepared;
  if (int rc = ReadSpecFlag("validate", &spec, &prepared); rc != kOk) return rc;
  const std::string file = absl::GetFlag(FLAGS_file);
  std::cout << (file == "-" ? "<stdin>" : Safe(file)) << ": ok\n";
  if (absl::GetFlag(FLAGS_output) == "json") std::cout << Json(prepared) << "\n";
  return kOk;
}

// --- Experiments.

std::string ExperimentStateName(tally::v1::ExperimentState s) {
  absl::string_view name = tally::v1::ExperimentState_Name(s);
  absl::ConsumePrefix(&name, "EXPERIMENT_STATE_");
  return std::string(name);
}

std::string NormalizeExperimentName(const std::string& arg) {
  return absl::StartsWith(arg, "experiments/") ? arg : absl::StrCat("experiments/", arg);
}

// Every field, zeros and false included: outside tools read the figures by
// name and should find each one.
std::string JsonAll(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.add_whitespace = true;
  opts.preserve_proto_field_names = true;
  opts.always_print_primitive_fields = true;
  if (auto s = google::protobuf::util::MessageToJsonString(m, &out, opts); !s.ok()) {
    std::cerr << "tallyctl: cannot print as JSON: " << Safe(s.ToString()) << "\n";
  }
  return out;
}

// Reads -f into an experiment spec and checks it as tallyd will.
int ReadExperimentFlag(const char* cmd, tally::v1::ExperimentSpec* spec) {
  const std::string file = absl::GetFlag(FLAGS_file);
  if (file.empty()) {
    std::cerr << "tallyctl experiment " << cmd << ": -f experiment.yaml is required\n";
    return kUsage;
  }
  std::string text;
  const std::string source = file == "-" ? "<stdin>" : Safe(file);
  {
    std::ifstream f;
    std::istream* in = &std::cin;
    if (file != "-") {
      f.open(file, std::ios::binary);
      if (!f) {
        std::cerr << "tallyctl: cannot read " << source << "\n";
        return kNotFound;
      }
      in = &f;
    }
    text.resize(kMaxSpecBytes + 1);
    in->read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in->gcount()));
  }
  absl::StatusOr<tally::v1::ExperimentSpec> parsed = ParseExperimentYaml(text, source);
  if (!parsed.ok()) {
    std::cerr << "tallyctl: " << parsed.status().message() << "\n";
    return kUsage;
  }
  tally::v1::ExperimentSpec checked = *parsed;
  ApplyExperimentDefaults(&checked);
  if (absl::Status s = ValidateExperimentSpec(checked); !s.ok()) {
    std::cerr << "tallyctl: " << source << ": " << s.message() << "\n";
    return kUsage;
  }
  *spec = *std::move(parsed);
  return kOk;
}


std::string Loss(double l) { return l > 0 ? absl::StrFormat("%.4f", l) : std::string("-"); }

void PrintExperiment(const tally::v1::Experiment& e) {
  std::cout << Safe(e.name()) << "  " << ExperimentStateName(e.state());
  if (!e.state_reason().empty()) std::cout << "  (" << Safe(e.state_reason()) << ")";
  std::cout << "\n";
  if (!e.spec().display_name().empty()) {
    std::cout << "  name:      " << Safe(e.spec().display_name()) << "\n";
  }
  std::cout << "  target:    ";
  if (e.target_val_loss() > 0) {
    std::cout << absl::StrFormat("val loss %.4f", e.target_val_loss());
    if (e.spec().target().has_from_variant()) {
      std::cout << " (the final loss of " << Safe(e.spec().target().from_variant()) << ")";
    }
  } else if (e.spec().target().has_from_variant()) {
    std::cout << "the final loss of " << Safe(e.spec().target().from_variant())
              << ", once it has ended";
  } else {
    std::cout << "none";
  }
  std::cout << "\n";
  std::cout << "  strategy:  "
            << (e.spec().strategy() == tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING
                    ? absl::StrCat("successive halving, rung ", e.rung())
                    : std::string("all"))
            << "\n";
  std::cout << "  spent:     " << FormatDollars(e.cost_usd());
  if (e.spec().budget().max_dollars() > 0) {
    std::cout << " of a " << FormatDollars(e.spec().budget().max_dollars()) << " budget";
  }
  std::cout << "\n"
            << OwnershipLine(e.tenant(), "created by", e.created_by(), e.cancelled_by());
  std::cout << "  created:   " << Time(e.create_time()) << "   ended: " << Time(e.end_time())
            << "\n";
  std::cout << VariantTable(e);
}

int GetExperiment(Client& c, const std::string& arg, tally::v1::Experiment* out) {
  tally::v1::GetExperimentRequest req;
  req.set_name(NormalizeExperimentName(arg));
  grpc::Status s = c.Call(
      [&](grpc::ClientContext* ctx) { return c.experiments()->GetExperiment(ctx, req, out); });
  return s.ok() ? kOk : Fail(s, c);
}

int ExperimentCreate(Client& c) {
  tally::v1::CreateExperimentRequest req;
  if (int rc = ReadExperimentFlag("create", req.mutable_spec()); rc != kOk) return rc;
  req.set_request_id(RequestId());
  tally::v1::Experiment e;
  grpc::Status s = WithRetries(c, [&](grpc::ClientContext* ctx) {
    return c.experiments()->CreateExperiment(ctx, req, &e);
  });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << JsonAll(e) << "\n";
  } else {
    std::cout << Safe(e.name()) << "\n";
  }
  return kOk;
}

int ExperimentValidate() {
  tally::v1::ExperimentSpec spec;
  if (int rc = ReadExperimentFlag("validate", &spec); rc != kOk) return rc;
  const std::string file = absl::GetFlag(FLAGS_file);
  std::cout << (file == "-" ? "<stdin>" : Safe(file)) << ": ok, " << spec.variants_size()
            << " variants\n";
  return kOk;
}

int ExperimentGet(Client& c, const std::string& arg) {
  tally::v1::Experiment e;
  if (int rc = GetExperiment(c, arg, &e); rc != kOk) return rc;
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << JsonAll(e) << "\n";
  } else {
    PrintExperiment(e);
  }
  return kOk;
}

int ExperimentList(Client& c) {
  tally::v1::ListExperimentsRequest req;
  req.set_page_size(absl::GetFlag(FLAGS_page_size));
  req.set_page_token(absl::GetFlag(FLAGS_page_token));
  req.set_tenant(absl::GetFlag(FLAGS_tenant));
  tally::v1::ListExperimentsResponse resp;
  grpc::Status s = c.Call(
      [&](grpc::ClientContext* ctx) { return c.experiments()->ListExperiments(ctx, req, &resp); });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << JsonAll(resp) << "\n";
    return kOk;
  }
  std::cout << absl::StrFormat("%-16s %-17s %-9s %-10s %-9s %s\n", "EXPERIMENT", "STATE",
                               "VARIANTS", "SPENT", "TARGET", "NAME");
  for (const auto& e : resp.experiments()) {
    std::cout << absl::StrFormat("%-16s %-17s %-9d %-10s %-9s %s\n", Safe(e.name()),
                                 ExperimentStateName(e.state()), e.variants_size(),
                                 FormatDollars(e.cost_usd()), Loss(e.target_val_loss()),
                                 Safe(e.spec().display_name()));
  }
  if (!resp.next_page_token().empty()) {
    std::cout << "more: --page_token=" << Safe(resp.next_page_token()) << "\n";
  }
  return kOk;
}

int ExperimentCancel(Client& c, const std::string& arg) {
  tally::v1::CancelExperimentRequest req;
  req.set_name(NormalizeExperimentName(arg));
  req.set_reason(absl::GetFlag(FLAGS_reason));
  tally::v1::Experiment e;
  grpc::Status s = c.Call(
      [&](grpc::ClientContext* ctx) { return c.experiments()->CancelExperiment(ctx, req, &e); });
  if (!s.ok()) return Fail(s, c);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << JsonAll(e) << "\n";
  } else {
    PrintExperiment(e);
  }
  return kOk;
}

int ExperimentExit(tally::v1::ExperimentState s) {
  return s == tally::v1::EXPERIMENT_STATE_SUCCEEDED ? kOk : kJobUnsuccessful;
}

// On a terminal: the table redrawn every second until the experiment ends.
// Otherwise: one line per event (JSON lines with --output=json), then the
// final table.
int ExperimentWatch(Client& c, const std::string& arg) {
  const std::string name = NormalizeExperimentName(arg);
  const bool json = absl::GetFlag(FLAGS_output) == "json";
  const bool tty = isatty(STDOUT_FILENO) && !json;
  tally::v1::Experiment e;
  Retry retry{.limit = 5};
  auto get = [&]() -> grpc::Status {
    tally::v1::GetExperimentRequest req;
    req.set_name(name);
    return c.Call(
        [&](grpc::ClientContext* ctx) { return c.experiments()->GetExperiment(ctx, req, &e); });
  };
  // Gets `e` until it answers or `retry` gives up; kOk or the exit code.
  auto get_retrying = [&]() -> int {
    while (true) {
      grpc::Status s = get();
      if (s.ok()) return kOk;
      if (!retry.Again(s)) return Fail(s, c);
      retry.Wait();
    }
  };
  if (int rc = get_retrying(); rc != kOk) return rc;
  if (tty) {
    retry = Retry();
    int drawn = 0;
    while (true) {
      std::ostringstream frame;
      std::streambuf* old = std::cout.rdbuf(frame.rdbuf());
      PrintExperiment(e);
      std::cout.rdbuf(old);
      const std::string text = frame.str();
      if (drawn > 0) std::cout << "\x1b[" << drawn << "F\x1b[J";
      std::cout << text << std::flush;
      drawn = static_cast<int>(std::count(text.begin(), text.end(), '\n'));
      if (e.state() != tally::v1::EXPERIMENT_STATE_RUNNING) break;
      absl::SleepFor(absl::Seconds(1));
      grpc::Status s = get();
      if (!s.ok()) {
        if (!retry.Again(s)) return Fail(s, c);
        retry.Wait();
      } else {
        retry.Reset();
      }
    }
    return ExperimentExit(e.state());
  }
  retry = Retry();
  int64_t after = absl::GetFlag(FLAGS_after);
  WatchConnection connection;
  while (true) {
    tally::v1::WatchExperimentRequest req;
    req.set_name(name);
    req.set_after_sequence(after);
    grpc::ClientContext ctx;
    c.Authorize(&ctx);
    auto reader = c.experiments()->WatchExperiment(&ctx, req);
    reader->WaitForInitialMetadata();
    if (connection.Check(ctx, false, after)) retry.Reset();  // an idle watch is no failure
    tally::v1::ExperimentEvent ev;
    while (reader->Read(&ev)) {
      connection.Check(ctx, true, after);
      retry.Reset();
      after = ev.sequence();
      if (json) {
        std::cout << JsonLine(ev) << std::endl;
        continue;
      }
      std::string line = absl::StrFormat("#%-4d %s %-17s %-10s", ev.sequence(), Time(ev.time()),
                                         Safe(ev.type()), ExperimentStateName(ev.state()));
      absl::StrAppend(&line, ByPrincipal(ev.principal()));
      if (!ev.reason().empty()) absl::StrAppend(&line, " ", Safe(ev.reason()));
      if (!ev.detail().empty()) absl::StrAppend(&line, " (", Safe(ev.detail()), ")");
      std::cout << line << std::endl;
    }
    grpc::Status s = reader->Finish();
    if (s.ok()) break;
    if (!retry.Again(s)) return Fail(s, c);
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE) c.Next();
    connection.Lost(Safe(c.Redact(s.error_message())), after);
    retry.Wait();
  }
  retry = Retry();
  if (int rc = get_retrying(); rc != kOk) return rc;
  if (!json) {
    std::cout << "\n";
    PrintExperiment(e);
  }
  return ExperimentExit(e.state());
}

int ExperimentReport(Client& c, const std::string& arg) {
  ReportOptions options;
  const std::string x = absl::GetFlag(FLAGS_svg_x), y = absl::GetFlag(FLAGS_svg_y);
  if (x != "recipe" && x != "billed") {
    std::cerr << "tallyctl: --svg_x: must be recipe or billed, got \"" << Safe(x) << "\"\n";
    return kUsage;
  }
  if (y != "target" && y != "full") {
    std::cerr << "tallyctl: --svg_y: must be target or full, got \"" << Safe(y) << "\"\n";
    return kUsage;
  }
  options.billed = x == "billed";
  options.zoom = y == "target";
  tally::v1::Experiment e;
  if (int rc = GetExperiment(c, arg, &e); rc != kOk) return rc;
  const std::string svg = absl::GetFlag(FLAGS_svg);
  std::vector<VariantCurve> curves;
  for (const auto& v : e.variants()) {
    if (v.job().empty()) continue;
    tally::v1::GetJobRequest req;
    req.set_name(v.job());
    tally::v1::Job job;
    grpc::Status s = c.Call(
        [&](grpc::ClientContext* ctx) { return c.stub()->GetJob(ctx, req, &job); });
    if (!s.ok()) return Fail(s, c);
    curves.push_back({v.name(), {job.curve().begin(), job.curve().end()}});
  }
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << JsonAll(e) << "\n";
  } else {
    PrintExperiment(e);
  }
  if (svg.empty()) return kOk;
  const std::string image = RenderExperimentSvg(e, curves, options);
  std::ofstream out(svg, std::ios::binary | std::ios::trunc);
  out << image;
  out.close();
  if (!out) {
    std::cerr << "tallyctl: cannot write " << Safe(svg) << "\n";
    return kError;
  }
  if (absl::GetFlag(FLAGS_output) != "json") {
    std::cout << "\nvalidation loss against dollars: " << Safe(svg) << "\n";
  }
  return kOk;
}

int Experiment(Client& c, const std::vector<char*>& args) {
  const std::string sub = args.size() > 2 ? args[2] : "";
  auto need = [&](const char* what) -> bool {
    if (args.size() != 4) {
      std::cerr << "tallyctl experiment " << what
                << ": expected one EXPERIMENT argument (experiments/ID or ID)\n";
      return false;
    }
    return true;
  };
  if (sub == "create") return ExperimentCreate(c);
  if (sub == "list") return ExperimentList(c);
  if (sub == "get") return need("get") ? ExperimentGet(c, args[3]) : kUsage;
  if (sub == "watch") return need("watch") ? ExperimentWatch(c, args[3]) : kUsage;
  if (sub == "cancel") return need("cancel") ? ExperimentCancel(c, args[3]) : kUsage;
  if (sub == "report") return need("report") ? ExperimentReport(c, args[3]) : kUsage;
  std::cerr << "tallyctl experiment: unknown or missing subcommand \"" << Safe(sub)
            << "\"; use create, get, list, watch, cancel, report or validate\n";
  return kUsage;
}

// --- Tokens: local, no call to tallyd.

// A fresh token and the entry of tallyd's token file that admits it.
int TokenCreate() {
  TokenEntry entry{.name = absl::GetFlag(FLAGS_name),
                   .tenant = absl::GetFlag(FLAGS_tenant),
                   .role = absl::GetFlag(FLAGS_role)};
  if (absl::Status s = ValidateTokenEntry(entry); !s.ok()) {
    std::cerr << "tallyctl token create: " << s.message() << "\n";
    return kUsage;
  }
  absl::StatusOr<std::string> token = NewToken();
  if (!token.ok()) {
    std::cerr << "tallyctl token create: " << token.status().message() << "\n";
    return kError;
  }
  entry.token_sha256 = TokenSha256Hex(*token);
  if (absl::GetFlag(FLAGS_output) == "json") {
    // Every value is a checked plain word or hex: nothing to escape.
    std::cout << "{\n  \"token\": \"" << *token << "\",\n  \"entry\": {\n    \"name\": \""
              << entry.name << "\",\n    \"tenant\": \"" << entry.tenant
              << "\",\n    \"role\": \"" << entry.role << "\",\n    \"token_sha256\": \""
              << entry.token_sha256 << "\"\n  }\n}\n";
  } else {
    std::cout << *token << "\n" << TokenEntryYaml(entry) << "\n";
  }
  return kOk;
}

// The SHA-256 of the token on stdin (surrounding whitespace ignored), as
// tallyd's token file holds it.
int TokenHash() {
  std::string text(kMaxTokenBytes + 65, '\0');
  std::cin.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(std::cin.gcount()));
  const std::string token(absl::StripAsciiWhitespace(text));
  if (absl::Status s = CheckToken(token, "stdin"); !s.ok()) {
    std::cerr << "tallyctl token hash: " << s.message() << "\n";
    return kUsage;
  }
  const std::string sha = TokenSha256Hex(token);
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << "{\n  \"token_sha256\": \"" << sha << "\"\n}\n";
  } else {
    std::cout << sha << "\n";
  }
  return kOk;
}

int Token(const std::vector<char*>& args) {
  const std::string sub = args.size() > 2 ? args[2] : "";
  if (args.size() > 3) {
    std::cerr << "tallyctl token " << Safe(sub)
              << ": takes no arguments (flags: --name, --tenant, --role)\n";
    return kUsage;
  }
  if (sub == "create") return TokenCreate();
  if (sub == "hash") return TokenHash();
  std::cerr << "tallyctl token: unknown or missing subcommand \"" << Safe(sub)
            << "\"; use create or hash\n";
  return kUsage;
}

// The connection from the flags, the environment and the config file; an
// error is printed and gives kUsage.
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

int Main(std::vector<char*> args) {
  if (args.size() < 2) {
    std::cerr << kUsageText;
    return kUsage;
  }
  const std::string output = absl::GetFlag(FLAGS_output);
  if (output != "text" && output != "json") {
    std::cerr << "tallyctl: --output must be text or json, got \"" << output << "\"\n";
    return kUsage;
  }
  const std::string cmd = args[1];
  auto need_job = [&](const char* what) -> bool {
    if (args.size() != 3) {
      std::cerr << "tallyctl " << what << ": expected one JOB argument (jobs/ID or ID)\n";
      return false;
    }
    return true;
  };
  if (cmd == "validate") return Validate();
  if (cmd == "experiment" && args.size() > 2 && std::string(args[2]) == "validate") {
    return ExperimentValidate();
  }
  if (cmd == "token") return Token(args);
  if (cmd == "help") {
    std::cout << kUsageText;
    return kOk;
  }
  static constexpr const char* kCommands[] = {"experiment", "submit",      "list",
                                              "get",        "watch",       "cancel",
                                              "checkpoints", "cost",       "estimate"};
  if (std::find(std::begin(kCommands), std::end(kCommands), cmd) == std::end(kCommands)) {
    std::cerr << "tallyctl: unknown command \"" << Safe(cmd) << "\"\n\n" << kUsageText;
    return kUsage;
  }
  Connection conn;
  if (int rc = ResolveFlags(&conn); rc != kOk) return rc;
  Client client(std::move(conn));
  if (cmd == "experiment") return Experiment(client, args);
  if (cmd == "submit") {
    int rc = Submit(client);
    return rc;
  }
  if (cmd == "list") return List(client);
  if (cmd == "get") return need_job("get") ? Get(client, args[2]) : kUsage;
  if (cmd == "watch") return need_job("watch") ? Watch(client, args[2]) : kUsage;
  if (cmd == "cancel") return need_job("cancel") ? Cancel(client, args[2]) : kUsage;
  if (cmd == "checkpoints") {
    return need_job("checkpoints") ? Checkpoints(client, args[2]) : kUsage;
  }
  if (cmd == "cost") return need_job("cost") ? Cost(client, args[2]) : kUsage;
  if (cmd == "estimate") return Estimate(client);
  std::cerr << "tallyctl: unknown command \"" << cmd << "\"\n\n" << kUsageText;
  return kUsage;
}

}  // namespace
}  // namespace tally::cli

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(tally::cli::kUsageText);
  // tallyctl says what failed in its own words (a failed TLS handshake
  // included); gRPC's own log lines only repeat it, unless asked for.
  if (std::getenv("GRPC_VERBOSITY") == nullptr && std::getenv("GRPC_TRACE") == nullptr) {
    gpr_set_log_function([](gpr_log_func_args*) {});
  }
  // -f is the customary short form of --file.
  std::vector<std::string> storage;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "-f" || a == "--file") && i + 1 < argc) {
      a = absl::StrCat("--file=", argv[++i]);
    } else if (absl::StartsWith(a, "-f=")) {
      a = "--file=" + a.substr(3);
    }
    storage.push_back(a);
  }
  std::vector<char*> argv2;
  for (auto& a : storage) argv2.push_back(a.data());
  std::vector<char*> args = absl::ParseCommandLine(argv2.size(), argv2.data());
  return tally::cli::Main(args);
}
