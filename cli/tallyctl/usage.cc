#include "cli/tallyctl/usage.h"

namespace tally::cli {

const char kUsageText[] = R"(tallyctl: submit and follow Tally training jobs.

Usage: tallyctl [flags] COMMAND [ARGS]

Commands:
  submit -f job.yaml     submit a job spec (YAML or JSON); prints the job name
  get JOB                show one job (JOB is jobs/ID or just ID)
  list                   list jobs, newest first (--state, --page_size;
                         admins: --tenant=T for one tenant's; tallyd filters
                         by --label=K=V[,K=V], --name_prefix=P and
                         --created_after/--created_before=TIME|6h)
  watch JOB              follow a job's events until it ends (progress bar on
                         a terminal, one line per event otherwise)
  logs JOB               what the job's attempts printed (--follow until it
                         ends, --attempt K, --rank R, --since 10m, --tail 100)
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

}  // namespace tally::cli
