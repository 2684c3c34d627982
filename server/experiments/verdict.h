// An ended experiment's verdict (pure): which variant reached the target (a
// loss of target.metric, which the sentence names) for the fewest dollars, by recipe cost (or by billed dollars for all when
// one that reached it has no recipe cost), with its ratio to the reference,
// and, over replicates, with its 90% interval and whether that interval
// tells it apart from the reference. decide.h ends an experiment with it,
// followed by calibration.h's TimingSentence.
#ifndef TALLY_SERVER_EXPERIMENTS_VERDICT_H_
#define TALLY_SERVER_EXPERIMENTS_VERDICT_H_

#include <string>

#include "tally/v1/experiments.pb.h"

namespace tally::experiments {

// One run of each variant; `ref` is the reference's run in e.variants.
std::string Verdict(const tally::v1::Experiment& e, int ref);

// Replicates: from e.summaries.
std::string ReplicatesVerdict(const tally::v1::Experiment& e);

}  // namespace tally::experiments

#endif  // TALLY_SERVER_EXPERIMENTS_VERDICT_H_
