#include "cli/tallyctl/experiment_commands.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "cli/tallyctl/experiment_report.h"
#include "cli/tallyctl/flags.h"
#include "cli/tallyctl/job_format.h"
#include "cli/tallyctl/output.h"
#include "cli/tallyctl/watch_reconnect.h"
#include "common/experiment_spec.h"
#include "common/spec_yaml.h"
#include "common/text.h"

namespace tally::cli {
namespace {

std::string ExperimentStateName(tally::v1::ExperimentState s) {
  absl::string_view name = tally::v1::ExperimentState_Name(s);
  absl::ConsumePrefix(&name, "EXPERIMENT_STATE_");
  return std::string(name);
}

std::string NormalizeExperimentName(const std::string& arg) {
  return absl::StartsWith(arg, "experiments/") ? arg : absl::StrCat("experiments/", arg);
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
    const bool by_quantized = e.spec().target().metric() == "quantized_val_loss";
    std::cout << absl::StrFormat("%s %.4f", by_quantized ? "quantized_val_loss" : "val loss",
                                 e.target_val_loss());
    if (e.spec().target().has_from_variant()) {
      std::cout << (e.spec().replicates() > 1 ? " (the highest final loss of the runs of "
                                              : " (the final loss of ")
                << Safe(e.spec().target().from_variant()) << ")";
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
  std::cout << "  timing:    " << TimingLine(e) << "\n";
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
    std::cout << Json(e) << "\n";
  } else {
    std::cout << Safe(e.name()) << "\n";
  }
  return kOk;
}

int ExperimentGet(Client& c, const std::string& arg) {
  tally::v1::Experiment e;
  if (int rc = GetExperiment(c, arg, &e); rc != kOk) return rc;
  if (absl::GetFlag(FLAGS_output) == "json") {
    std::cout << Json(e) << "\n";
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
    std::cout << Json(resp) << "\n";
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
    std::cout << Json(e) << "\n";
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
    std::cout << Json(e) << "\n";
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

}  // namespace

int ExperimentValidate() {
  tally::v1::ExperimentSpec spec;
  if (int rc = ReadExperimentFlag("validate", &spec); rc != kOk) return rc;
  const std::string file = absl::GetFlag(FLAGS_file);
  std::cout << (file == "-" ? "<stdin>" : Safe(file)) << ": ok, " << spec.variants_size()
            << " variants\n";
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

}  // namespace tally::cli
