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
// `refused_retry_interval`. When the refusal comes at the hello of a new
// connection (with the credential files just read again), the attempts the
// worker is running stop at once (StopKind::kNow: no further step or
// checkpoint), since tallyd no longer records what they do and may have
// given their jobs to other workers.
//
// Preemption (Preempt(): SIGTERM, SIGINT or --preemption_notice_file): the
// worker is going away within `preemption_deadline`. It tells tallyd (a
// Notice, ahead of queued reports), asks every running attempt to stop
// with StopKind::kPreempt (finish the step, checkpoint it without
// evaluating, exit PREEMPTED), answers any new assignment at once with a
// PREEMPTED exit, and keeps its stream (reconnecting as usual) so that the
// reports and exits reach tallyd. Run() returns once every attempt has
// exited and everything queued is written to the stream, or at the
// deadline: `preemption_deadline` minus a short delivery allowance (2 s,
// or a fifth of the deadline if less) after the notice, each attempt still
// running is given up (an error is logged; its exit, PREEMPTED, is queued;
// the previous checkpoint stays valid since checkpoint writes are atomic),
// and the stream has what is left of the deadline to deliver it. A given-up
// attempt's thread may still be running then (HasAbandonedAttempts()): the
// process must end with _exit() instead of destroying the agent. A notice
// still queued does not hold a disconnected, idle worker.
//
// Leaving when idle (AgentOptions::exit_when_idle > 0): once the worker has
// been connected with no attempt and nothing left to report for that long
// (counted from the Hello that went through, or from its last attempt's
// exit, whichever is later; a worker without tallyd keeps trying instead),
// it preempts itself with cause "idle" as a notice would: tallyd places
// nothing more on it, an assignment that crossed the notice is never run
// but answered PREEMPTED (or, if the stream ended first, tallyd counts it
// preempted, as for any worker gone after its notice; never FAILED), and
// Run() returns 0 once the notice is delivered. Never while an attempt runs.
//
// A StopOrder with preempt=true preempts that attempt alone (cause
// "priority"); the worker stays. Every PREEMPTED exit carries the cause this
// worker knows ("sigterm", "sigint", "notice_file", "idle", "priority"), or none
// when another rank's preemption stopped the attempt (tallyd knows that
// one).
//
// Once everything is reported after Shutdown() or a preemption, the agent
// half-closes the stream (WritesDone) and tallyd ends it, so the last
// messages are read before the stream goes; a tallyd that does not end it
// within 2 s (or by the preemption's deadline) has the call cancelled.
//
// Time comes from AgentSeams::clock: the waits between connections and
// the preemption's deadlines follow it (checked at least every 50 ms), so a
// FakeClock drives them in tests, as it does the idle timer. Heartbeats and
// the notice file's polling keep real time.
//
// Thread-safety: Run() blocks on the calling thread; Shutdown() and
// Preempt() may be called from any thread.
#ifndef TALLY_WORKER_AGENT_AGENT_H_
#define TALLY_WORKER_AGENT_AGENT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "tally/v1/workers.grpc.pb.h"
#include "worker/agent/backoff.h"
#include "worker/agent/connector.h"
#include "worker/agent/credentials.h"
#include "worker/agent/log_capture.h"
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
  // Waits between connections (Backoff): drawn below `initial_backoff`,
  // doubling up to `max_backoff`, from `initial_backoff` again after a
  // connection that lasted more than 10 s.
  absl::Duration initial_backoff = absl::Milliseconds(200);
  absl::Duration max_backoff = absl::Seconds(5);
  // TLS and token files (re-read before every connection) and what they
  // held when the worker started (used if a re-read fails).
  CredentialFiles credential_files;
  Credentials credentials;
  // The shortest wait before trying again after tallyd refused the
  // worker's credentials.
  absl::Duration refused_retry_interval = absl::Seconds(30);
  // "spot" or "on_demand", announced in Hello.capacity.
  std::string capacity = "on_demand";
  // From a preemption notice to Run()'s return, everything included; keep
  // it below Kubernetes' terminationGracePeriodSeconds (SIGKILL).
  absl::Duration preemption_deadline = absl::Seconds(25);
  // A file whose appearance means a preemption notice (a node agent or the
  // cloud's metadata poller creates it); empty: none. Checked with stat()
  // every `notice_poll_interval` while Run() runs.
  std::string preemption_notice_file;
  absl::Duration notice_poll_interval = absl::Milliseconds(200);
  // Leave (Run() returns 0) after this long connected with no attempt; the
  // worker tells tallyd first (a Notice with cause "idle"). Zero: never.
  absl::Duration exit_when_idle = absl::ZeroDuration();
  // Send what each attempt logs (log_capture.h) to tallyd as LogBatch
  // reports, ahead of the attempt's other reports and its exit.
  bool capture_logs = true;
};

// What the agent takes from outside besides its options; tests pass fakes.
struct AgentSeams {
  // Not owned; must outlive the agent. Null: the real clock.
  const Clock* clock = nullptr;
  // Null: a GrpcConnector to AgentOptions::controller.
  std::unique_ptr<Connector> connector;
  // The backoff's jitter; none: seeded from std::random_device.
  std::optional<uint32_t> backoff_seed;
};

class Agent {
 public:
  Agent(AgentOptions options, std::unique_ptr<Runner> runner, AgentSeams seams = {});
  ~Agent();

  // Connects and serves until Shutdown(), or until a preemption is over
  // (see above). Returns 0 on a clean shutdown or preemption.
  int Run();
  // Stops running attempts (each reports STOPPED) and ends Run().
  void Shutdown();
  // The worker is going away (see above); `cause` is the Notice's and the
  // PREEMPTED exits' preemption_cause. Idempotent: the first call wins.
  // Ignored after Shutdown().
  void Preempt(const std::string& cause);
  // True once the worker left because it was idle (exit_when_idle).
  bool LeftIdle();
  // True when a preemption's deadline passed with attempts still running:
  // their threads may still be busy, so destroying the agent (which joins
  // them) could block past the deadline.
  bool HasAbandonedAttempts();
  // Messages queued for tallyd: not written yet, or written and not
  // acknowledged by a tallyd that acknowledges.
  size_t QueuedReports();

  // How far the agent's loops have got, counted from construction: for
  // tests, which wait for a count to move instead of sleeping. Each count
  // moves under the agent's lock once what it counts is done, so a count
  // that moves after some event shows that the agent has been there since
  // (for the looks, that it looked at its state and left it be). Where the
  // look itself happens before the lock is taken (the clock between
  // connections, the notice file), a move of 2 is needed to be sure the
  // look came after the event. Nothing in the agent reads them; they change
  // nothing it does.
  struct Counters {
    // Hellos written: the worker is connected and its idle timer runs.
    uint64_t num_hellos = 0;
    // Connections over (however they ended) after which Run() went on.
    uint64_t num_connections_ended = 0;
    // The stream writer's choices of what to write next: a report, or a
    // heartbeat when there is none it may write.
    uint64_t num_writes_chosen = 0;
    // Looks at the clock, while waiting between connections, that found
    // the wait not over.
    uint64_t num_backoff_checks = 0;
    // Looks at the clock, while a preemption waits for its attempts and
    // reports, that found its deadline not reached.
    uint64_t num_deadline_checks = 0;
    // The idle watcher's looks that found the worker busy, disconnected or
    // not idle for long enough.
    uint64_t num_idle_checks = 0;
    // Looks for the preemption notice file that did not find it.
    uint64_t num_notice_checks = 0;
  };
  Counters counters();

 private:
  struct Attempt {
    tally::v1::Assignment assignment;
    train::StopFlag stop;
    std::thread thread;
    // Why this worker preempted it (empty: it did not); guarded by mu_.
    std::string preemption_cause;
    // Given up at the preemption's deadline, its exit queued for it: what
    // it reports later is dropped. Guarded by mu_.
    bool abandoned = false;
  };
  class AttemptReporter;
  // tallyd refused this worker's credential (UNAUTHENTICATED or
  // PERMISSION_DENIED) at the hello of a connection made with credentials
  // read just before: every running attempt stops at once (StopKind::kNow,
  // no checkpoint), saying why in the log. (A live stream ended that way,
  // e.g. by a certificate that expired while renewed files wait on disk,
  // is only reconnected.)
  void StopRefusedAttempts(const grpc::Status& status);

  using Stream =
      grpc::ClientReaderWriterInterface<tally::v1::WorkerMessage, tally::v1::ControllerMessage>;
  // What one stream's reader and writer share; guarded by mu_.
  struct StreamState {
    bool done = false;           // the read side ended
    bool writer_exited = false;
    bool welcomed = false;       // tallyd took the Hello: reports may go
    // The Welcome said tallyd acknowledges reports: each stays queued until
    // its Ack, numbered as written.
    bool acks = false;
    uint64_t written = 0;        // numbered reports written on this stream
  };

  // One connection, until the stream ends; returns how it ended, and in
  // `welcomed` whether tallyd had taken its Hello.
  grpc::Status Serve(tally::v1::Workers::StubInterface* stub, const std::string& token,
                     bool* welcomed);
  // The stream's writer (its own thread): queued reports once welcomed,
  // heartbeats between them, and the end of our side once everything is
  // written while the worker leaves.
  void WriteReports(StreamState* st, Stream* stream, grpc::ClientContext* context);
  // Waits with mu_ held until `cond` holds (true) or `deadline` on clock_
  // passes (false unless `cond` holds by then). Each look at the clock
  // that finds the deadline ahead adds one to `*num_checks` (if given).
  bool AwaitUntil(const absl::Condition& cond, absl::Time deadline,
                  uint64_t* num_checks = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A report of `a`'s, dropped once `a` is abandoned.
  void EnqueueReport(Attempt* a, tally::v1::WorkerMessage m);
  // What attempts printed since the last call (LogCapture), into the outbox.
  void FlushLogsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the attempts to exit and the stream to take their reports,
  // gives up on them at the deadline, and ends Run() (its own thread).
  void Drain(absl::Time deadline);
  // A Notice with the time left before the deadline.
  tally::v1::WorkerMessage NoticeMessage() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // No attempt left but abandoned ones, and nothing queued that tallyd must
  // get (a notice alone does not count while disconnected).
  bool Delivered() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchNoticeFile(std::atomic<bool>* stop);
  // Preempts the worker with cause "idle" once it has been connected with
  // no attempt for exit_when_idle; returns then, or when `stop` is set.
  void WatchIdle(std::atomic<bool>* stop);
  void PreemptLocked(const std::string& cause) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartAttempt(const tally::v1::Assignment& a);
  void StopAttempt(const tally::v1::StopOrder& s);
  void ReapFinished();
  tally::v1::Hello MakeHello();

  const AgentOptions options_;
  const std::unique_ptr<Runner> runner_;
  const RealClock real_clock_;
  const Clock* const clock_;
  const std::unique_ptr<Connector> connector_;
  const uint32_t backoff_seed_;
  std::atomic<bool> shutdown_{false};

  absl::Mutex mu_;
  absl::CondVar outbox_cv_;
  Outbox outbox_ ABSL_GUARDED_BY(mu_);
  LogCapture log_capture_;  // thread-safe on its own
  std::map<std::string, std::unique_ptr<Attempt>> running_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Attempt>> finished_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(2);
  grpc::ClientContext* current_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool connected_ ABSL_GUARDED_BY(mu_) = false;  // the Hello went through
  // Set by the first Preempt(): its cause (empty: none) and deadline.
  std::string preemption_cause_ ABSL_GUARDED_BY(mu_);
  absl::Time preemption_deadline_ ABSL_GUARDED_BY(mu_);
  bool preemption_over_ ABSL_GUARDED_BY(mu_) = false;
  // Since when the connected worker has had no attempt (the Hello, or the
  // last attempt's exit); InfiniteFuture while one runs.
  absl::Time idle_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread drain_thread_;  // started by the first Preempt()
  Counters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_AGENT_H_
