#include "server/metrics/build_info.h"

#ifndef TALLY_VERSION
#define TALLY_VERSION "unknown"
#endif
#ifndef TALLY_REVISION
#define TALLY_REVISION "unknown"
#endif

namespace tally::metrics {

const char* BuildVersion() { return TALLY_VERSION; }
const char* BuildRevision() { return TALLY_REVISION; }

void RegisterBuildInfo(Registry* registry) {
  BuildGauge()
      .Name("tally_build_info")
      .Help("1, labelled with the version and git revision of the tallyd build.")
      .Register(*registry)
      .Add({{"version", BuildVersion()}, {"revision", BuildRevision()}})
      .Set(1);
}

}  // namespace tally::metrics
