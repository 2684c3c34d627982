// WorkerOptions: tally-worker's settings as given (flags, then the
// environment variables named in each flag's help), and their one check.
// main.cc fills it, calls Validate(), then builds the agent and the trainer
// runner from it (files are read then: credentials, data roots); nothing
// here touches a file, a device or the network.
#ifndef TALLY_WORKER_CONFIG_WORKER_OPTIONS_H_
#define TALLY_WORKER_CONFIG_WORKER_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tally::worker {

struct WorkerOptions {
  // tallyd's address(es), HOST:PORT[,HOST:PORT...], and where they came
  // from ("--controller" or "$TALLY_CONTROLLER") for messages.
  std::string controller = "127.0.0.1:50051";
  std::string controller_source = "--controller";
  std::string worker_id;  // empty: HOSTNAME-DEVICE
  std::string device = "cpu";
  std::string gpu_type = "cpu";
  int slots = 1;
  std::string capacity = "on_demand";
  absl::Duration preemption_deadline = absl::Seconds(25);
  std::string preemption_notice_file;
  // A duration with its unit ("90s"); "0": never. Text, so that a number
  // without its unit gets a message that says what to write.
  std::string exit_when_idle = "0";
  std::string ca_cert, tls_cert, tls_key, token_file;
  std::string rendezvous_host;  // empty: the host name
  int rendezvous_port = 29500;
  double collective_timeout_seconds = 120;
  std::string checkpoint_dir = "tally-checkpoints";
  double peak_tflops = 0;  // 0: the GPU type's table value
  int threads = 0;         // 0: LibTorch's choice
  std::vector<std::string> data_roots;
  bool data_roots_from_env = false;  // $TALLY_DATA_ROOTS, for messages
  // Tests only (the --testonly_* flags).
  double test_fp8_overflow_fraction = 0;
  std::string test_fp8_grouped_off;
  int test_moe_collapse_expert = -1;
  absl::Duration test_preempt_checkpoint_delay = absl::ZeroDuration();

  // INVALID_ARGUMENT naming the first flag out of range and what it takes.
  absl::Status Validate() const;
  // The controller list, normalised ("a:1,b:2"); INVALID_ARGUMENT as
  // Validate says.
  absl::StatusOr<std::string> Controllers() const;
  // exit_when_idle as a duration (Validate has passed).
  absl::Duration ExitWhenIdle() const;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_CONFIG_WORKER_OPTIONS_H_
