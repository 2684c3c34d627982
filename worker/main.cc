// tally-worker: one process per accelerator. Connects to tallyd, announces
// its device, runs the assignments it is given and reports back.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"
#include "worker/agent/agent.h"
#include "worker/agent/placeholder_runner.h"

ABSL_FLAG(std::string, controller, "",
          "tallyd's gRPC address host:port (default: $TALLY_CONTROLLER, else "
          "127.0.0.1:50051)");
ABSL_FLAG(std::string, worker_id, "",
          "stable id for this worker (default: HOSTNAME-DEVICE); keep it across "
          "restarts so tallyd can re-adopt running work");
ABSL_FLAG(std::string, device, "cpu", "device to train on: cpu or cuda:N");
ABSL_FLAG(std::string, gpu_type, "cpu",
          "GPU type announced to tallyd and matched against "
          "spec.resources.gpu_type (e.g. cpu, h200)");
ABSL_FLAG(int, slots, 1, "assignments this worker runs at once");
ABSL_FLAG(absl::Duration, placeholder_step_time, absl::Milliseconds(100),
          "how long the placeholder runner takes per step (it trains nothing)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-worker: runs training assignments from tallyd.\n\nUsage: "
      "tally-worker --controller=HOST:PORT [--worker_id=ID] [--device=cpu]");
  absl::ParseCommandLine(argc, argv);

  tally::worker::AgentOptions options;
  options.controller = absl::GetFlag(FLAGS_controller);
  if (options.controller.empty()) {
    const char* env = std::getenv("TALLY_CONTROLLER");
    options.controller = env && *env ? env : "127.0.0.1:50051";
  }
  options.device = absl::GetFlag(FLAGS_device);
  if (options.device != "cpu" && options.device.rfind("cuda:", 0) != 0) {
    spdlog::error("--device: must be cpu or cuda:N, got \"{}\"", options.device);
    return 2;
  }
  options.gpu_type = absl::GetFlag(FLAGS_gpu_type);
  options.slots = absl::GetFlag(FLAGS_slots);
  if (options.slots < 1 || options.slots > 1024) {
    spdlog::error("--slots: must be between 1 and 1024, got {}", options.slots);
    return 2;
  }
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  if (options.worker_id.empty()) {
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    options.worker_id = absl::StrCat(host, "-", options.device);
  }
  options.capabilities = {"placeholder"};

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  tally::worker::Agent agent(
      options, std::make_unique<tally::worker::PlaceholderRunner>(
                   absl::GetFlag(FLAGS_placeholder_step_time)));
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    spdlog::info("tally-worker: signal {}, stopping", sig);
    agent.Shutdown();
  });
  waiter.detach();
  spdlog::info("tally-worker {} ({} / {}) -> {}", options.worker_id, options.device,
               options.gpu_type, options.controller);
  return agent.Run();
}
