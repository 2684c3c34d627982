// tallyctl's experiment commands: `tallyctl experiment SUBCOMMAND`, a recipe
// experiment (variants of one base spec, judged by dollars to a target loss)
// through tallyd's Experiments API. Flags, output, errors and exit codes as
// for the job commands (jobs_commands.h); an EXPERIMENT argument is
// experiments/ID or just ID.
#ifndef TALLY_CLI_TALLYCTL_EXPERIMENT_COMMANDS_H_
#define TALLY_CLI_TALLYCTL_EXPERIMENT_COMMANDS_H_

#include <vector>

#include "cli/tallyctl/client.h"

namespace tally::cli {

// experiment validate -f FILE: reads and checks the experiment file as
// tallyd will, without a call; prints "FILE: ok, N variants".
int ExperimentValidate();

// Runs `tallyctl experiment SUB [EXPERIMENT]`, args being the command line
// left after the flags (args[2] the subcommand): create -f FILE, get, list,
// watch (the table redrawn on a terminal, one line per event otherwise; kOk
// when the experiment SUCCEEDED, else kJobUnsuccessful), cancel (--reason),
// report (the table, and with --svg the loss-against-dollars chart).
// validate is ExperimentValidate, which needs no Client. kUsage for a
// missing or unknown subcommand or a missing EXPERIMENT.
int Experiment(Client& c, const std::vector<char*>& args);

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_EXPERIMENT_COMMANDS_H_
