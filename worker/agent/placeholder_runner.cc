#include "worker/agent/placeholder_runner.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tally::worker {

tally::v1::AttemptExit PlaceholderRunner::Run(
    const tally::v1::Assignment& assignment, Reporter* reporter,
    const std::atomic<bool>* stop) {
  tally::v1::AttemptExit exit;
  exit.set_job(assignment.job());
  exit.set_attempt(assignment.attempt());
  const int64_t max_steps = assignment.spec().training().max_steps();
  int64_t step = assignment.resume_from().step();
  while (step < max_steps) {
    if (stop->load()) {
      exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
      exit.set_reason(absl::StrCat("stopped at step ", step));
      exit.set_step(step);
      return exit;
    }
    absl::SleepFor(step_time_);
    ++step;
    tally::v1::Progress p;
    p.set_job(assignment.job());
    p.set_attempt(assignment.attempt());
    p.set_step(step);
    p.set_trained(false);
    reporter->Progress(p);
  }
  exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_SUCCEEDED);
  exit.set_reason(absl::StrCat("placeholder worker: walked ", max_steps,
                               " steps without training (no trainer in this "
                               "build)"));
  exit.set_step(step);
  return exit;
}

}  // namespace tally::worker
