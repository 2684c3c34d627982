#include "cli/tallyctl/jobs_commands.h"

#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cli/tallyctl/flags.h"
#include "cli/tallyctl/job_format.h"
#include "cli/tallyctl/output.h"
#include "cli/tallyctl/watch_reconnect.h"
#include "common/spec_validation.h"
#include "common/spec_yaml.h"

namespace tally::cli {
namespace {

std::string NormalizeName(const std::string& arg) {
  return absl::StartsWith(arg, "jobs/") ? arg : absl::StrCat("jobs/", arg);
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
  std::cout << LossLines(j);
  if (!es.best_checkpoint().empty()) {
    std::cout << "  best checkpoint: " << Safe(es.best_checkpoint()) << "\n";
  }
  if (j.forecast().valid()) {
    const auto& f = j.forecast();
    std::cout << absl::StrFormat(
        "  forecast:  %s %.4f (%.4f-%.4f) at step %d, from %d evals up to step %d\n",
        f.metric() == "quantized_val_loss" ? "quantized_val_loss" : "val loss",
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

}  // namespace

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

namespace {

// --created_after / --created_before: an RFC 3339 time, or a duration
// before now ("6h"). False (with the message printed) when it is neither.
bool ReadTimeFlag(const std::string& value, const char* flag,
                  google::protobuf::Timestamp* out) {
  absl::Time t;
  absl::Duration ago;
  std::string err;
  if (absl::ParseDuration(value, &ago) && ago >= absl::ZeroDuration()) {
    t = absl::Now() - ago;
  } else if (!absl::ParseTime(absl::RFC3339_full, value, &t, &err)) {
    std::cerr << "tallyctl list: --" << flag << ": \"" << Safe(value)
              << "\" is neither a time (RFC 3339, e.g. 2026-12-06T09:00:00Z) nor a duration "
                 "ago (e.g. 6h, 30m)\n";
    return false;
  }
  out->set_seconds(absl::ToUnixSeconds(t));
  out->set_nanos(static_cast<int32_t>(
      absl::ToInt64Nanoseconds(t - absl::FromUnixSeconds(absl::ToUnixSeconds(t)))));
  return true;
}

}  // namespace

int List(Client& c) {
  tally::v1::ListJobsRequest req;
  for (absl::string_view kv :
       absl::StrSplit(absl::GetFlag(FLAGS_label), ',', absl::SkipEmpty())) {
    const size_t eq = kv.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      std::cerr << "tallyctl list: --label: \"" << Safe(kv)
                << "\" is not KEY=VALUE; e.g. --label=team=nlp,sweep=lr\n";
      return kUsage;
    }
    (*req.mutable_labels())[std::string(kv.substr(0, eq))] = std::string(kv.substr(eq + 1));
  }
  req.set_display_name_prefix(absl::GetFlag(FLAGS_name_prefix));
  if (const std::string v = absl::GetFlag(FLAGS_created_after);
      !v.empty() && !ReadTimeFlag(v, "created_after", req.mutable_created_after())) {
    return kUsage;
  }
  if (const std::string v = absl::GetFlag(FLAGS_created_before);
      !v.empty() && !ReadTimeFlag(v, "created_before", req.mutable_created_before())) {
    return kUsage;
  }
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

namespace {

// The index of the best checkpoint: the lowest loss of the metric the job
// is judged by (0 or absent: not evaluated), never a damaged one; with none
// evaluated, the latest. -1 when there is none.
int BestCheckpoint(const tally::v1::ListCheckpointsResponse& resp,
                   const std::map<std::string, std::string>& damaged, bool by_quantized) {
  auto loss = [by_quantized](const tally::v1::Checkpoint& ck) {
    if (!by_quantized) return ck.val_loss();
    return ck.has_quantized_val_loss() ? ck.quantized_val_loss() : 0.0;
  };
  int best = -1;
  for (int i = 0; i < resp.checkpoints_size(); ++i) {
    const auto& ck = resp.checkpoints(i);
    if (damaged.count(ck.path())) continue;
    const double l = loss(ck);
    const double b = best < 0 ? 0 : loss(resp.checkpoints(best));
    if (l > 0 && (best < 0 || b <= 0 || l < b)) {
      best = i;
    } else if (best < 0 || (b <= 0 && l <= 0 && ck.step() >= resp.checkpoints(best).step())) {
      best = i;
    }
  }
  return best;
}

}  // namespace

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
  // never the best. Without the job (an older tallyd) none are known, and
  // the best is by val_loss.
  std::map<std::string, std::string> damaged;
  tally::v1::Job job;
  {
    tally::v1::GetJobRequest get;
    get.set_name(NormalizeName(name));
    if (c.Call([&](grpc::ClientContext* ctx) { return c.stub()->GetJob(ctx, get, &job); })
            .ok()) {
      for (const auto& d : job.damaged_checkpoints()) damaged[d.path()] = d.reason();
    }
  }
  const bool by_quantized = job.spec().early_stopping().metric() == "quantized_val_loss";
  const std::string format = job.spec().training().eval_quantized().empty()
                                 ? std::string("quantized")
                                 : Safe(job.spec().training().eval_quantized());
  const bool any_quantized =
      std::any_of(resp.checkpoints().begin(), resp.checkpoints().end(),
                  [](const tally::v1::Checkpoint& ck) { return ck.has_quantized_val_loss(); });
  const int best = BestCheckpoint(resp, damaged, by_quantized);
  std::cout << absl::StrFormat("%-5s %-7s %-8s %-10s %-9s ", "BEST", "ATTEMPT", "STEP", "TOKENS",
                               "VAL_LOSS")
            << (any_quantized ? absl::StrFormat("%-9s ", absl::AsciiStrToUpper(format)) : "")
            << absl::StrFormat("%-10s %-10s %-12s %s\n", "COST_USD", "SINCE_USD",
                               "USD_PER_GAIN", "PATH");
  for (int i = 0; i < resp.checkpoints_size(); ++i) {
    const auto& ck = resp.checkpoints(i);
    // 0 means no evaluation at the checkpoint's step, or no gain.
    const std::string val =
        ck.val_loss() != 0 ? absl::StrFormat("%.4f", ck.val_loss()) : std::string("-");
    const std::string quantized =
        ck.has_quantized_val_loss() ? absl::StrFormat("%.4f", ck.quantized_val_loss()) : "-";
    const std::string per_gain = ck.usd_per_val_loss_improvement() != 0
                                     ? absl::StrFormat("%.6f", ck.usd_per_val_loss_improvement())
                                     : std::string("-");
    const bool bad = damaged.count(ck.path()) > 0;
    std::cout << absl::StrFormat("%-5s %-7d %-8d %-10d %-9s ",
                                 i == best ? "*" : (bad ? "bad" : ""), ck.attempt(), ck.step(),
                                 ck.tokens(), val)
              << (any_quantized ? absl::StrFormat("%-9s ", quantized) : "")
              << absl::StrFormat("%-10.6f %-10.6f %-12s %s%s\n", ck.cost_usd(),
                                 ck.cost_since_previous_usd(), per_gain, Safe(ck.path()),
                                 bad ? "  (damaged: " + Safe(damaged[ck.path()]) + ")" : "");
  }
  if (best < 0) {
    std::cout << "no checkpoints yet\n";
    return kOk;
  }
  const auto& b = resp.checkpoints(best);
  const std::string job_name = NormalizeName(name);
  std::string why = " (latest; none evaluated)";
  if (b.val_loss() != 0 || b.has_quantized_val_loss()) {
    why = absl::StrFormat(" (val loss %.4f", b.val_loss());
    if (b.has_quantized_val_loss()) {
      absl::StrAppendFormat(&why, ", %s %.4f", format, b.quantized_val_loss());
    }
    absl::StrAppend(&why, by_quantized ? "; the lowest quantized_val_loss)" : ")");
  }
  std::cout << "\nbest: step " << b.step() << why
            << ", $" << absl::StrFormat("%.6f", b.cost_usd()) << "\n"
            << "export it as a Hugging Face model:\n  tally-export --job=" << Safe(job_name)
            << " --which=best --out=DIR\n  (or tally-export --checkpoint=" << Safe(b.path())
            << " --out=DIR)\n";
  return kOk;
}

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
      std::cout << EventLine(e, absl::LocalTimeZone(), preemptions.count(),
                             job.spec().training().eval_quantized())
                << std::endl;
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

int Validate() {
  tally::v1::JobSpec spec, prepared;
  if (int rc = ReadSpecFlag("validate", &spec, &prepared); rc != kOk) return rc;
  const std::string file = absl::GetFlag(FLAGS_file);
  std::cout << (file == "-" ? "<stdin>" : Safe(file)) << ": ok\n";
  if (absl::GetFlag(FLAGS_output) == "json") std::cout << Json(prepared) << "\n";
  return kOk;
}

}  // namespace tally::cli
