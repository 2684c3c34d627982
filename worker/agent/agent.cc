#include "worker/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace tally::worker {

using tally::v1::WorkerMessage;

class Agent::AttemptReporter final : public Reporter {
 public:
  AttemptReporter(Agent* agent, Attempt* attempt) : agent_(agent), attempt_(attempt) {}
  void Progress(const tally::v1::Progress& p) override {
    WorkerMessage m;
    *m.mutable_progress() = p;
    agent_->EnqueueReport(attempt_, std::move(m));
  }
  void Eval(const tally::v1::EvalResult& e) override {
    WorkerMessage m;
    *m.mutable_eval() = e;
    agent_->EnqueueReport(attempt_, std::move(m));
  }
  void Checkpoint(const tally::v1::CheckpointRecord& c) override {
    WorkerMessage m;
    *m.mutable_checkpoint() = c;
    agent_->EnqueueReport(attempt_, std::move(m));
  }

 private:
  Agent* agent_;
  Attempt* attempt_;
};

namespace {

// One entry per rank: a worker with several slots may run several ranks of
// one attempt.
std::string Key(const std::string& job, int32_t attempt, int32_t rank) {
  return absl::StrCat(job, "#", attempt, "#", rank);
}

// The longest the agent waits without looking at its clock again, so that
// a deadline on a clock other than the real one is noticed.
constexpr absl::Duration kClockPoll = absl::Milliseconds(50);

bool Refused(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         s.error_code() == grpc::StatusCode::PERMISSION_DENIED;
}

WorkerMessage PreemptedExit(const std::string& job, int32_t attempt, int32_t rank,
                            const std::string& cause, const std::string& reason) {
  WorkerMessage m;
  auto* exit = m.mutable_exit();
  exit->set_job(job);
  exit->set_attempt(attempt);
  exit->set_rank(rank);
  exit->set_outcome(tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
  exit->set_retryable(true);
  exit->set_preemption_cause(cause);
  exit->set_reason(reason);
  return m;
}

}  // namespace

Agent::Agent(AgentOptions options, std::unique_ptr<Runner> runner, AgentSeams seams)
    : options_(std::move(options)),
      runner_(std::move(runner)),
      clock_(seams.clock != nullptr ? seams.clock : &real_clock_),
      connector_(seams.connector != nullptr ? std::move(seams.connector)
                                            : std::make_unique<GrpcConnector>(options_.controller)),
      backoff_seed_(seams.backoff_seed.has_value() ? *seams.backoff_seed
                                                   : std::random_device{}()) {
  InstallAttemptLogSink();
}

bool Agent::AwaitUntil(const absl::Condition& cond, absl::Time deadline, uint64_t* num_checks) {
  while (true) {
    const absl::Duration left = deadline - clock_->Now();
    if (left <= absl::ZeroDuration()) return cond.Eval();
    if (num_checks != nullptr) ++*num_checks;
    if (mu_.AwaitWithTimeout(cond, std::min(left, kClockPoll))) return true;
  }
}

Agent::~Agent() {
  Shutdown();
  if (drain_thread_.joinable()) drain_thread_.join();
  std::vector<std::unique_ptr<Attempt>> all;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [k, a] : running_) all.push_back(std::move(a));
    running_.clear();
    for (auto& a : finished_) all.push_back(std::move(a));
    finished_.clear();
  }
  for (auto& a : all) {
    if (a->thread.joinable()) a->thread.join();
  }
}

void Agent::EnqueueReport(Attempt* a, WorkerMessage m) {
  absl::MutexLock lock(&mu_);
  // Its exit is queued already: tallyd takes nothing of an attempt after it.
  if (a->abandoned) return;
  FlushLogsLocked();  // what it printed goes ahead of what it reports
  outbox_.Push(std::move(m));
  outbox_cv_.Signal();
}

void Agent::FlushLogsLocked() {
  for (tally::v1::LogBatch& b : log_capture_.TakeBatches()) {
    WorkerMessage m;
    *m.mutable_logs() = std::move(b);
    outbox_.Push(std::move(m));
  }
}

tally::v1::Hello Agent::MakeHello() {
  tally::v1::Hello h;
  h.set_worker_id(options_.worker_id);
  h.set_device(options_.device);
  h.set_gpu_type(options_.gpu_type);
  h.set_slots(options_.slots);
  for (const auto& c : options_.capabilities) h.add_capabilities(c);
  h.set_version("tally-worker 0.1");
  h.set_rendezvous_host(options_.rendezvous_host);
  h.set_rendezvous_port(options_.rendezvous_port);
  h.set_capacity(options_.capacity);
  absl::MutexLock lock(&mu_);
  for (const auto& [key, a] : running_) {
    if (a->abandoned) continue;  // its exit is queued: listed below
    auto* r = h.add_running();
    r->set_job(a->assignment.job());
    r->set_attempt(a->assignment.attempt());
  }
  // An attempt whose exit is not delivered yet still counts as running, so
  // tallyd waits for the exit instead of declaring the attempt lost.
  for (const auto& m : outbox_.messages()) {
    if (!m.has_exit()) continue;
    auto* r = h.add_running();
    r->set_job(m.exit().job());
    r->set_attempt(m.exit().attempt());
  }
  return h;
}

void Agent::StartAttempt(const tally::v1::Assignment& assignment) {
  const std::string key = Key(assignment.job(), assignment.attempt(), assignment.rank());
  absl::MutexLock lock(&mu_);
  if (running_.count(key)) return;  // a repeated assignment
  if (!preemption_cause_.empty() && !shutdown_.load()) {
    // Not a failure: it must not count against the job's max_attempts.
    spdlog::info("attempt {} of {}: refused, the worker is going away ({})",
                 assignment.attempt(), assignment.job(), preemption_cause_);
    outbox_.Push(PreemptedExit(assignment.job(), assignment.attempt(), assignment.rank(),
                               preemption_cause_,
                               absl::StrCat("worker is going away (", preemption_cause_, ")")));
    outbox_cv_.Signal();
    return;
  }
  if (static_cast<int>(running_.size()) >= options_.slots || shutdown_.load()) {
    WorkerMessage m;
    auto* exit = m.mutable_exit();
    exit->set_job(assignment.job());
    exit->set_attempt(assignment.attempt());
    exit->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
    exit->set_retryable(true);
    exit->set_not_started(true);  // nothing ran: tallyd does not count it
    exit->set_rank(assignment.rank());
    exit->set_reason(shutdown_.load() ? "worker is shutting down"
                                      : "worker has no free slot");
    outbox_.Push(std::move(m));
    outbox_cv_.Signal();
    return;
  }
  spdlog::info("attempt {} of {}: starting (rank {}/{})", assignment.attempt(),
               assignment.job(), assignment.rank(), assignment.world_size());
  idle_since_ = absl::InfiniteFuture();
  auto attempt = std::make_unique<Attempt>();
  attempt->assignment = assignment;
  Attempt* raw = attempt.get();
  running_[key] = std::move(attempt);
  raw->thread = std::thread([this, raw, key] {
    // What this thread logs is the attempt's output (log_capture.h).
    std::optional<AttemptLogScope> log_scope;
    if (options_.capture_logs) {
      log_scope.emplace(&log_capture_,
                        AttemptLogKey{raw->assignment.job(), raw->assignment.attempt(),
                                      raw->assignment.rank()},
                        "worker");
    }
    spdlog::info("attempt {} of {}: started on worker {} (rank {}/{})", raw->assignment.attempt(),
                 raw->assignment.job(), options_.worker_id, raw->assignment.rank(),
                 raw->assignment.world_size());
    if (log_scope) log_scope->set_source("trainer");
    AttemptReporter reporter(this, raw);
    tally::v1::AttemptExit exit = runner_->Run(raw->assignment, &reporter, &raw->stop);
    if (log_scope) log_scope->set_source("worker");
    exit.set_rank(raw->assignment.rank());
    absl::MutexLock lock(&mu_);
    // The cause this worker knows; none when another rank was preempted
    // (tallyd knows why).
    if (exit.outcome() == tally::v1::ATTEMPT_OUTCOME_PREEMPTED) {
      exit.set_preemption_cause(raw->preemption_cause);
    }
    if (raw->abandoned) {
      spdlog::warn("attempt {} of {}: {} after the preemption's deadline ({}); its exit was "
                   "already sent", exit.attempt(), exit.job(),
                   tally::v1::AttemptOutcome_Name(exit.outcome()), exit.reason());
    } else {
      spdlog::info("attempt {} of {}: {} ({}){}", exit.attempt(), exit.job(),
                   tally::v1::AttemptOutcome_Name(exit.outcome()), exit.reason(),
                   exit.preemption_cause().empty()
                       ? ""
                       : absl::StrCat(", cause ", exit.preemption_cause()));
      FlushLogsLocked();  // the attempt's last lines go before its exit
      WorkerMessage m;
      *m.mutable_exit() = exit;
      outbox_.Push(std::move(m));
      outbox_cv_.Signal();
    }
    auto it = running_.find(key);
    if (it != running_.end()) {
      finished_.push_back(std::move(it->second));
      running_.erase(it);
    }
    if (running_.empty()) idle_since_ = clock_->Now();
  });
}

void Agent::StopAttempt(const tally::v1::StopOrder& stop) {
  absl::MutexLock lock(&mu_);
  std::vector<Attempt*> ranks;
  for (auto& [key, a] : running_) {
    if (a->assignment.job() == stop.job() && a->assignment.attempt() == stop.attempt()) {
      ranks.push_back(a.get());
    }
  }
  if (ranks.empty()) {
    // Not running here (finished, or never started): say so, so tallyd frees
    // whatever it thinks is held (a preemption as one, so it is requeued).
    WorkerMessage m;
    if (stop.preempt()) {
      m = PreemptedExit(stop.job(), stop.attempt(), 0, "priority", "not running here");
    }
    auto* exit = m.mutable_exit();
    exit->set_job(stop.job());
    exit->set_attempt(stop.attempt());
    if (!stop.preempt()) exit->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
    exit->set_reason("not running here");
    bool pending = false;
    for (const auto& o : outbox_.messages()) {
      pending |= o.has_exit() && o.exit().job() == stop.job() &&
                 o.exit().attempt() == stop.attempt();
    }
    if (!pending) {
      outbox_.Push(std::move(m));
      outbox_cv_.Signal();
    }
    return;
  }
  spdlog::info("attempt {} of {}: stop ordered{} ({})", stop.attempt(), stop.job(),
               stop.preempt()      ? ", preempted for a higher-priority job"
               : stop.checkpoint() ? ", keeping the state"
                                   : "",
               stop.reason());
  for (Attempt* a : ranks) {
    if (stop.preempt()) {
      if (a->preemption_cause.empty()) a->preemption_cause = "priority";
      a->stop.Request(train::StopKind::kPreempt);
    } else {
      a->stop.Request(stop.checkpoint() ? train::StopKind::kKeepState : train::StopKind::kNow);
    }
  }
}

void Agent::ReapFinished() {
  std::vector<std::unique_ptr<Attempt>> done;
  {
    absl::MutexLock lock(&mu_);
    done.swap(finished_);
  }
  for (auto& a : done) {
    if (a->thread.joinable()) a->thread.join();
  }
}

void Agent::WriteReports(StreamState* st, Stream* stream, grpc::ClientContext* context) {
  absl::MutexLock lock(&mu_);
  while (!st->done) {
    FlushLogsLocked();
    if (!outbox_.HasUnwritten() || !st->welcomed) {
      const bool draining = shutdown_.load() || !preemption_cause_.empty();
      if (!outbox_.HasUnwritten() && draining &&
          std::all_of(running_.begin(), running_.end(),
                      [](const auto& kv) { return kv.second->abandoned; })) {
        // All written: end our side, so that tallyd reads everything
        // written before it ends the stream (cancelling the call could
        // drop messages still in flight) and acknowledges it first. One
        // that does not end it soon is cancelled; what it did not
        // acknowledge is sent again on the next stream.
        absl::Time give_up = clock_->Now() + absl::Seconds(2);
        if (!preemption_cause_.empty()) give_up = std::min(give_up, preemption_deadline_);
        mu_.Unlock();
        stream->WritesDone();
        mu_.Lock();
        if (!AwaitUntil(absl::Condition(&st->done), give_up)) context->TryCancel();
        break;
      }
      outbox_cv_.WaitWithTimeout(&mu_, heartbeat_interval_);
      if (st->done) break;
    }
    WorkerMessage m;
    const bool from_outbox = st->welcomed && outbox_.HasUnwritten();
    if (from_outbox) {
      m = outbox_.TakeNext(st->acks ? ++st->written : 0);
    } else {
      m.mutable_heartbeat();
    }
    ++counters_.num_writes_chosen;
    mu_.Unlock();
    const bool ok = stream->Write(m);
    mu_.Lock();
    if (!ok) break;
    if (from_outbox && !st->acks) outbox_.DropWritten();
  }
  st->writer_exited = true;
}

grpc::Status Agent::Serve(tally::v1::Workers::StubInterface* stub, const std::string& token,
                          bool* welcomed) {
  *welcomed = false;
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  auto stream = stub->Connect(&context);
  bool over = false;
  {
    // From here a preemption's deadline can cancel the call.
    absl::MutexLock lock(&mu_);
    over = preemption_over_;
    if (!over) current_context_ = &context;
  }
  if (over) {
    context.TryCancel();
    return stream->Finish();
  }
  WorkerMessage hello;
  *hello.mutable_hello() = MakeHello();
  if (!stream->Write(hello)) {
    {
      absl::MutexLock lock(&mu_);
      current_context_ = nullptr;
    }
    grpc::Status s = stream->Finish();
    if (!Refused(s)) {
      spdlog::warn("cannot reach tallyd at {}: {}", options_.controller, s.error_message());
    }
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    connected_ = true;
    ++counters_.num_hellos;
    // Nothing is written on this stream yet: what the last one wrote and
    // tallyd did not acknowledge goes again, first.
    outbox_.Rewind();
    if (running_.empty()) idle_since_ = clock_->Now();
    // Going away: this connection's tallyd hears it first, with the time
    // left (it may not have heard the notice sent on an earlier one).
    if (!preemption_cause_.empty()) outbox_.ReplaceNotice(NoticeMessage());
  }
  // Reports wait for tallyd's Welcome: a Write that succeeds only says the
  // bytes left, and a tallyd that refuses the stream after reading the Hello
  // (a standby, a refused worker) never reads what follows it, so the queue
  // is kept until a tallyd that took the Hello is on the other end.
  StreamState st;  // guarded by mu_
  std::thread writer([&] { WriteReports(&st, stream.get(), &context); });

  spdlog::info("connected to tallyd at {} as {} ({})", options_.controller,
               options_.worker_id, options_.credential_files.Describe());
  tally::v1::ControllerMessage msg;
  while (stream->Read(&msg)) {
    switch (msg.msg_case()) {
      case tally::v1::ControllerMessage::kWelcome: {
        absl::MutexLock lock(&mu_);
        const double s = msg.welcome().heartbeat_interval_seconds();
        if (s > 0) heartbeat_interval_ = absl::Seconds(s);
        st.welcomed = true;
        st.acks = msg.welcome().acks();
        outbox_cv_.SignalAll();
        break;
      }
      case tally::v1::ControllerMessage::kAck: {
        absl::MutexLock lock(&mu_);
        if (st.acks) outbox_.Ack(msg.ack().seq());
        outbox_cv_.SignalAll();
        break;
      }
      case tally::v1::ControllerMessage::kAssignment:
        StartAttempt(msg.assignment());
        break;
      case tally::v1::ControllerMessage::kStop:
        StopAttempt(msg.stop());
        break;
      default:
        break;
    }
    ReapFinished();
  }
  {
    absl::MutexLock lock(&mu_);
    st.done = true;
    current_context_ = nullptr;
    connected_ = false;
    outbox_cv_.SignalAll();
  }
  // The writer sees `done` at once unless a Write is blocked; only then is
  // the call cancelled, since a cancelled call reports CANCELLED instead of
  // tallyd's status (which says, for one, why it refused this worker).
  mu_.Lock();
  const bool writer_stopped =
      AwaitUntil(absl::Condition(&st.writer_exited), clock_->Now() + absl::Seconds(2));
  mu_.Unlock();
  if (!writer_stopped) context.TryCancel();
  writer.join();
  grpc::Status s = stream->Finish();
  bool leaving = false;
  {
    absl::MutexLock lock(&mu_);
    leaving = !preemption_cause_.empty();
    *welcomed = st.welcomed;
  }
  if (!shutdown_.load() && !leaving && !Refused(s)) {
    spdlog::warn("stream to tallyd ended: {} {}", static_cast<int>(s.error_code()),
                 s.error_message());
  }
  return s;
}

int Agent::Run() {
  Backoff backoff(options_.initial_backoff, options_.max_backoff, backoff_seed_);
  int tries_after_shutdown = 0;
  Credentials credentials = options_.credentials;
  bool first = true;
  std::atomic<bool> stop_watching{false};
  std::thread watcher;
  if (!options_.preemption_notice_file.empty()) {
    watcher = std::thread([this, &stop_watching] { WatchNoticeFile(&stop_watching); });
  }
  std::thread idle_watcher;
  if (options_.exit_when_idle > absl::ZeroDuration()) {
    idle_watcher = std::thread([this, &stop_watching] { WatchIdle(&stop_watching); });
  }
  while (true) {
    const absl::Time start = clock_->Now();
    // Read again, so certificates and tokens rotated on disk are used.
    if (!first) {
      absl::StatusOr<Credentials> reread = LoadCredentials(options_.credential_files);
      if (reread.ok()) {
        credentials = *std::move(reread);
      } else {
        spdlog::error("{}; connecting with the credentials read before",
                      std::string(reread.status().message()));
      }
    }
    first = false;
    // A new stub (a GrpcConnector: a new channel) for every connection.
    std::unique_ptr<tally::v1::Workers::StubInterface> stub = connector_->Connect(credentials);
    bool welcomed = false;
    const grpc::Status status = Serve(stub.get(), credentials.token, &welcomed);
    const bool refused = Refused(status);
    if (refused) {
      // tallyd's message says what to fix; the files are read again first.
      spdlog::error(
          "tallyd at {} refused worker {} ({}; connecting with {}): {} -- trying again in {}",
          options_.controller, options_.worker_id,
          status.error_code() == grpc::StatusCode::UNAUTHENTICATED ? "UNAUTHENTICATED"
                                                                   : "PERMISSION_DENIED",
          options_.credential_files.Describe(), status.error_message(),
          absl::FormatDuration(options_.refused_retry_interval));
      if (!welcomed) StopRefusedAttempts(status);
    }
    ReapFinished();
    {
      absl::MutexLock lock(&mu_);
      if (preemption_over_ || (!preemption_cause_.empty() && Delivered())) break;
      if (shutdown_.load() && running_.empty() &&
          (outbox_.empty() || refused || ++tries_after_shutdown > 3)) {
        break;
      }
      ++counters_.num_connections_ended;
    }
    // Jittered, so a fleet that lost tallyd does not return in lockstep.
    absl::Duration wait = backoff.Next(clock_->Now() - start);
    if (refused) wait = std::max(wait, options_.refused_retry_interval);
    const absl::Time until = clock_->Now() + wait;
    bool give_up = false;
    while (clock_->Now() < until && !(shutdown_.load() && tries_after_shutdown > 3)) {
      {
        absl::MutexLock lock(&mu_);
        if (preemption_over_) {
          give_up = true;
          break;
        }
        ++counters_.num_backoff_checks;
      }
      if (refused && shutdown_.load()) {
        // Shutting down while refused: once the attempts have stopped there
        // is nothing a retry within the interval could deliver.
        ReapFinished();
        absl::MutexLock lock(&mu_);
        if (running_.empty()) {
          if (!outbox_.empty()) {
            spdlog::warn("shutting down with {} reports tallyd did not receive (it refused "
                         "this worker)", outbox_.messages().size());
          }
          give_up = true;
          break;
        }
      }
      absl::SleepFor(std::min(until - clock_->Now(), kClockPoll));
    }
    if (give_up) break;
  }
  stop_watching = true;
  if (watcher.joinable()) watcher.join();
  if (idle_watcher.joinable()) idle_watcher.join();
  ReapFinished();
  return 0;
}

void Agent::StopRefusedAttempts(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  for (auto& [key, a] : running_) {
    if (a->stop.requested() == train::StopKind::kNow) continue;
    // tallyd no longer accepts this worker's reports, so it has given the
    // job up (or will): another worker may be running it now, and every
    // step or checkpoint from here is work nobody records.
    spdlog::error("stopping attempt {} of {} at once, without a checkpoint: tallyd refused this "
                  "worker's credential ({})",
                  a->assignment.attempt(), a->assignment.job(), status.error_message());
    a->stop.Request(train::StopKind::kNow);
  }
}

void Agent::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutdown_.exchange(true)) return;
  for (auto& [key, a] : running_) a->stop.Request(train::StopKind::kNow);
  outbox_cv_.SignalAll();
}

WorkerMessage Agent::NoticeMessage() {
  WorkerMessage m;
  m.mutable_notice()->set_cause(preemption_cause_);
  m.mutable_notice()->set_deadline_seconds(
      std::max(0.0, absl::ToDoubleSeconds(preemption_deadline_ - clock_->Now())));
  return m;
}

void Agent::Preempt(const std::string& cause) {
  absl::MutexLock lock(&mu_);
  PreemptLocked(cause);
}

void Agent::PreemptLocked(const std::string& cause) {
  if (!preemption_cause_.empty() || shutdown_.load()) return;  // the first call wins
  preemption_cause_ = cause.empty() ? "unknown" : cause;
  preemption_deadline_ = clock_->Now() + options_.preemption_deadline;
  spdlog::warn("tally-worker: going away ({}): checkpointing {} running attempt(s) within {}",
               preemption_cause_, running_.size(),
               absl::FormatDuration(options_.preemption_deadline));
  outbox_.PushUrgent(NoticeMessage());
  for (auto& [key, a] : running_) {
    if (a->preemption_cause.empty()) a->preemption_cause = preemption_cause_;
    a->stop.Request(train::StopKind::kPreempt);
  }
  outbox_cv_.SignalAll();
  drain_thread_ = std::thread([this, deadline = preemption_deadline_] { Drain(deadline); });
}

bool Agent::Delivered() const {
  for (const auto& [key, a] : running_) {
    if (!a->abandoned) return false;
  }
  if (connected_) return outbox_.empty();
  // Disconnected: only reports hold the worker, not a notice (an idle
  // worker with no tallyd to tell leaves at once).
  return std::all_of(outbox_.messages().begin(), outbox_.messages().end(),
                     [](const WorkerMessage& m) { return m.has_notice(); });
}

void Agent::Drain(absl::Time deadline) {
  // The stream's allowance to deliver the exits queued at the deadline.
  const absl::Duration delivery = std::min(absl::Seconds(2), options_.preemption_deadline / 5);
  absl::MutexLock lock(&mu_);
  if (!AwaitUntil(absl::Condition(this, &Agent::Delivered), deadline - delivery,
                  &counters_.num_deadline_checks)) {
    for (auto& [key, a] : running_) {
      if (a->abandoned) continue;
      const tally::v1::Assignment& as = a->assignment;
      spdlog::error("attempt {} of {} (rank {}): its preemption checkpoint did not finish within "
                    "the {} deadline; the previous checkpoint stays valid (checkpoints are "
                    "written to a temporary file and renamed, never half-written)",
                    as.attempt(), as.job(), as.rank(),
                    absl::FormatDuration(options_.preemption_deadline));
      const std::string cause =
          a->preemption_cause.empty() ? preemption_cause_ : a->preemption_cause;
      outbox_.Push(PreemptedExit(
          as.job(), as.attempt(), as.rank(), cause,
          absl::StrCat("preemption checkpoint did not finish within the ",
                       absl::FormatDuration(options_.preemption_deadline),
                       " deadline; the previous checkpoint stays valid (", cause, ")")));
      a->abandoned = true;
    }
    outbox_cv_.SignalAll();
    if (!AwaitUntil(absl::Condition(this, &Agent::Delivered), deadline,
                    &counters_.num_deadline_checks)) {
      spdlog::error("tally-worker: {} message(s) not delivered to tallyd by the preemption's "
                    "deadline", outbox_.size());
      // Time is up: end the stream now, whatever it is doing.
      if (current_context_ != nullptr) current_context_->TryCancel();
    }
  }
  // Everything is written (or time is up): the writer ends the stream and
  // Run() returns.
  preemption_over_ = true;
  outbox_cv_.SignalAll();
}

void Agent::WatchIdle(std::atomic<bool>* stop) {
  while (!stop->load()) {
    {
      absl::MutexLock lock(&mu_);
      if (!preemption_cause_.empty() || shutdown_.load()) return;
      // Decided under the lock an assignment takes to start: once the notice
      // is queued, one that arrives is answered PREEMPTED, never run.
      if (connected_ && running_.empty() && outbox_.empty() &&
          clock_->Now() - idle_since_ >= options_.exit_when_idle) {
        spdlog::info("tally-worker: no assignment for {} (--exit_when_idle): leaving",
                     absl::FormatDuration(clock_->Now() - idle_since_));
        PreemptLocked("idle");
        return;
      }
      ++counters_.num_idle_checks;
    }
    absl::SleepFor(kClockPoll);
  }
}

bool Agent::LeftIdle() {
  absl::MutexLock lock(&mu_);
  return preemption_cause_ == "idle";
}

size_t Agent::QueuedReports() {
  absl::MutexLock lock(&mu_);
  return outbox_.size();
}

Agent::Counters Agent::counters() {
  absl::MutexLock lock(&mu_);
  return counters_;
}

bool Agent::HasAbandonedAttempts() {
  absl::MutexLock lock(&mu_);
  for (const auto& [key, a] : running_) {
    if (a->abandoned) return true;
  }
  return false;
}

void Agent::WatchNoticeFile(std::atomic<bool>* stop) {
  spdlog::info("tally-worker: watching for a preemption notice at {}",
               options_.preemption_notice_file);
  while (!stop->load()) {
    struct stat st;
    if (::stat(options_.preemption_notice_file.c_str(), &st) == 0) {
      spdlog::warn("tally-worker: preemption notice file {} appeared",
                   options_.preemption_notice_file);
      Preempt("notice_file");
      return;
    }
    {
      absl::MutexLock lock(&mu_);
      ++counters_.num_notice_checks;
    }
    absl::SleepFor(options_.notice_poll_interval);
  }
}

}  // namespace tally::worker
