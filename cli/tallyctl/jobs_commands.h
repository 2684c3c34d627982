// tallyctl's commands about jobs. All but Validate call tallyd's Jobs API
// through `c`. Each reads its flags (flags.h), prints to stdout as text or,
// with --output=json, as JSON, tells what failed on stderr (Fail, client.h)
// and returns tallyctl's exit code (exit_codes.h). A JOB argument is
// jobs/ID or just ID.
#ifndef TALLY_CLI_TALLYCTL_JOBS_COMMANDS_H_
#define TALLY_CLI_TALLYCTL_JOBS_COMMANDS_H_

#include <string>

#include "cli/tallyctl/client.h"

namespace tally::cli {

// submit -f SPEC: submits the spec (YAML or JSON, - for stdin), checked
// first as tallyd will, under --request_id (or a fresh key) and sent again
// while tallyd is unavailable; prints the job's name.
int Submit(Client& c);

// estimate -f SPEC: what the spec would cost (EstimateText, job_format.h).
int Estimate(Client& c);

// get JOB: the job, described.
int Get(Client& c, const std::string& name);

// list: one line per job, newest first (--state, --page_size, --page_token,
// --tenant); "more: --page_token=..." when there is another page.
int List(Client& c);

// cancel JOB: cancels the job (--reason) and describes it. A cancel whose
// first tallyd went away mid-call and that then finds the job ended is
// taken as done when the job is CANCELLED.
int Cancel(Client& c, const std::string& name);

// checkpoints JOB: the job's checkpoints with their cost, the best marked
// (the lowest validation loss; with none evaluated, the latest) and damaged
// ones flagged, and how to export the best.
int Checkpoints(Client& c, const std::string& name);

// cost JOB: the estimate beside the actual cost, what failures lost and
// preemptions redid, the budget used; then its checkpoints (Checkpoints).
int Cost(Client& c, const std::string& name);

// watch JOB: the job's events from --after until it ends, a progress bar on
// a terminal, one line per event otherwise (JSON lines with --output=json);
// reconnects while tallyd is briefly away (watch_reconnect.h). kOk when the
// job SUCCEEDED or EARLY_STOPPED, else kJobUnsuccessful.
int Watch(Client& c, const std::string& arg);

// validate -f SPEC: the same reading and checks as submit, without the call;
// prints "FILE: ok" (and, with --output=json, the spec with defaults).
int Validate();

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_JOBS_COMMANDS_H_
