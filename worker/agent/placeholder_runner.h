// PlaceholderRunner: stands in until the trainer exists. It takes an
// assignment, walks its steps at a fixed pace without training anything,
// reports each step with trained=false, and ends saying so. It never claims
// a loss, a checkpoint or an evaluation.
#ifndef TALLY_WORKER_AGENT_PLACEHOLDER_RUNNER_H_
#define TALLY_WORKER_AGENT_PLACEHOLDER_RUNNER_H_

#include "absl/time/time.h"
#include "worker/agent/runner.h"

namespace tally::worker {

class PlaceholderRunner final : public Runner {
 public:
  explicit PlaceholderRunner(absl::Duration step_time) : step_time_(step_time) {}
  tally::v1::AttemptExit Run(const tally::v1::Assignment& assignment,
                             Reporter* reporter,
                             const std::atomic<bool>* stop) override;

 private:
  const absl::Duration step_time_;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_PLACEHOLDER_RUNNER_H_
