#include "worker/agent/agent.h"

#include <grpcpp/grpcpp.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace tally::worker {

using tally::v1::WorkerMessage;

class Agent::AttemptReporter final : public Reporter {
 public:
  explicit AttemptReporter(Agent* agent) : agent_(agent) {}
  void Progress(const tally::v1::Progress& p) override {
    WorkerMessage m;
    *m.mutable_progress() = p;
    agent_->Enqueue(std::move(m));
  }
  void Eval(const tally::v1::EvalResult& e) override {
    WorkerMessage m;
    *m.mutable_eval() = e;
    agent_->Enqueue(std::move(m));
  }
  void Checkpoint(const tally::v1::CheckpointRecord& c) override {
    WorkerMessage m;
    *m.mutable_checkpoint() = c;
    agent_->Enqueue(std::move(m));
  }

 private:
  Agent* agent_;
};

namespace {

// One entry per rank: a worker with several slots may run several ranks of
// one attempt.
std::string Key(const std::string& job, int32_t attempt, int32_t rank) {
  return absl::StrCat(job, "#", attempt, "#", rank);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const Credentials& c) {
  if (c.ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = c.ca_pem;
  ssl.pem_private_key = c.key_pem;
  ssl.pem_cert_chain = c.cert_pem;
  return grpc::SslCredentials(ssl);
}

bool Refused(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         s.error_code() == grpc::StatusCode::PERMISSION_DENIED;
}

}  // namespace

Agent::Agent(AgentOptions options, std::unique_ptr<Runner> runner)
    : options_(std::move(options)), runner_(std::move(runner)) {}

Agent::~Agent() {
  Shutdown();
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

void Agent::Enqueue(WorkerMessage m) {
  absl::MutexLock lock(&mu_);
  outbox_.Push(std::move(m));
  outbox_cv_.Signal();
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
  absl::MutexLock lock(&mu_);
  for (const auto& [key, a] : running_) {
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
  if (static_cast<int>(running_.size()) >= options_.slots || shutdown_.load()) {
    WorkerMessage m;
    auto* exit = m.mutable_exit();
    exit->set_job(assignment.job());
    exit->set_attempt(assignment.attempt());
    exit->set_outcome(tally::v1::ATTEMPT_OUTCOME_FAILED);
    exit->set_retryable(true);
    exit->set_reason(shutdown_.load() ? "worker is shutting down"
                                      : "worker has no free slot");
    outbox_.Push(std::move(m));
    outbox_cv_.Signal();
    return;
  }
  spdlog::info("attempt {} of {}: starting (rank {}/{})", assignment.attempt(),
               assignment.job(), assignment.rank(), assignment.world_size());
  auto attempt = std::make_unique<Attempt>();
  attempt->assignment = assignment;
  Attempt* raw = attempt.get();
  running_[key] = std::move(attempt);
  raw->thread = std::thread([this, raw, key] {
    AttemptReporter reporter(this);
    tally::v1::AttemptExit exit = runner_->Run(raw->assignment, &reporter, &raw->stop);
    exit.set_rank(raw->assignment.rank());
    spdlog::info("attempt {} of {}: {} ({})", exit.attempt(), exit.job(),
                 tally::v1::AttemptOutcome_Name(exit.outcome()), exit.reason());
    WorkerMessage m;
    *m.mutable_exit() = exit;
    absl::MutexLock lock(&mu_);
    outbox_.Push(std::move(m));
    outbox_cv_.Signal();
    auto it = running_.find(key);
    if (it != running_.end()) {
      finished_.push_back(std::move(it->second));
      running_.erase(it);
    }
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
    // whatever it thinks is held.
    WorkerMessage m;
    auto* exit = m.mutable_exit();
    exit->set_job(stop.job());
    exit->set_attempt(stop.attempt());
    exit->set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
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
               stop.checkpoint() ? ", keeping the state" : "", stop.reason());
  for (Attempt* a : ranks) {
    a->stop.Request(stop.checkpoint() ? train::StopKind::kKeepState : train::StopKind::kNow);
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

grpc::Status Agent::Serve(tally::v1::Workers::Stub* stub, const std::string& token) {
  grpc::ClientContext context;
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  auto stream = stub->Connect(&context);
  WorkerMessage hello;
  *hello.mutable_hello() = MakeHello();
  if (!stream->Write(hello)) {
    grpc::Status s = stream->Finish();
    if (!Refused(s)) {
      spdlog::warn("cannot reach tallyd at {}: {}", options_.controller, s.error_message());
    }
    return s;
  }
  {
    absl::MutexLock lock(&mu_);
    current_context_ = &context;
  }
  bool done = false;           // guarded by mu_
  bool writer_exited = false;  // guarded by mu_
  std::thread writer([&] {
    absl::MutexLock lock(&mu_);
    while (!done) {
      if (outbox_.empty()) {
        if (shutdown_.load() && running_.empty()) {
          context.TryCancel();  // all reported: end the stream
          break;
        }
        outbox_cv_.WaitWithTimeout(&mu_, heartbeat_interval_);
        if (done) break;
      }
      WorkerMessage m;
      const bool from_outbox = !outbox_.empty();
      if (from_outbox) {
        m = outbox_.front();
      } else {
        m.mutable_heartbeat();
      }
      mu_.Unlock();
      const bool ok = stream->Write(m);
      mu_.Lock();
      if (!ok) break;
      if (from_outbox) outbox_.PopFront();
    }
    writer_exited = true;
  });

  spdlog::info("connected to tallyd at {} as {} ({})", options_.controller,
               options_.worker_id, options_.credential_files.Describe());
  tally::v1::ControllerMessage msg;
  while (stream->Read(&msg)) {
    switch (msg.msg_case()) {
      case tally::v1::ControllerMessage::kWelcome: {
        absl::MutexLock lock(&mu_);
        const double s = msg.welcome().heartbeat_interval_seconds();
        if (s > 0) heartbeat_interval_ = absl::Seconds(s);
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
    done = true;
    current_context_ = nullptr;
    outbox_cv_.SignalAll();
  }
  // The writer sees `done` at once unless a Write is blocked; only then is
  // the call cancelled, since a cancelled call reports CANCELLED instead of
  // tallyd's status (which says, for one, why it refused this worker).
  const bool writer_stopped =
      mu_.LockWhenWithTimeout(absl::Condition(&writer_exited), absl::Seconds(2));
  mu_.Unlock();
  if (!writer_stopped) context.TryCancel();
  writer.join();
  grpc::Status s = stream->Finish();
  if (!shutdown_.load() && !Refused(s)) {
    spdlog::warn("stream to tallyd ended: {} {}", static_cast<int>(s.error_code()),
                 s.error_message());
  }
  return s;
}

int Agent::Run() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  std::mt19937 rng(std::random_device{}());
  absl::Duration backoff = options_.initial_backoff;
  int tries_after_shutdown = 0;
  Credentials credentials = options_.credentials;
  bool first = true;
  while (true) {
    const absl::Time start = absl::Now();
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
    // A fresh channel for every connection: one that failed carries gRPC's
    // own reconnect backoff (1 s growing to 2 min), which kept workers away
    // from a restarted tallyd for seconds, past its heartbeat timeout, so
    // attempts that could have been re-adopted were lost. Our backoff below
    // (with jitter) paces the retries instead.
    auto channel = grpc::CreateCustomChannel(options_.controller,
                                             ChannelCredentialsFor(credentials), args);
    auto stub = tally::v1::Workers::NewStub(channel);
    const grpc::Status status = Serve(stub.get(), credentials.token);
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
    }
    ReapFinished();
    {
      absl::MutexLock lock(&mu_);
      if (shutdown_.load() && running_.empty() &&
          (outbox_.empty() || refused || ++tries_after_shutdown > 3)) {
        break;
      }
    }
    if (absl::Now() - start > absl::Seconds(10)) backoff = options_.initial_backoff;
    // Full jitter, so a fleet that lost tallyd does not return in lockstep.
    std::uniform_real_distribution<double> jitter(0.5, 1.0);
    absl::Duration wait = backoff * jitter(rng);
    if (refused) wait = std::max(wait, options_.refused_retry_interval);
    const absl::Time until = absl::Now() + wait;
    bool give_up = false;
    while (absl::Now() < until && !(shutdown_.load() && tries_after_shutdown > 3)) {
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
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (give_up) break;
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
  ReapFinished();
  return 0;
}

void Agent::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutdown_.exchange(true)) return;
  for (auto& [key, a] : running_) a->stop.Request(train::StopKind::kNow);
  outbox_cv_.SignalAll();
}

}  // namespace tally::worker
