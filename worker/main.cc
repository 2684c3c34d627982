// tally-worker: one process per accelerator. Connects to tallyd, announces
// its device, runs the assignments it is given and reports back.
//
// SIGTERM (Kubernetes evicting the pod: a node drain, a spot reclaim),
// SIGINT, or --preemption_notice_file appearing is a preemption: running
// attempts checkpoint their latest step and exit PREEMPTED, and the process
// exits 0 within --preemption_deadline (agent.h). If an attempt is still
// busy at the deadline (a checkpoint too slow to finish), the process ends
// with _exit(0) once the logs are flushed, rather than wait for its thread.
//
// --exit_when_idle=DURATION: after that long connected with no assignment
// the worker leaves the same way, with cause "idle", and exits 0.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/flag_env.h"
#include "spdlog/spdlog.h"
#include "worker/agent/agent.h"
#include "worker/agent/credentials.h"
#include "worker/agent/path_confinement.h"
#include "worker/agent/train_spec.h"
#include "worker/agent/trainer_runner.h"
#include "worker/config/worker_options.h"
#include "worker/train/trainer.h"

ABSL_FLAG(std::string, controller, "",
          "tallyd's gRPC address HOST:PORT, or several separated by commas (a leader and its "
          "standbys, e.g. tally-0.tally:50051,tally-1.tally:50051): each reconnect goes to the "
          "next in turn, so the worker finds whichever leads (default: $TALLY_CONTROLLER, else "
          "127.0.0.1:50051)");
ABSL_FLAG(std::string, worker_id, "",
          "stable id for this worker (default: HOSTNAME-DEVICE); keep it across "
          "restarts so tallyd can re-adopt running work");
ABSL_FLAG(std::string, device, "cpu", "device to train on: cpu or cuda:N");
ABSL_FLAG(std::string, gpu_type, "cpu",
          "GPU type announced to tallyd and matched against "
          "spec.resources.gpu_type (e.g. cpu, h200)");
ABSL_FLAG(int, slots, 1, "assignments this worker runs at once");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where checkpoints are written, one folder per job (default: "
          "$TALLY_CHECKPOINT_DIR, else ./tally-checkpoints); workers that may resume "
          "each other's jobs must share it");
ABSL_FLAG(double, peak_tflops, 0,
          "this device's peak TFLOP/s for model-FLOPs utilization (default: known "
          "dense BF16 peaks for h100, h200, b200, a100, l4; none for cpu)");
ABSL_FLAG(int, threads, 0, "CPU threads for training (default: LibTorch's choice)");
ABSL_FLAG(std::string, rendezvous_host, "",
          "multi-GPU jobs: the address other workers reach this one at, where it hosts "
          "the c10d store of attempts it leads and binds its Gloo connections "
          "(default: $TALLY_RENDEZVOUS_HOST, else this machine's hostname)");
ABSL_FLAG(int, rendezvous_port, 29500,
          "multi-GPU jobs: first port for the c10d store of attempts this worker leads, "
          "one port per slot from here; 0: never lead one");
ABSL_FLAG(double, collective_timeout, 120,
          "multi-GPU jobs: seconds a collective (or the rendezvous) waits for the other "
          "ranks before the attempt fails and is requeued");
ABSL_FLAG(std::string, ca_cert, "",
          "PEM file of the certificates tallyd's certificate is verified against; set, the "
          "worker connects with TLS (default: $TALLY_CA_CERT, else plaintext)");
ABSL_FLAG(std::string, tls_cert, "",
          "mutual TLS: this worker's certificate (PEM file); tallyd accepts it when its CN or "
          "a DNS SAN equals --worker_id. Needs --tls_key and --ca_cert");
ABSL_FLAG(std::string, tls_key, "",
          "mutual TLS: the private key of --tls_cert (PEM file, not encrypted)");
ABSL_FLAG(std::string, token_file, "",
          "file holding this worker's token (surrounding whitespace trimmed), sent to tallyd "
          "as \"authorization: Bearer TOKEN\" (default: $TALLY_WORKER_TOKEN_FILE, else none). "
          "Certificate, key and token files are read again before every reconnect");
ABSL_FLAG(absl::Duration, preemption_deadline, absl::Seconds(25),
          "on SIGTERM, SIGINT or --preemption_notice_file: the time running attempts have to "
          "checkpoint their latest step, report it and exit PREEMPTED, after which the worker "
          "exits 0 whatever is left. Must stay below Kubernetes' "
          "terminationGracePeriodSeconds (the manifests set 60), which ends in SIGKILL");
ABSL_FLAG(std::string, preemption_notice_file, "",
          "a file whose appearance means this worker is going away (checked every 200 ms): a "
          "node agent or the cloud's metadata poller (spot reclaim, maintenance) creates it; "
          "the worker then preempts itself as on SIGTERM. Empty: none");
ABSL_FLAG(std::string, exit_when_idle, "0",
          "leave after this long connected to tallyd with no assignment (e.g. 90s, 5m; timed "
          "from the connection or the last attempt's exit, never while one runs): the worker "
          "tells tallyd (a notice, cause idle, so nothing more is placed on it) and exits 0. "
          "For autoscaled fleets that shrink to zero. 0: never");
ABSL_FLAG(std::string, capacity, "on_demand",
          "the capacity this worker runs on, told to tallyd: spot (cheaper, may be reclaimed "
          "with a short notice) or on_demand; matched against spec.resources.capacity");
ABSL_FLAG(std::vector<std::string>, data_root, {},
          "comma-separated folders that datasets may be read from: every file a job spec's "
          "data paths open must resolve (symlinks followed) inside one, or the job fails "
          "(default: $TALLY_DATA_ROOTS, else no confinement: any path a spec names is read)");
// Test-only knobs: they damage every assignment's training on purpose, so
// that the FP8-overflow and expert-collapse alerts can be seen to fire.
ABSL_FLAG(double, testonly_fp8_overflow_fraction, 0,
          "TESTS ONLY, never in production: in FP8 jobs (delayed or current recipe), this "
          "fraction (0 to 1) of each FP8 linear's input values is pushed beyond FP8's range "
          "after scaling, so it is clamped and counted as an overflow; a run whose "
          "overflows pass 1% of its values for a few steps fails. 0: off");
ABSL_FLAG(std::string, testonly_fp8_grouped_off, "",
          "TESTS ONLY, never in production: in FP8 jobs, grouped expert products are turned "
          "off from the start with this reason, as when CUDA refuses them, and every progress "
          "report says so (tallyd records a warning event). Empty: off");
ABSL_FLAG(int, testonly_moe_collapse_expert, -1,
          "TESTS ONLY, never in production: in MoE jobs, every token of every MoE layer is "
          "routed to this expert (as one of its top-k), a forced routing collapse; an "
          "expert the model does not have fails the job. -1: off");
ABSL_FLAG(absl::Duration, testonly_preempt_checkpoint_delay, absl::ZeroDuration(),
          "TESTS ONLY, never in production: on a preemption, every attempt waits this long "
          "before writing its preemption checkpoint, so the checkpoint can be made to miss "
          "--preemption_deadline. 0: off");

namespace {

using tally::worker::WorkerOptions;

// Flags, then the environment variables their help names.
WorkerOptions OptionsFromFlags() {
  WorkerOptions o;
  o.controller = tally::FlagOrEnv(absl::GetFlag(FLAGS_controller), "TALLY_CONTROLLER",
                                  o.controller);
  if (tally::FromEnv(absl::GetFlag(FLAGS_controller), "TALLY_CONTROLLER")) {
    o.controller_source = "$TALLY_CONTROLLER";
  }
  o.worker_id = absl::GetFlag(FLAGS_worker_id);
  o.device = absl::GetFlag(FLAGS_device);
  o.gpu_type = absl::GetFlag(FLAGS_gpu_type);
  o.slots = absl::GetFlag(FLAGS_slots);
  o.capacity = absl::GetFlag(FLAGS_capacity);
  o.preemption_deadline = absl::GetFlag(FLAGS_preemption_deadline);
  o.preemption_notice_file = absl::GetFlag(FLAGS_preemption_notice_file);
  o.exit_when_idle = absl::GetFlag(FLAGS_exit_when_idle);
  o.ca_cert = tally::FlagOrEnv(absl::GetFlag(FLAGS_ca_cert), "TALLY_CA_CERT");
  o.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  o.tls_key = absl::GetFlag(FLAGS_tls_key);
  o.token_file = tally::FlagOrEnv(absl::GetFlag(FLAGS_token_file), "TALLY_WORKER_TOKEN_FILE");
  o.rendezvous_host = tally::FlagOrEnv(absl::GetFlag(FLAGS_rendezvous_host),
                                       "TALLY_RENDEZVOUS_HOST");
  o.rendezvous_port = absl::GetFlag(FLAGS_rendezvous_port);
  o.collective_timeout_seconds = absl::GetFlag(FLAGS_collective_timeout);
  o.checkpoint_dir = tally::FlagOrEnv(absl::GetFlag(FLAGS_checkpoint_dir),
                                      "TALLY_CHECKPOINT_DIR", o.checkpoint_dir);
  o.peak_tflops = absl::GetFlag(FLAGS_peak_tflops);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.data_roots = absl::GetFlag(FLAGS_data_root);
  if (o.data_roots.empty() && tally::FromEnv("", "TALLY_DATA_ROOTS")) {
    o.data_roots = absl::StrSplit(tally::FlagOrEnv("", "TALLY_DATA_ROOTS"), ',');
    o.data_roots_from_env = true;
  }
  o.test_fp8_overflow_fraction = absl::GetFlag(FLAGS_testonly_fp8_overflow_fraction);
  o.test_fp8_grouped_off = absl::GetFlag(FLAGS_testonly_fp8_grouped_off);
  o.test_moe_collapse_expert = absl::GetFlag(FLAGS_testonly_moe_collapse_expert);
  o.test_preempt_checkpoint_delay = absl::GetFlag(FLAGS_testonly_preempt_checkpoint_delay);
  return o;
}

// The agent's options: the validated flags, and the credentials read from
// their files (with warnings for a certificate naming another worker, and
// for a token sent in plaintext).
absl::StatusOr<tally::worker::AgentOptions> AgentOptionsFrom(const WorkerOptions& o,
                                                             const std::string& host) {
  tally::worker::AgentOptions options;
  absl::StatusOr<std::string> controllers = o.Controllers();
  if (!controllers.ok()) return controllers.status();
  options.controller = *controllers;
  options.device = o.device;
  options.gpu_type = o.gpu_type;
  options.slots = o.slots;
  options.worker_id = o.worker_id.empty() ? absl::StrCat(host, "-", o.device) : o.worker_id;
  options.capabilities = {"train", "packing", "fp8", "moe", "data-parallel"};
  options.capacity = o.capacity;
  options.preemption_deadline = o.preemption_deadline;
  options.preemption_notice_file = o.preemption_notice_file;
  options.exit_when_idle = o.ExitWhenIdle();
  tally::worker::CredentialFiles& files = options.credential_files;
  files.ca_cert = o.ca_cert;
  files.tls_cert = o.tls_cert;
  files.tls_key = o.tls_key;
  files.token = o.token_file;
  absl::StatusOr<tally::worker::Credentials> credentials =
      tally::worker::LoadCredentials(files);
  if (!credentials.ok()) return credentials.status();
  options.credentials = *std::move(credentials);
  if (!options.credentials.cert_pem.empty()) {
    auto names = tally::worker::CertificateNames(options.credentials.cert_pem);
    if (names.ok() &&
        std::find(names->begin(), names->end(), options.worker_id) == names->end()) {
      spdlog::warn("--tls_cert {} names {} (CN, then DNS SANs) but not this worker's id \"{}\": "
                   "tallyd accepts a certificate only for the --worker_id it names",
                   files.tls_cert, names->empty() ? "nothing" : absl::StrJoin(*names, ", "),
                   options.worker_id);
    }
  }
  if (files.ca_cert.empty() && !files.token.empty()) {
    spdlog::warn("no --ca_cert: the worker token goes to tallyd in plaintext, readable on the "
                 "network path; set --ca_cert unless TLS ends in front of tallyd");
  }
  options.rendezvous_host = o.rendezvous_host.empty() ? host : o.rendezvous_host;
  options.rendezvous_port = o.rendezvous_port;
  return options;
}

// Says loudly which test-only knobs damage every job on purpose.
void WarnTestKnobs(const tally::worker::TrainerRunnerOptions& runner, absl::Duration delay) {
  if (!runner.test_fp8_grouped_off.empty()) {
    spdlog::warn("tally-worker: test-only knob set (--testonly_fp8_grouped_off): grouped FP8 "
                 "expert products are off in every job");
  }
  if (delay > absl::ZeroDuration()) {
    spdlog::warn("tally-worker: test-only knob set (--testonly_preempt_checkpoint_delay={}): "
                 "every preemption checkpoint is delayed on purpose",
                 absl::FormatDuration(delay));
  }
  if (runner.test_fp8_overflow_fraction > 0 || runner.test_moe_forced_expert >= 0) {
    spdlog::warn("tally-worker: test-only knobs are set (--testonly_fp8_overflow_fraction={}, "
                 "--testonly_moe_collapse_expert={}): every job this worker runs is damaged "
                 "on purpose",
                 runner.test_fp8_overflow_fraction, runner.test_moe_forced_expert);
  }
}

// The trainer runner's options: the validated flags, and the data roots
// resolved against the working directory.
absl::StatusOr<tally::worker::TrainerRunnerOptions> RunnerOptionsFrom(
    const WorkerOptions& o, const tally::worker::AgentOptions& agent) {
  tally::worker::TrainerRunnerOptions runner;
  runner.device = agent.device;
  runner.rendezvous_local_host = agent.rendezvous_host;
  runner.collective_timeout_seconds = o.collective_timeout_seconds;
  runner.test_fp8_overflow_fraction = o.test_fp8_overflow_fraction;
  runner.test_fp8_grouped_off = o.test_fp8_grouped_off;
  runner.test_moe_forced_expert = o.test_moe_collapse_expert;
  runner.test_preempt_checkpoint_delay_seconds =
      absl::ToDoubleSeconds(o.test_preempt_checkpoint_delay);
  WarnTestKnobs(runner, o.test_preempt_checkpoint_delay);
  std::error_code cwd_error;
  const std::filesystem::path cwd = std::filesystem::current_path(cwd_error);
  if (cwd_error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the working directory: ", cwd_error.message()));
  }
  absl::StatusOr<tally::worker::DataRoots> roots =
      tally::worker::DataRoots::Make(o.data_roots, cwd);
  if (!roots.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        roots.status().message(), o.data_roots_from_env ? " (from $TALLY_DATA_ROOTS)" : ""));
  }
  runner.data_roots = *std::move(roots);
  if (runner.data_roots.confining()) {
    spdlog::info("datasets are read only under {}", runner.data_roots.Describe());
  } else {
    spdlog::warn("no --data_root: any dataset path a job spec names will be read, with this "
                 "worker's permissions; confine them with --data_root=DIR[,DIR...] (or "
                 "$TALLY_DATA_ROOTS)");
  }
  runner.checkpoint_dir = o.checkpoint_dir;
  runner.peak_flops =
      o.peak_tflops > 0 ? o.peak_tflops * 1e12 : tally::worker::PeakFlopsFor(agent.gpu_type);
  return runner;
}

// Runs the agent until it ends; SIGTERM and SIGINT (blocked here, taken by
// a thread of their own) are preemptions.
int RunAgent(const tally::worker::AgentOptions& options,
             tally::worker::TrainerRunnerOptions runner) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string checkpoint_dir = runner.checkpoint_dir;
  tally::worker::Agent agent(options,
                             std::make_unique<tally::worker::TrainerRunner>(std::move(runner)));
  std::thread waiter([&] {
    while (true) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      const char* cause = sig == SIGTERM ? "sigterm" : "sigint";
      spdlog::info("tally-worker: {}, going away within {}", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                   absl::FormatDuration(options.preemption_deadline));
      agent.Preempt(cause);  // a second signal changes nothing
    }
  });
  waiter.detach();
  spdlog::info("tally-worker {} ({} / {}, {}) -> {}, checkpoints in {}", options.worker_id,
               options.device, options.gpu_type, options.capacity, options.controller,
               checkpoint_dir);
  if (options.exit_when_idle > absl::ZeroDuration()) {
    spdlog::info("tally-worker: leaves after {} connected with no assignment (--exit_when_idle)",
                 absl::FormatDuration(options.exit_when_idle));
  }
  const int rc = agent.Run();
  if (agent.LeftIdle()) {
    spdlog::info("tally-worker: exiting {}: idle for --exit_when_idle={}", rc,
                 absl::FormatDuration(options.exit_when_idle));
  }
  if (agent.HasAbandonedAttempts()) {
    // An attempt's thread is still busy past the deadline (its checkpoint
    // write, say): destroying the agent would join it. End here instead;
    // the previous checkpoint is intact (writes are atomic).
    spdlog::warn("tally-worker: exiting with attempts still running (preemption deadline)");
    spdlog::default_logger()->flush();
    std::fflush(nullptr);
    std::_Exit(rc);
  }
  return rc;
}

}  // namespace

// Flags into WorkerOptions, Validate(), build the agent and its runner, run.
int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "tally-worker: runs training assignments from tallyd.\n\nUsage: "
      "tally-worker --controller=HOST:PORT[,HOST:PORT...] [--worker_id=ID] [--device=cpu] "
      "[--ca_cert=PEM [--tls_cert=PEM --tls_key=PEM]] [--token_file=FILE] "
      "[--data_root=DIR[,DIR...]]");
  absl::ParseCommandLine(argc, argv);

  const WorkerOptions flags = OptionsFromFlags();
  if (absl::Status s = flags.Validate(); !s.ok()) {
    spdlog::error("{}", std::string(s.message()));
    return 2;
  }
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  absl::StatusOr<tally::worker::AgentOptions> options = AgentOptionsFrom(flags, host);
  if (!options.ok()) {
    spdlog::error("{}", std::string(options.status().message()));
    return 2;
  }
  absl::StatusOr<tally::worker::TrainerRunnerOptions> runner = RunnerOptionsFrom(flags, *options);
  if (!runner.ok()) {
    spdlog::error("{}", std::string(runner.status().message()));
    return 2;
  }
  tally::train::SetCpuThreads(flags.threads);
  if (absl::Status s = tally::train::CheckDevice(options->device); !s.ok()) {
    spdlog::error("--device: {}", std::string(s.message()));
    return 2;
  }
  return RunAgent(*options, *std::move(runner));
}
