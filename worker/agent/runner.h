// Runner: what a worker does with one assignment. The agent owns the stream
// to tallyd; a runner only reports through Reporter and checks `stop` at
// least once per step, so a stop order takes effect within one step. A stop
// that keeps the state (stop.h) has the runner report its final evaluation
// and checkpoint before Run() returns, so they precede the exit.
#ifndef TALLY_WORKER_AGENT_RUNNER_H_
#define TALLY_WORKER_AGENT_RUNNER_H_

#include <memory>

#include "tally/v1/workers.pb.h"
#include "worker/train/stop.h"

namespace tally::worker {

// Thread-safe; reports are delivered in order, buffered across reconnects.
class Reporter {
 public:
  virtual ~Reporter() = default;
  virtual void Progress(const tally::v1::Progress& p) = 0;
  virtual void Eval(const tally::v1::EvalResult& e) = 0;
  virtual void Checkpoint(const tally::v1::CheckpointRecord& c) = 0;
};

class Runner {
 public:
  virtual ~Runner() = default;
  // Runs the assignment to its end and says how it ended. Must not throw.
  virtual tally::v1::AttemptExit Run(const tally::v1::Assignment& assignment,
                                     Reporter* reporter,
                                     const train::StopFlag* stop) = 0;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_RUNNER_H_
