// tally_build_info{version,revision}: 1, naming the build that serves, so
// dashboards can show what runs and alerts can tell a rollout.
#ifndef TALLY_SERVER_METRICS_BUILD_INFO_H_
#define TALLY_SERVER_METRICS_BUILD_INFO_H_

#include "server/metrics/registry.h"

namespace tally::metrics {

// The project version and the git revision CMake found when it configured
// ("unknown" outside a git checkout).
const char* BuildVersion();
const char* BuildRevision();

// Registers tally_build_info in `registry`.
void RegisterBuildInfo(Registry* registry);

}  // namespace tally::metrics

#endif  // TALLY_SERVER_METRICS_BUILD_INFO_H_
