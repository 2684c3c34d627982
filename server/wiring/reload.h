// What tallyd does on SIGHUP: re-read its credentials, check its TLS files
// and re-read its --config file into the running server.
#ifndef TALLY_SERVER_WIRING_RELOAD_H_
#define TALLY_SERVER_WIRING_RELOAD_H_

#include "server/api/core.h"
#include "server/api/gate.h"
#include "server/api/priority_caps.h"
#include "server/api/rate_limiter.h"
#include "server/config/tallyd_config.h"
#include "server/config/tallyd_options.h"
#include "server/metrics/registry.h"

namespace tally::wiring {

// What a SIGHUP reloads, and what it reloads into. Everything is borrowed
// and must outlive the reload.
struct Reloadable {
  api::Gate& gate;
  metrics::Family<metrics::Counter>& credential_reload_failures;
  const config::TallydOptions& options;
  const config::TallydConfig& config;  // as read at start
  api::RateLimiter& submit_limiter;
  api::PriorityCaps& priority_caps;
  api::Core& core;
};

// One SIGHUP: credentials (a bad file fails closed, and streams they no
// longer admit end), a check of the TLS files, then the config file's
// prices, quotas, submit limits and priority caps (a bad file keeps the
// old ones; what is read at start only is named). Logs what it did.
void Reload(const Reloadable& r);

}  // namespace tally::wiring

#endif  // TALLY_SERVER_WIRING_RELOAD_H_
