#include "cli/tallyctl/flags.h"

#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"

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
ABSL_FLAG(std::string, label, "",
          "list: only jobs with these labels, KEY=VALUE[,KEY=VALUE...] (all of them)");
ABSL_FLAG(std::string, name_prefix, "", "list: only jobs whose display name starts with this");
ABSL_FLAG(std::string, created_after, "",
          "list: only jobs created at or after this: a time (RFC 3339, e.g. "
          "2026-12-06T09:00:00Z) or a duration ago (e.g. 6h)");
ABSL_FLAG(std::string, created_before, "",
          "list: only jobs created before this: a time (RFC 3339) or a duration ago");
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
