// tallyctl: the command-line client for tallyd's Jobs and Experiments APIs.
#include <grpc/support/log.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/tallyctl/client.h"
#include "cli/tallyctl/exit_codes.h"
#include "cli/tallyctl/experiment_commands.h"
#include "cli/tallyctl/flags.h"
#include "cli/tallyctl/jobs_commands.h"
#include "cli/tallyctl/logs_command.h"
#include "cli/tallyctl/output.h"
#include "cli/tallyctl/suggest.h"
#include "cli/tallyctl/token_commands.h"
#include "cli/tallyctl/usage.h"

namespace tally::cli {
namespace {

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
                                              "checkpoints", "cost",       "estimate",
                                              "logs"};
  if (std::find(std::begin(kCommands), std::end(kCommands), cmd) == std::end(kCommands)) {
    std::vector<const char*> known(std::begin(kCommands), std::end(kCommands));
    known.insert(known.end(), {"validate", "token", "help"});
    std::cerr << UnknownCommandMessage(cmd, known);
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
  if (cmd == "logs") return need_job("logs") ? Logs(client, args[2]) : kUsage;
  if (cmd == "estimate") return Estimate(client);
  std::cerr << "tallyctl: unknown command \"" << Safe(cmd) << "\"\n";
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
