// Agent: a tally-worker's connection to tallyd. It keeps one Workers.Connect
// stream open (reconnecting with exponential backoff), says Hello with what
// it is running, heartbeats, starts a Runner per assignment (up to `slots` at
// once), relays its reports, and obeys stop orders (one that asks to keep the
// state becomes StopKind::kKeepState: the runner's evaluation and checkpoint
// reach the stream before its exit). Reports made while disconnected are
// kept, in order, and sent after the next Hello; queued progress is merged
// as Outbox describes.
//
// Credentials (credentials.h) are read again before every connection, so
// rotated files are picked up; a read that fails keeps the last good ones.
// A stream tallyd refuses as UNAUTHENTICATED or PERMISSION_DENIED is logged
// with tallyd's reason and retried like any other, but at most once per
// `refused_retry_interval`.
//
// Thread-safety: Run() blocks on the calling thread; Shutdown() may be called
// from any thread.
#ifndef TALLY_WORKER_AGENT_AGENT_H_
#define TALLY_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "tally/v1/workers.grpc.pb.h"
#include "worker/agent/credentials.h"
#include "worker/agent/outbox.h"
#include "worker/agent/runner.h"
#include "worker/train/stop.h"

namespace tally::worker {

struct AgentOptions {
  std::string controller;  // host:port of tallyd
  std::string worker_id;
  std::string device = "cpu";
  std::string gpu_type = "cpu";
  int slots = 1;
  std::vector<std::string> capabilities;
  // Multi-GPU attempts this worker leads host their c10d store here (see
  // Hello.rendezvous_port); port 0: never lead.
  std::string rendezvous_host;
  int rendezvous_port = 0;
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  // TLS and token files (re-read before every connection) and what they
  // held when the worker started (used if a re-read fails).
  CredentialFiles credential_files;
  Credentials credentials;
  // The shortest wait before trying again after tallyd refused the
  // worker's credentials.
  absl::Duration refused_retry_interval = absl::Seconds(30);
};

class Agent {
 public:
  Agent(AgentOptions options, std::unique_ptr<Runner> runner);
  ~Agent();

  // Connects and serves until Shutdown(). Returns 0 on a clean shutdown.
  int Run();
  // Stops running attempts (each reports STOPPED) and ends Run().
  void Shutdown();

 private:
  struct Attempt {
    tally::v1::Assignment assignment;
    train::StopFlag stop;
    std::thread thread;
  };
  class AttemptReporter;

  // One connection, until the stream ends; returns how it ended.
  grpc::Status Serve(tally::v1::Workers::Stub* stub, const std::string& token);
  void Enqueue(tally::v1::WorkerMessage m);
  void StartAttempt(const tally::v1::Assignment& a);
  void StopAttempt(const tally::v1::StopOrder& s);
  void ReapFinished();
  tally::v1::Hello MakeHello();

  const AgentOptions options_;
  const std::unique_ptr<Runner> runner_;
  std::atomic<bool> shutdown_{false};

  absl::Mutex mu_;
  absl::CondVar outbox_cv_;
  Outbox outbox_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<Attempt>> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Attempt>> finished_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(2);
  grpc::ClientContext* current_context_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_AGENT_H_
