// Every flag of tallyctl, defined once (flags.cc, where each one's help text
// says what it means) and declared here for the code that reads them.
#ifndef TALLY_CLI_TALLYCTL_FLAGS_H_
#define TALLY_CLI_TALLYCTL_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/time/time.h"

// How to reach tallyd (read by ResolveFlags, client.h).
ABSL_DECLARE_FLAG(std::string, controller);
ABSL_DECLARE_FLAG(std::string, token);
ABSL_DECLARE_FLAG(std::string, token_file);
ABSL_DECLARE_FLAG(std::string, ca_cert);
ABSL_DECLARE_FLAG(std::string, tls_server_name);
ABSL_DECLARE_FLAG(std::string, context);
ABSL_DECLARE_FLAG(std::string, config_file);

// What the commands read.
ABSL_DECLARE_FLAG(std::string, tenant);
ABSL_DECLARE_FLAG(std::string, name);
ABSL_DECLARE_FLAG(std::string, role);
ABSL_DECLARE_FLAG(std::string, output);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(std::string, file);
ABSL_DECLARE_FLAG(std::string, request_id);
ABSL_DECLARE_FLAG(std::string, state);
ABSL_DECLARE_FLAG(int, page_size);
ABSL_DECLARE_FLAG(std::string, page_token);
ABSL_DECLARE_FLAG(std::string, label);
ABSL_DECLARE_FLAG(std::string, name_prefix);
ABSL_DECLARE_FLAG(std::string, created_after);
ABSL_DECLARE_FLAG(std::string, created_before);
ABSL_DECLARE_FLAG(std::string, reason);
ABSL_DECLARE_FLAG(int64_t, after);
ABSL_DECLARE_FLAG(bool, wait);
ABSL_DECLARE_FLAG(std::string, svg);
ABSL_DECLARE_FLAG(std::string, svg_x);
ABSL_DECLARE_FLAG(std::string, svg_y);

#endif  // TALLY_CLI_TALLYCTL_FLAGS_H_
