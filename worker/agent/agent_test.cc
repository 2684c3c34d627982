// The agent against a fake tallyd on loopback (port 0): the worker token in
// the Connect stream's metadata, files read again on every reconnect, mutual
// TLS, the slower retry after tallyd refuses the worker's credentials, and
// preemptions (a notice, a deadline, tallyd's preempting stop order); then,
// on a FakeClock with a FakeConnector, the backoff between connections,
// re-adoption after a reconnection and the order of reports queued
// meanwhile.
#include "worker/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/strings/str_join.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "worker/agent/backoff.h"
#include "worker/agent/connector.h"

namespace tally::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kTestdata = TALLY_AGENT_TESTDATA;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// The one place these tests poll: true once `cond` holds (looked at every
// millisecond), false if it still does not after `timeout`. Tests wait for
// events this way, never for time to pass.
bool WaitUntil(const std::function<bool()>& cond, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (cond()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
}

class NoRunner final : public Runner {
 public:
  tally::v1::AttemptExit Run(const tally::v1::Assignment&, Reporter*,
                             const train::StopFlag*) override {
    ADD_FAILURE() << "no assignment was sent";
    return {};
  }
};

// Logs a line with a control character and a second line, then succeeds.
class PrintingRunner final : public Runner {
 public:
  tally::v1::AttemptExit Run(const tally::v1::Assignment& a, Reporter*,
                             const train::StopFlag*) override {
    spdlog::warn("loss spiked\x1b[2J\nsecond line");
    tally::v1::AttemptExit e;
    e.set_job(a.job());
    e.set_attempt(a.attempt());
    e.set_outcome(tally::v1::ATTEMPT_OUTCOME_SUCCEEDED);
    return e;
  }
};

// Records each Connect (when, its authorization metadata, the client
// certificate's CN) and ends it with `end_with` once the Hello is read.
class FakeWorkers final : public tally::v1::Workers::Service {
 public:
  struct Connection {
    absl::Time time;
    std::string authorization;
    std::string worker_id;
    std::string peer_common_name;
  };

  explicit FakeWorkers(grpc::Status end_with) : end_with_(std::move(end_with)) {}

  grpc::Status Connect(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<tally::v1::ControllerMessage,
                                                tally::v1::WorkerMessage>* stream) override {
    Connection c;
    c.time = absl::Now();
    const auto& metadata = context->client_metadata();
    auto it = metadata.find("authorization");
    if (it != metadata.end()) c.authorization = std::string(it->second.data(), it->second.size());
    for (const auto& cn : context->auth_context()->FindPropertyValues("x509_common_name")) {
      c.peer_common_name = std::string(cn.data(), cn.size());
    }
    tally::v1::WorkerMessage hello;
    if (stream->Read(&hello)) c.worker_id = hello.hello().worker_id();
    absl::MutexLock lock(&mu_);
    connections_.push_back(c);
    return end_with_;
  }

  std::vector<Connection> connections() {
    absl::MutexLock lock(&mu_);
    return connections_;
  }
  // Waits until at least `n` connections were made; false after 20 s.
  bool WaitFor(size_t n) {
    return WaitUntil([&] { return connections().size() >= n; });
  }

 private:
  const grpc::Status end_with_;
  absl::Mutex mu_;
  std::vector<Connection> connections_ ABSL_GUARDED_BY(mu_);
};

// A tallyd that keeps each stream open, records every message the worker
// sends, and sends what a test gives it. It welcomes each Hello, as tallyd
// does once it has taken it, unless told not to (a standby, which ends the
// stream instead).
class FakeTallyd final : public tally::v1::Workers::Service {
 public:
  grpc::Status Connect(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<tally::v1::ControllerMessage,
                                                tally::v1::WorkerMessage>* stream) override {
    tally::v1::WorkerMessage m;
    if (!stream->Read(&m)) return grpc::Status::OK;
    {
      absl::MutexLock lock(&mu_);
      received_.push_back(m);
      if (!refuse_.ok()) return refuse_;
      stream_ = stream;
      context_ = context;
      if (welcome_) {
        tally::v1::ControllerMessage welcome;
        welcome.mutable_welcome()->set_acks(acks_);
        welcome.mutable_welcome()->set_heartbeat_interval_seconds(heartbeat_interval_seconds_);
        stream->Write(welcome);
      }
    }
    while (stream->Read(&m)) {
      absl::MutexLock lock(&mu_);
      received_.push_back(m);
      if (!end_live_.ok()) {  // once
        stream_ = nullptr;
        context_ = nullptr;
        return std::exchange(end_live_, grpc::Status::OK);
      }
      if (m.has_notice() && reply_to_notice_.has_value()) {
        // Sent before anything after the notice is read: as if tallyd had
        // placed it just before the notice arrived.
        stream->Write(*reply_to_notice_);
        reply_to_notice_.reset();
      }
    }
    absl::MutexLock lock(&mu_);
    stream_ = nullptr;
    context_ = nullptr;
    return grpc::Status::OK;
  }

  // Ends the open stream as a failed connection would (the worker reads
  // CANCELLED); false when none is open.
  bool Hangup() {
    absl::MutexLock lock(&mu_);
    if (context_ == nullptr) return false;
    context_->TryCancel();
    return true;
  }

  // The open stream ends with `s` at the next message it reads (once).
  void EndLiveStreamWith(grpc::Status s) {
    absl::MutexLock lock(&mu_);
    end_live_ = std::move(s);
  }
  // Every stream from now on is refused with `s` after its hello (OK:
  // accepted again).
  void set_refuse(grpc::Status s) {
    absl::MutexLock lock(&mu_);
    refuse_ = std::move(s);
  }

  // Answers the next Notice read with `m`, on the same stream (once).
  void set_welcome(bool welcome) {
    absl::MutexLock lock(&mu_);
    welcome_ = welcome;
  }

  // Welcomes saying that it acknowledges reports (it acknowledges only
  // what a test sends with Ack).
  void set_acks(bool acks) {
    absl::MutexLock lock(&mu_);
    acks_ = acks;
  }
  // Asks for heartbeats this often (0: the worker's default, 2 s).
  void set_heartbeat_interval(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    heartbeat_interval_seconds_ = absl::ToDoubleSeconds(d);
  }
  bool Ack(uint64_t seq) {
    tally::v1::ControllerMessage m;
    m.mutable_ack()->set_seq(seq);
    return Send(m);
  }

  void ReplyToNotice(tally::v1::ControllerMessage m) {
    absl::MutexLock lock(&mu_);
    reply_to_notice_ = std::move(m);
  }

  // False when no stream is open.
  bool Send(const tally::v1::ControllerMessage& m) {
    absl::MutexLock lock(&mu_);
    return stream_ != nullptr && stream_->Write(m);
  }
  bool connected() {
    absl::MutexLock lock(&mu_);
    return stream_ != nullptr;
  }
  std::vector<tally::v1::WorkerMessage> received() {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  // Waits up to 20 s for a received message that `match` accepts.
  std::optional<tally::v1::WorkerMessage> WaitFor(
      const std::function<bool(const tally::v1::WorkerMessage&)>& match) {
    std::optional<tally::v1::WorkerMessage> found;
    WaitUntil([&] {
      for (const auto& m : received()) {
        if (match(m)) {
          found = m;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  bool WaitConnected() {
    return WaitUntil([this] { return connected(); });
  }

 private:
  absl::Mutex mu_;
  std::vector<tally::v1::WorkerMessage> received_ ABSL_GUARDED_BY(mu_);
  grpc::ServerReaderWriter<tally::v1::ControllerMessage, tally::v1::WorkerMessage>* stream_
      ABSL_GUARDED_BY(mu_) = nullptr;
  grpc::ServerContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::optional<tally::v1::ControllerMessage> reply_to_notice_ ABSL_GUARDED_BY(mu_);
  grpc::Status refuse_ ABSL_GUARDED_BY(mu_);
  grpc::Status end_live_ ABSL_GUARDED_BY(mu_);
  bool welcome_ ABSL_GUARDED_BY(mu_) = true;
  bool acks_ ABSL_GUARDED_BY(mu_) = false;
  double heartbeat_interval_seconds_ ABSL_GUARDED_BY(mu_) = 0;
};

// Runs until asked to stop. A preemption reports a checkpoint of step 7 and
// exits PREEMPTED (as the trainer does), unless told to ignore it (then only
// kNow stops it) or to hold it until Release(). Anything else: STOPPED.
class FakeRunner final : public Runner {
 public:
  struct Seen {
    std::string job;
    train::StopKind stop = train::StopKind::kNone;
  };
  explicit FakeRunner(bool ignore_preempt = false, bool hold_preempt = false)
      : ignore_preempt_(ignore_preempt), hold_preempt_(hold_preempt) {}

  tally::v1::AttemptExit Run(const tally::v1::Assignment& a, Reporter* reporter,
                             const train::StopFlag* stop) override {
    {
      absl::MutexLock lock(&mu_);
      seen_.push_back({a.job(), train::StopKind::kNone});
    }
    const size_t me = seen().size() - 1;
    tally::v1::Progress p;
    p.set_job(a.job());
    p.set_attempt(a.attempt());
    p.set_step(7);
    reporter->Progress(p);
    // Polls its stop flag, as the trainer does at each step.
    train::StopKind kind = train::StopKind::kNone;
    WaitUntil(
        [&] {
          kind = stop->requested();
          return kind == train::StopKind::kNow || kind == train::StopKind::kKeepState ||
                 (kind == train::StopKind::kPreempt && !ignore_preempt_);
        },
        absl::InfiniteDuration());
    {
      absl::MutexLock lock(&mu_);
      seen_[me].stop = kind;
      if (kind == train::StopKind::kPreempt && hold_preempt_) {
        mu_.Await(absl::Condition(&released_));
      }
    }
    tally::v1::AttemptExit exit;
    exit.set_job(a.job());
    exit.set_attempt(a.attempt());
    exit.set_step(7);
    if (kind == train::StopKind::kPreempt) {
      tally::v1::CheckpointRecord c;
      c.set_job(a.job());
      c.set_attempt(a.attempt());
      c.set_step(7);
      c.set_path("step-00000007.ckpt");
      reporter->Checkpoint(c);
      exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
      exit.set_reason("preempted at step 7, state kept in its checkpoint");
    } else {
      exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
      exit.set_reason("stopped at step 7");
    }
    return exit;
  }

  std::vector<Seen> seen() {
    absl::MutexLock lock(&mu_);
    return seen_;
  }
  // Waits up to 20 s until `n` assignments have started.
  bool WaitStarted(size_t n) {
    return WaitUntil([&] { return seen().size() >= n; });
  }
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }

 private:
  const bool ignore_preempt_, hold_preempt_;
  absl::Mutex mu_;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
  bool released_ ABSL_GUARDED_BY(mu_) = false;
};

tally::v1::ControllerMessage AssignmentMessage(const std::string& job, int32_t attempt = 1) {
  tally::v1::ControllerMessage m;
  m.mutable_assignment()->set_job(job);
  m.mutable_assignment()->set_attempt(attempt);
  m.mutable_assignment()->set_world_size(1);
  return m;
}

std::function<bool(const tally::v1::WorkerMessage&)> ExitOf(const std::string& job) {
  return [job](const tally::v1::WorkerMessage& m) { return m.has_exit() && m.exit().job() == job; };
}

// "hello", "notice sigterm", "progress jobs/1 7", "checkpoint jobs/1 7",
// "exit jobs/1 PREEMPTED": the stream as tallyd read it.
std::vector<std::string> Kinds(const std::vector<tally::v1::WorkerMessage>& ms) {
  std::vector<std::string> out;
  for (const auto& m : ms) {
    if (m.has_hello()) out.push_back("hello");
    if (m.has_notice()) out.push_back("notice " + m.notice().cause());
    if (m.has_progress()) out.push_back(absl::StrCat("progress ", m.progress().job(), " ",
                                                     m.progress().step()));
    if (m.has_eval()) out.push_back(absl::StrCat("eval ", m.eval().job(), " ", m.eval().step()));
    if (m.has_checkpoint()) out.push_back(absl::StrCat("checkpoint ", m.checkpoint().job(), " ",
                                                       m.checkpoint().step()));
    if (m.has_exit()) out.push_back(absl::StrCat("exit ", m.exit().job(), " ",
                                                 tally::v1::AttemptOutcome_Name(m.exit().outcome())));
  }
  return out;
}

std::vector<tally::v1::WorkerMessage> WithoutHeartbeats(std::vector<tally::v1::WorkerMessage> ms) {
  ms.erase(std::remove_if(ms.begin(), ms.end(), [](const auto& m) { return m.has_heartbeat(); }),
           ms.end());
  return ms;
}

// A Workers stream whose connection failed: nothing is written or read.
class DownStream final
    : public grpc::ClientReaderWriterInterface<tally::v1::WorkerMessage,
                                               tally::v1::ControllerMessage> {
 public:
  using grpc::internal::WriterInterface<tally::v1::WorkerMessage>::Write;
  void WaitForInitialMetadata() override {}
  bool NextMessageSize(uint32_t*) override { return false; }
  bool Read(tally::v1::ControllerMessage*) override { return false; }
  bool Write(const tally::v1::WorkerMessage&, grpc::WriteOptions) override { return false; }
  bool WritesDone() override { return false; }
  grpc::Status Finish() override {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "failed to connect to all addresses");
  }
};

class DownStub final : public tally::v1::Workers::StubInterface {
 private:
  grpc::ClientReaderWriterInterface<tally::v1::WorkerMessage, tally::v1::ControllerMessage>*
  ConnectRaw(grpc::ClientContext*) override {
    return new DownStream;
  }
  grpc::ClientAsyncReaderWriterInterface<tally::v1::WorkerMessage, tally::v1::ControllerMessage>*
  AsyncConnectRaw(grpc::ClientContext*, grpc::CompletionQueue*, void*) override {
    ADD_FAILURE() << "the agent uses the synchronous API";
    return nullptr;
  }
  grpc::ClientAsyncReaderWriterInterface<tally::v1::WorkerMessage, tally::v1::ControllerMessage>*
  PrepareAsyncConnectRaw(grpc::ClientContext*, grpc::CompletionQueue*) override {
    ADD_FAILURE() << "the agent uses the synchronous API";
    return nullptr;
  }
};

// Connects over an in-process channel to `server` while up; while down,
// every connection fails. Records each attempt's time on `clock`. The agent
// owns the connector; the test keeps a FakeConnector::State.
class FakeConnector final : public Connector {
 public:
  struct State {
    absl::Mutex mu;
    bool down ABSL_GUARDED_BY(mu) = false;
    std::vector<absl::Time> attempts ABSL_GUARDED_BY(mu);

    void SetDown(bool d) {
      absl::MutexLock lock(&mu);
      down = d;
    }
    std::vector<absl::Time> Attempts() {
      absl::MutexLock lock(&mu);
      return attempts;
    }
  };

  FakeConnector(State* state, grpc::Server* server, const Clock* clock)
      : state_(state), server_(server), clock_(clock) {}

  std::unique_ptr<tally::v1::Workers::StubInterface> Connect(const Credentials&) override {
    absl::MutexLock lock(&state_->mu);
    state_->attempts.push_back(clock_->Now());
    if (state_->down || server_ == nullptr) return std::make_unique<DownStub>();
    return tally::v1::Workers::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }

 private:
  State* const state_;
  grpc::Server* const server_;
  const Clock* const clock_;
};

// Runs until stopped, reporting only what the test reports through
// reporter(); then exits STOPPED.
class HeldRunner final : public Runner {
 public:
  tally::v1::AttemptExit Run(const tally::v1::Assignment& a, Reporter* reporter,
                             const train::StopFlag* stop) override {
    {
      absl::MutexLock lock(&mu_);
      reporter_ = reporter;
    }
    train::StopKind kind = train::StopKind::kNone;
    WaitUntil([&] { return (kind = stop->requested()) != train::StopKind::kNone; },
              absl::InfiniteDuration());
    absl::MutexLock lock(&mu_);
    stopped_with_ = kind;
    reporter_ = nullptr;
    tally::v1::AttemptExit exit;
    exit.set_job(a.job());
    exit.set_attempt(a.attempt());
    exit.set_outcome(tally::v1::ATTEMPT_OUTCOME_STOPPED);
    exit.set_reason("stopped");
    return exit;
  }

  // The running attempt's reporter; null until it starts (waits up to 20 s).
  Reporter* reporter() {
    absl::MutexLock lock(&mu_);
    auto started = [this] { return reporter_ != nullptr; };
    mu_.AwaitWithTimeout(absl::Condition(&started), absl::Seconds(20));
    return reporter_;
  }
  train::StopKind stopped_with() {
    absl::MutexLock lock(&mu_);
    return stopped_with_;
  }

 private:
  absl::Mutex mu_;
  Reporter* reporter_ ABSL_GUARDED_BY(mu_) = nullptr;
  train::StopKind stopped_with_ ABSL_GUARDED_BY(mu_) = train::StopKind::kNone;
};

// Advances `clock` by `step` about every millisecond of real time until
// `done` holds; false after 20 s.
bool AdvanceUntil(FakeClock* clock, absl::Duration step, const std::function<bool()>& done) {
  return WaitUntil([&] {
    if (done()) return true;
    clock->Advance(step);
    return false;
  });
}

tally::v1::EvalResult EvalAt(const std::string& job, int32_t attempt, int64_t step) {
  tally::v1::EvalResult e;
  e.set_job(job);
  e.set_attempt(attempt);
  e.set_step(step);
  return e;
}

tally::v1::Progress ProgressAt(const std::string& job, int32_t attempt, int64_t step) {
  tally::v1::Progress p;
  p.set_job(job);
  p.set_attempt(attempt);
  p.set_step(step);
  return p;
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/tally_agent_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    log_ = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
    spdlog::default_logger()->sinks().push_back(log_);
  }
  void TearDown() override {
    if (agent_) {
      agent_->Shutdown();
      // A wait between connections ends on the agent's clock: move it.
      if (on_fake_clock_) {
        AdvanceUntil(&clock_, absl::Milliseconds(100),
                     [this] { return RunReturned(absl::ZeroDuration()) != absl::InfinitePast(); });
      }
      runner_thread_.join();
    }
    if (server_) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), log_), sinks.end());
    std::filesystem::remove_all(dir_);
  }

  void StartServer(grpc::Status end_with,
                   std::shared_ptr<grpc::ServerCredentials> credentials =
                       grpc::InsecureServerCredentials()) {
    service_ = std::make_unique<FakeWorkers>(std::move(end_with));
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", credentials, &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  // On `port` (0: any free one).
  void StartTallyd(int port = 0) {
    tallyd_ = std::make_unique<FakeTallyd>();
    grpc::ServerBuilder builder;
    builder.AddListeningPort(absl::StrCat("127.0.0.1:", port), grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(tallyd_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }

  AgentOptions Options(CredentialFiles files) {
    AgentOptions o;
    o.controller = address_;
    o.worker_id = "w1";
    o.initial_backoff = absl::Milliseconds(10);
    o.max_backoff = absl::Milliseconds(40);
    o.credential_files = files;
    o.capture_logs = false;  // these tests count reports; LogsGoAheadOfTheExit turns it on
    absl::StatusOr<Credentials> c = LoadCredentials(files);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) o.credentials = *c;
    return o;
  }

  // The agent on clock_, connecting through a FakeConnector to `server`
  // (null: every connection fails) that records attempts in connections_.
  AgentSeams FakeSeams(grpc::Server* server, uint32_t backoff_seed = 1) {
    on_fake_clock_ = true;
    AgentSeams seams;
    seams.clock = &clock_;
    seams.connector = std::make_unique<FakeConnector>(&connections_, server, &clock_);
    seams.backoff_seed = backoff_seed;
    return seams;
  }

  void StartAgent(AgentOptions options, std::unique_ptr<Runner> runner = nullptr,
                  AgentSeams seams = {}) {
    if (!runner) runner = std::make_unique<NoRunner>();
    agent_ = std::make_unique<Agent>(std::move(options), std::move(runner), std::move(seams));
    runner_thread_ = std::thread([this] {
      const int rc = agent_->Run();
      absl::MutexLock lock(&run_mu_);
      run_rc_ = rc;
      run_returned_ = absl::Now();
    });
  }

  // When Run() returned (InfinitePast: not yet), after waiting up to
  // `timeout` for it.
  absl::Time RunReturned(absl::Duration timeout) {
    absl::MutexLock lock(&run_mu_);
    auto returned = [this] { return run_returned_ != absl::InfinitePast(); };
    run_mu_.AwaitWithTimeout(absl::Condition(&returned), timeout);
    return run_returned_;
  }

  // tallyd goes away (its streams end, connections are refused); returns
  // its port.
  int StopTallyd() {
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_.reset();
    return std::stoi(address_.substr(address_.rfind(':') + 1));
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary) << text;
    std::filesystem::rename(tmp, path);  // as a rotation would: never half-written
    return path;
  }

  // The agent on the fake clock, connected to the fake tallyd, running
  // `job`'s `attempt` on a HeldRunner: that attempt's reporter (null when it
  // did not start).
  Reporter* StartHeldAttempt(const std::string& job, int32_t attempt, HeldRunner** held) {
    auto runner = std::make_unique<HeldRunner>();
    *held = runner.get();
    StartAgent(Options({}), std::move(runner), FakeSeams(server_.get()));
    if (!tallyd_->WaitConnected() || !tallyd_->Send(AssignmentMessage(job, attempt))) {
      ADD_FAILURE() << "no stream to send the assignment on";
      return nullptr;
    }
    return (*held)->reporter();
  }

  // Hellos the fake tallyd read: one per stream.
  size_t Hellos() {
    size_t n = 0;
    for (const auto& m : tallyd_->received()) n += m.has_hello();
    return n;
  }

  // Waits up to 20 s until the agent holds `n` reports for tallyd.
  bool WaitQueued(size_t n) {
    return WaitUntil([&] { return agent_->QueuedReports() == n; });
  }

  // Waits up to 20 s until the agent's `count` (Agent::Counters) is at
  // least `n`.
  bool WaitCount(uint64_t Agent::Counters::*count, uint64_t n) {
    return WaitUntil([&] { return agent_->counters().*count >= n; });
  }
  // Waits up to 20 s until the agent's `count` has moved `by` past its
  // value now: the agent has looked at its state again since this call and
  // left it be. By 2 where the look reads the clock before the count's
  // lock (Agent::Counters::num_backoff_checks), so that a look under way
  // now does not count.
  bool WaitForMore(uint64_t Agent::Counters::*count, uint64_t by = 1) {
    return WaitCount(count, agent_->counters().*count + by);
  }

  std::string Logged() {
    std::string all;
    for (const std::string& line : log_->last_formatted()) all += line;
    return all;
  }

  std::string dir_;
  std::string address_;
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> log_;
  std::unique_ptr<FakeWorkers> service_;
  std::unique_ptr<FakeTallyd> tallyd_;
  std::unique_ptr<grpc::Server> server_;
  FakeClock clock_;
  FakeConnector::State connections_;
  bool on_fake_clock_ = false;
  std::unique_ptr<Agent> agent_;
  std::thread runner_thread_;
  absl::Mutex run_mu_;
  int run_rc_ ABSL_GUARDED_BY(run_mu_) = -1;
  absl::Time run_returned_ ABSL_GUARDED_BY(run_mu_) = absl::InfinitePast();
};

// What an attempt's thread logs reaches tallyd as LogBatch reports of that
// attempt, one line per line, before the attempt's exit.
TEST_F(AgentTest, LogsGoAheadOfTheExit) {
  StartTallyd();
  AgentOptions o = Options({});
  o.capture_logs = true;
  StartAgent(o, std::make_unique<PrintingRunner>());
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/4", 2)));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_exit(); }));
  std::vector<std::string> texts;
  bool exit_seen = false;
  for (const auto& m : WithoutHeartbeats(tallyd_->received())) {
    if (m.has_exit()) exit_seen = true;
    if (!m.has_logs()) continue;
    EXPECT_FALSE(exit_seen) << "a log batch after the exit";
    EXPECT_EQ(m.logs().job(), "jobs/4");
    EXPECT_EQ(m.logs().attempt(), 2);
    for (const auto& l : m.logs().lines()) {
      texts.push_back(l.source() + " " + l.level() + " " + l.text());
      EXPECT_GT(l.time().seconds(), 0);
    }
  }
  ASSERT_EQ(texts.size(), 4u) << absl::StrJoin(texts, " | ");
  EXPECT_EQ(texts[0], "worker info attempt 2 of jobs/4: started on worker w1 (rank 0/1)");
  EXPECT_EQ(texts[1], "trainer warning loss spiked\x1b[2J");
  EXPECT_EQ(texts[2], "trainer warning second line");
  EXPECT_EQ(texts[3].rfind("worker info attempt 2 of jobs/4: ATTEMPT_OUTCOME_SUCCEEDED", 0), 0u)
      << texts[3];
}

TEST_F(AgentTest, TheTokenIsSentAsBearerMetadataAndReadAgainOnReconnect) {
  StartServer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "closing"));
  CredentialFiles files;
  files.token = WriteFile("token", "first-token\n");
  StartAgent(Options(files));
  ASSERT_TRUE(service_->WaitFor(1));
  WriteFile("token", "  rotated-token \n");
  // Every connection after the rotation carries the new token.
  ASSERT_TRUE(WaitUntil([this] {
    return service_->connections().back().authorization == "Bearer rotated-token";
  }));
  const auto c = service_->connections();
  EXPECT_EQ(c.front().authorization, "Bearer first-token");
  EXPECT_EQ(c.front().worker_id, "w1");
  EXPECT_EQ(c.back().authorization, "Bearer rotated-token");
  EXPECT_THAT(Logged(), AllOf(Not(HasSubstr("first-token")), Not(HasSubstr("rotated-token"))));
}

TEST_F(AgentTest, AFileThatCannotBeReadAgainKeepsTheCredentialsReadBefore) {
  StartServer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "closing"));
  CredentialFiles files;
  files.token = WriteFile("token", "kept-token");
  StartAgent(Options(files));
  ASSERT_TRUE(service_->WaitFor(1));
  std::filesystem::remove(files.token);
  const size_t seen = service_->connections().size();
  ASSERT_TRUE(service_->WaitFor(seen + 2));
  EXPECT_EQ(service_->connections().back().authorization, "Bearer kept-token");
  EXPECT_THAT(Logged(), AllOf(HasSubstr("--token_file: " + files.token),
                              HasSubstr("connecting with the credentials read before")));
}

TEST_F(AgentTest, WithoutATokenNoAuthorizationIsSent) {
  StartServer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "closing"));
  StartAgent(Options({}));
  ASSERT_TRUE(service_->WaitFor(1));
  EXPECT_EQ(service_->connections()[0].authorization, "");
}

TEST_F(AgentTest, ARefusedWorkerLogsTallydsReasonAndRetriesNoFasterThanTheInterval) {
  StartServer(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                           "unknown worker token: check --token_file"));
  CredentialFiles files;
  files.token = WriteFile("token", "wrong-token");
  AgentOptions options = Options(files);
  options.refused_retry_interval = absl::Milliseconds(400);
  StartAgent(options, nullptr, FakeSeams(server_.get()));
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(10),
                           [this] { return connections_.Attempts().size() >= 3; }));
  ASSERT_TRUE(service_->WaitFor(2));
  EXPECT_EQ(service_->connections()[0].authorization, "Bearer wrong-token");
  const std::vector<absl::Time> at = connections_.Attempts();
  for (size_t i = 1; i < at.size(); ++i) {
    // 10 to 40 ms apart after other errors; here at least the interval.
    EXPECT_GE(at[i] - at[i - 1], absl::Milliseconds(400)) << "connection " << i;
  }
  EXPECT_THAT(Logged(),
              AllOf(HasSubstr("refused worker w1 (UNAUTHENTICATED; connecting with plaintext, "
                              "with a worker token)"),
                    HasSubstr("unknown worker token: check --token_file"),
                    Not(HasSubstr("wrong-token"))));
}

TEST_F(AgentTest, PermissionDeniedWaitsTheIntervalToo) {
  StartServer(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, "worker id w1 is not yours"));
  AgentOptions options = Options({});
  options.refused_retry_interval = absl::Milliseconds(400);
  StartAgent(options, nullptr, FakeSeams(server_.get()));
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(10),
                           [this] { return connections_.Attempts().size() >= 2; }));
  const std::vector<absl::Time> at = connections_.Attempts();
  EXPECT_GE(at[1] - at[0], absl::Milliseconds(400));
  EXPECT_THAT(Logged(), AllOf(HasSubstr("PERMISSION_DENIED"),
                              HasSubstr("worker id w1 is not yours")));
}

TEST_F(AgentTest, ARevokedWorkerStopsItsAttemptsAtOnce) {
  StartTallyd();
  HeldRunner* held = nullptr;
  ASSERT_NE(StartHeldAttempt("jobs/2", 1, &held), nullptr);
  // The worker's token is removed and tallyd reloads: the stream ends, and
  // every reconnection is refused.
  tallyd_->set_refuse(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "unknown worker token"));
  ASSERT_TRUE(tallyd_->Hangup());
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(10), [&] {
    return held->stopped_with() != train::StopKind::kNone;
  }));
  EXPECT_EQ(held->stopped_with(), train::StopKind::kNow) << "no checkpoint of a step nobody records";
  EXPECT_THAT(Logged(), HasSubstr("stopping attempt 1 of jobs/2 at once, without a checkpoint: "
                                  "tallyd refused this worker's credential (unknown worker token)"));
}

TEST_F(AgentTest, ALiveStreamEndedForItsCredentialOnlyReconnects) {
  // tallyd ends a live stream whose certificate or token expired; renewed
  // files are on disk, so the next connection is accepted: the attempt
  // keeps running.
  StartTallyd();
  tallyd_->set_heartbeat_interval(absl::Milliseconds(20));
  HeldRunner* held = nullptr;
  AgentOptions options = Options({});
  options.refused_retry_interval = absl::Milliseconds(50);
  auto runner = std::make_unique<HeldRunner>();
  held = runner.get();
  StartAgent(options, std::move(runner), FakeSeams(server_.get()));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/2", 1)));
  ASSERT_NE(held->reporter(), nullptr);
  tallyd_->EndLiveStreamWith(
      grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "client certificate expired"));
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(10), [&] { return Hellos() >= 2; }));
  EXPECT_EQ(held->stopped_with(), train::StopKind::kNone);
  EXPECT_THAT(Logged(), Not(HasSubstr("stopping attempt")));
  agent_->Shutdown();
}

TEST_F(AgentTest, UnavailableIsRetriedSoon) {
  StartServer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "closing"));
  AgentOptions options = Options({});
  options.refused_retry_interval = absl::Seconds(30);
  StartAgent(options);
  // Three connections well within the refused interval: only auth errors
  // wait for it.
  ASSERT_TRUE(service_->WaitFor(3));
  const auto c = service_->connections();
  EXPECT_LT(c[2].time - c[0].time, absl::Seconds(5));
}

TEST_F(AgentTest, ShutdownWhileRefusedEndsRunWithoutWaitingTheInterval) {
  StartServer(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "no token"));
  AgentOptions options = Options({});
  options.refused_retry_interval = absl::Seconds(60);
  StartAgent(options);
  ASSERT_TRUE(service_->WaitFor(1));
  const absl::Time start = absl::Now();
  agent_->Shutdown();
  runner_thread_.join();
  agent_.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST_F(AgentTest, MutualTlsPresentsTheWorkersCertificateAndChecksTallyds) {
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  ssl.pem_root_certs = Read(kTestdata + "/ca.pem");
  ssl.pem_key_cert_pairs.push_back(
      {Read(kTestdata + "/server-key.pem"), Read(kTestdata + "/server.pem")});
  StartServer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "closing"),
              grpc::SslServerCredentials(ssl));
  CredentialFiles files{kTestdata + "/ca.pem", kTestdata + "/worker.pem",
                        kTestdata + "/worker-key.pem", WriteFile("token", "tls-token")};
  StartAgent(Options(files));
  ASSERT_TRUE(service_->WaitFor(1));
  const auto c = service_->connections();
  EXPECT_EQ(c[0].peer_common_name, "w1");
  EXPECT_EQ(c[0].authorization, "Bearer tls-token");
  EXPECT_EQ(c[0].worker_id, "w1");
}

TEST_F(AgentTest, ATallydWhoseCertificateTheCaDidNotSignIsNeverTalkedTo) {
  // tallyd presents a certificate signed by the test CA; the worker trusts
  // only the worker's own (self-issued) certificate as a CA, so the
  // handshake fails and no stream reaches the service.
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back(
      {Read(kTestdata + "/server-key.pem"), Read(kTestdata + "/server.pem")});
  StartServer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "closing"),
              grpc::SslServerCredentials(ssl));
  CredentialFiles files;
  files.ca_cert = kTestdata + "/worker.pem";
  StartAgent(Options(files));
  // Two connections over: one that reached the service would have been
  // recorded there before its stream ended.
  ASSERT_TRUE(WaitCount(&Agent::Counters::num_connections_ended, 2));
  EXPECT_TRUE(service_->connections().empty());
}

TEST_F(AgentTest, APreemptionCheckpointsRunningAttemptsAndSaysWhyInTheirExits) {
  StartTallyd();
  AgentOptions options = Options({});
  options.capacity = "spot";
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner* fake = runner.get();
  StartAgent(options, std::move(runner));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/1")));
  ASSERT_TRUE(fake->WaitStarted(1));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_progress(); }));
  const absl::Time start = absl::Now();
  agent_->Preempt("sigterm");
  agent_->Preempt("sigint");  // the first cause wins

  // Run() returns once the exit is delivered, well within the deadline.
  const absl::Time returned = RunReturned(absl::Seconds(20));
  ASSERT_NE(returned, absl::InfinitePast()) << "Run() did not return";
  EXPECT_LT(returned - start, absl::Seconds(5));
  {
    absl::MutexLock lock(&run_mu_);
    EXPECT_EQ(run_rc_, 0);
  }
  EXPECT_FALSE(agent_->HasAbandonedAttempts());
  ASSERT_EQ(fake->seen().size(), 1u);
  EXPECT_EQ(fake->seen()[0].stop, train::StopKind::kPreempt);

  const auto received = tallyd_->received();
  ASSERT_FALSE(received.empty());
  EXPECT_EQ(received[0].hello().capacity(), "spot");
  // The notice first, then the attempt's checkpoint before its exit.
  EXPECT_THAT(Kinds(received),
              ::testing::ElementsAre("hello", "progress jobs/1 7", "notice sigterm",
                                     "checkpoint jobs/1 7", "exit jobs/1 ATTEMPT_OUTCOME_PREEMPTED"));
  for (const auto& m : received) {
    if (m.has_notice()) {
      EXPECT_GT(m.notice().deadline_seconds(), 20);
      EXPECT_LE(m.notice().deadline_seconds(), 25);
    }
    if (m.has_exit()) {
      EXPECT_EQ(m.exit().preemption_cause(), "sigterm");
      EXPECT_EQ(m.exit().step(), 7);
    }
  }
}

TEST_F(AgentTest, ANewAssignmentWhileGoingAwayIsAnsweredPreemptedNotFailed) {
  StartTallyd();
  AgentOptions options = Options({});
  options.slots = 2;  // a free slot: the refusal is the preemption's
  auto runner = std::make_unique<FakeRunner>(/*ignore_preempt=*/false, /*hold_preempt=*/true);
  FakeRunner* fake = runner.get();
  StartAgent(options, std::move(runner));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/1")));
  ASSERT_TRUE(fake->WaitStarted(1));
  agent_->Preempt("notice_file");
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_notice(); }));
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/2")));
  auto refused = tallyd_->WaitFor(ExitOf("jobs/2"));
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->exit().outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_EQ(refused->exit().preemption_cause(), "notice_file");
  EXPECT_EQ(refused->exit().reason(), "worker is going away (notice_file)");
  EXPECT_EQ(fake->seen().size(), 1u);  // never started
  // Still draining: the running attempt has not exited, and the agent has
  // looked since and waits on.
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_deadline_checks));
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  fake->Release();
  auto exit = tallyd_->WaitFor(ExitOf("jobs/1"));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit().outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_EQ(exit->exit().preemption_cause(), "notice_file");
  EXPECT_NE(RunReturned(absl::Seconds(20)), absl::InfinitePast());
}

TEST_F(AgentTest, AtTheDeadlineAnAttemptThatHasNotStoppedExitsPreemptedAndRunReturns) {
  StartTallyd();
  AgentOptions options = Options({});
  options.preemption_deadline = absl::Seconds(1);
  auto runner = std::make_unique<FakeRunner>(/*ignore_preempt=*/true);
  FakeRunner* fake = runner.get();
  StartAgent(options, std::move(runner), FakeSeams(server_.get()));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/1")));
  ASSERT_TRUE(fake->WaitStarted(1));
  agent_->Preempt("sigterm");
  // Given up a delivery allowance (a fifth of 1 s) before the deadline:
  // not a tick sooner (the agent has looked at its clock since it moved).
  clock_.Advance(absl::Milliseconds(799));
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_deadline_checks));
  EXPECT_FALSE(agent_->HasAbandonedAttempts());
  clock_.Advance(absl::Milliseconds(1));
  ASSERT_NE(RunReturned(absl::Seconds(20)), absl::InfinitePast()) << "Run() did not return";
  EXPECT_TRUE(agent_->HasAbandonedAttempts());
  auto exit = tallyd_->WaitFor(ExitOf("jobs/1"));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit().outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_EQ(exit->exit().preemption_cause(), "sigterm");
  EXPECT_THAT(exit->exit().reason(),
              AllOf(HasSubstr("preemption checkpoint did not finish within the 1s deadline"),
                    HasSubstr("previous checkpoint stays valid")));
  EXPECT_THAT(Logged(), HasSubstr("its preemption checkpoint did not finish within the 1s "
                                  "deadline; the previous checkpoint stays valid"));
  // Shutdown() (TearDown) stops it at once; what it reports then is dropped.
  agent_->Shutdown();
  runner_thread_.join();
  agent_.reset();
  size_t exits = 0;
  for (const auto& m : tallyd_->received()) exits += m.has_exit();
  EXPECT_EQ(exits, 1u);
}

TEST_F(AgentTest, APreemptingStopOrderPreemptsThatAttemptForPriorityAndTheWorkerStays) {
  StartTallyd();
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner* fake = runner.get();
  StartAgent(Options({}), std::move(runner));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/1")));
  ASSERT_TRUE(fake->WaitStarted(1));
  tally::v1::ControllerMessage stop;
  stop.mutable_stop()->set_job("jobs/1");
  stop.mutable_stop()->set_attempt(1);
  stop.mutable_stop()->set_preempt(true);
  stop.mutable_stop()->set_reason("jobs/9 has priority 100");
  ASSERT_TRUE(tallyd_->Send(stop));
  auto exit = tallyd_->WaitFor(ExitOf("jobs/1"));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(fake->seen()[0].stop, train::StopKind::kPreempt);
  EXPECT_EQ(exit->exit().outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_EQ(exit->exit().preemption_cause(), "priority");
  // No notice: the worker is not going away, and takes the next job.
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/2")));
  ASSERT_TRUE(fake->WaitStarted(2));
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  for (const auto& m : tallyd_->received()) EXPECT_FALSE(m.has_notice());
  // A preempting order for an attempt not running here is answered as a
  // preemption too, so tallyd requeues it.
  stop.mutable_stop()->set_job("jobs/3");
  ASSERT_TRUE(tallyd_->Send(stop));
  auto other = tallyd_->WaitFor(ExitOf("jobs/3"));
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->exit().outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_EQ(other->exit().reason(), "not running here");
}

TEST_F(AgentTest, TheNoticeFileAppearingPreemptsTheWorker) {
  StartTallyd();
  AgentOptions options = Options({});
  options.preemption_notice_file = dir_ + "/notice";
  options.notice_poll_interval = absl::Milliseconds(20);
  StartAgent(options);
  ASSERT_TRUE(tallyd_->WaitConnected());
  // The watcher has looked and found no file: nothing happened.
  ASSERT_TRUE(WaitCount(&Agent::Counters::num_notice_checks, 1));
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  WriteFile("notice", "");
  auto notice = tallyd_->WaitFor([](const auto& m) { return m.has_notice(); });
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(notice->notice().cause(), "notice_file");
  // Idle: it leaves as soon as the notice is written.
  EXPECT_NE(RunReturned(absl::Seconds(20)), absl::InfinitePast());
}

TEST_F(AgentTest, APreemptionWhileDisconnectedDeliversItsReportsWhenTallydReturns) {
  StartTallyd();
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner* fake = runner.get();
  StartAgent(Options({}), std::move(runner));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/1")));
  ASSERT_TRUE(fake->WaitStarted(1));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_progress(); }));
  const int port = StopTallyd();
  ASSERT_TRUE(WaitCount(&Agent::Counters::num_connections_ended, 1));  // disconnected
  agent_->Preempt("sigterm");
  // The attempt checkpoints and exits though nobody hears it yet: the
  // notice, its checkpoint and its exit are queued, and the worker keeps
  // trying to deliver them (a connection failed since, and Run() went on).
  ASSERT_TRUE(WaitQueued(3));
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_connections_ended));
  EXPECT_EQ(fake->seen()[0].stop, train::StopKind::kPreempt);
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  StartTallyd(port);  // back, before the deadline
  const absl::Time returned = RunReturned(absl::Seconds(20));
  ASSERT_NE(returned, absl::InfinitePast());
  // A Hello that still lists the attempt (its exit is undelivered), the
  // notice again with the time left, then its reports.
  const auto tail = tallyd_->received();
  ASSERT_FALSE(tail.empty());
  ASSERT_EQ(tail[0].hello().running_size(), 1);
  EXPECT_EQ(tail[0].hello().running(0).job(), "jobs/1");
  EXPECT_THAT(Kinds(tail),
              ::testing::ElementsAre("hello", "notice sigterm", "checkpoint jobs/1 7",
                                     "exit jobs/1 ATTEMPT_OUTCOME_PREEMPTED"));
  EXPECT_LT(tail[1].notice().deadline_seconds(), 25);
  EXPECT_EQ(tail.back().exit().preemption_cause(), "sigterm");
}

TEST_F(AgentTest, AnIdleWorkerWithoutTallydLeavesAtOnceOnAPreemption) {
  StartAgent(Options({}), nullptr, FakeSeams(/*server=*/nullptr));
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(10),
                           [this] { return connections_.Attempts().size() >= 2; }));
  // Run() returns with the agent's clock standing still: it waits neither
  // for the deadline nor for the next connection.
  agent_->Preempt("sigterm");
  EXPECT_NE(RunReturned(absl::Seconds(20)), absl::InfinitePast());
}

TEST_F(AgentTest, ConnectionsAreRetriedAfterTheBackoffOnTheAgentsClock) {
  AgentOptions options = Options({});
  options.initial_backoff = absl::Milliseconds(100);
  options.max_backoff = absl::Milliseconds(400);
  StartAgent(options, nullptr, FakeSeams(/*server=*/nullptr, /*backoff_seed=*/5));
  ASSERT_TRUE(WaitUntil([this] { return !connections_.Attempts().empty(); }));
  // Real time passing is not the agent's time: it looks at its clock again
  // and again, and does not retry until the clock moves.
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_backoff_checks, 3));
  EXPECT_EQ(connections_.Attempts().size(), 1u);

  // The waits are the Backoff's with the same seed: 100 ms doubling to the
  // 400 ms cap, each jittered below its bound. The clock moves only here,
  // so each retry comes exactly when its wait is over, not a tick before.
  constexpr size_t kAttempts = 6;
  Backoff expected(options.initial_backoff, options.max_backoff, 5);
  for (size_t i = 1; i < kAttempts; ++i) {
    const absl::Duration bound = expected.bound();
    const absl::Duration wait = expected.Next(absl::ZeroDuration());
    EXPECT_LT(wait, bound);
    EXPECT_GE(wait, bound / 2);
    ASSERT_TRUE(WaitForMore(&Agent::Counters::num_backoff_checks)) << "attempt " << i;  // waiting
    clock_.Advance(wait - absl::Milliseconds(1));
    ASSERT_TRUE(WaitForMore(&Agent::Counters::num_backoff_checks, 2)) << "attempt " << i;
    ASSERT_EQ(connections_.Attempts().size(), i) << "attempt " << i;
    clock_.Advance(absl::Milliseconds(1));
    ASSERT_TRUE(WaitUntil([&] { return connections_.Attempts().size() > i; }))
        << "attempt " << i;
  }
  const std::vector<absl::Time> at = connections_.Attempts();
  ASSERT_EQ(at.size(), kAttempts);
  Backoff again(options.initial_backoff, options.max_backoff, 5);
  for (size_t i = 1; i < kAttempts; ++i) {
    EXPECT_EQ(at[i] - at[i - 1], again.Next(absl::ZeroDuration())) << "attempt " << i;
  }
  EXPECT_THAT(Logged(), HasSubstr("cannot reach tallyd at " + address_ +
                                  ": failed to connect to all addresses"));
}

// A tallyd that reads the Hello and then refuses the stream (a standby)
// never reads what was written after it: reports stay queued until a tallyd
// welcomes the worker, and then arrive in order.
TEST_F(AgentTest, ReportsWaitForTheWelcomeSoAStreamRefusedAfterTheHelloLosesNone) {
  StartTallyd();
  // Frequent heartbeats: the writer wakes often, reports or not.
  tallyd_->set_heartbeat_interval(absl::Milliseconds(20));
  HeldRunner* held = nullptr;
  Reporter* reporter = StartHeldAttempt("jobs/1", 2, &held);
  ASSERT_NE(reporter, nullptr);
  reporter->Progress(ProgressAt("jobs/1", 2, 4));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_progress(); }));

  tallyd_->set_welcome(false);
  ASSERT_TRUE(tallyd_->Hangup());
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(40), [&] { return Hellos() >= 2; }));
  const tally::v1::EvalResult eval = EvalAt("jobs/1", 2, 5);
  reporter->Progress(ProgressAt("jobs/1", 2, 5));
  reporter->Eval(eval);
  // The writer has chosen what to write since the reports were queued: a
  // heartbeat, not them. (Had it written them, they would show here or,
  // dropped as written, be missing from the next stream below.)
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_writes_chosen));
  EXPECT_THAT(Kinds(tallyd_->received()), ::testing::ElementsAre("hello", "progress jobs/1 4",
                                                                  "hello"));

  // The unwelcoming tallyd ends the stream; the next one welcomes.
  tallyd_->set_welcome(true);
  ASSERT_TRUE(tallyd_->Hangup());
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(40), [&] { return Hellos() >= 3; }));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_eval(); }));
  EXPECT_THAT(Kinds(tallyd_->received()),
              ::testing::ElementsAre("hello", "progress jobs/1 4", "hello", "hello",
                                     "progress jobs/1 5", "eval jobs/1 5"));
}

TEST_F(AgentTest, AfterAReconnectionTheHelloListsTheRunningAttemptAndQueuedReportsKeepTheirOrder) {
  StartTallyd();
  HeldRunner* held = nullptr;
  Reporter* reporter = StartHeldAttempt("jobs/1", 3, &held);
  ASSERT_NE(reporter, nullptr);
  reporter->Progress(ProgressAt("jobs/1", 3, 4));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_progress(); }));

  // The stream fails and so does the next connection: the agent is
  // disconnected (it made a second attempt) when the attempt reports.
  connections_.SetDown(true);
  ASSERT_TRUE(tallyd_->Hangup());
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(40),
                           [&] { return connections_.Attempts().size() >= 2; }));
  const tally::v1::EvalResult eval = EvalAt("jobs/1", 3, 5);
  tally::v1::CheckpointRecord checkpoint;
  checkpoint.set_job("jobs/1");
  checkpoint.set_attempt(3);
  checkpoint.set_step(6);
  checkpoint.set_path("step-00000006.ckpt");
  reporter->Progress(ProgressAt("jobs/1", 3, 5));
  reporter->Eval(eval);
  reporter->Progress(ProgressAt("jobs/1", 3, 6));
  reporter->Checkpoint(checkpoint);
  reporter->Progress(ProgressAt("jobs/1", 3, 7));
  reporter->Progress(ProgressAt("jobs/1", 3, 8));  // takes step 7's place

  connections_.SetDown(false);
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(40), [&] { return Hellos() >= 2; }));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) {
    return m.has_progress() && m.progress().step() == 8;
  }));

  const auto received = tallyd_->received();
  const auto second = std::find_if(std::next(received.begin()), received.end(),
                                   [](const auto& m) { return m.has_hello(); });
  ASSERT_NE(second, received.end());
  EXPECT_THAT(Kinds(std::vector<tally::v1::WorkerMessage>(received.begin(), second)),
              ::testing::ElementsAre("hello", "progress jobs/1 4"));
  EXPECT_EQ(received.front().hello().running_size(), 0);
  // Re-adoption: the new Hello lists the attempt still running here.
  ASSERT_EQ(second->hello().running_size(), 1);
  EXPECT_EQ(second->hello().running(0).job(), "jobs/1");
  EXPECT_EQ(second->hello().running(0).attempt(), 3);
  // A newer step never overtakes the evaluation or the checkpoint queued
  // before it.
  EXPECT_THAT(Kinds(std::vector<tally::v1::WorkerMessage>(second, received.end())),
              ::testing::ElementsAre("hello", "progress jobs/1 5", "eval jobs/1 5",
                                     "progress jobs/1 6", "checkpoint jobs/1 6",
                                     "progress jobs/1 8"));

  // tallyd controls the re-adopted attempt over the new stream.
  tally::v1::ControllerMessage stop;
  stop.mutable_stop()->set_job("jobs/1");
  stop.mutable_stop()->set_attempt(3);
  ASSERT_TRUE(tallyd_->Send(stop));
  auto exit = tallyd_->WaitFor(ExitOf("jobs/1"));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit().outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED);
  EXPECT_EQ(held->stopped_with(), train::StopKind::kNow);
  EXPECT_GE(connections_.Attempts().size(), 3u);
}

// A tallyd that dies after reading a report and before committing it never
// acknowledges it: the next stream carries it again, first and in order,
// renumbered; what was acknowledged is not sent again.
TEST_F(AgentTest, AReportTallydDidNotAcknowledgeIsSentAgainOnTheNextStream) {
  StartTallyd();
  tallyd_->set_acks(true);
  HeldRunner* held = nullptr;
  Reporter* reporter = StartHeldAttempt("jobs/1", 2, &held);
  ASSERT_NE(reporter, nullptr);
  const tally::v1::EvalResult eval = EvalAt("jobs/1", 2, 5);
  reporter->Progress(ProgressAt("jobs/1", 2, 5));
  reporter->Eval(eval);
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_eval(); }));
  std::vector<tally::v1::WorkerMessage> first = WithoutHeartbeats(tallyd_->received());
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].seq(), 0u);  // the Hello
  EXPECT_EQ(first[1].seq(), 1u);
  EXPECT_EQ(first[2].seq(), 2u);

  // The progress was taken; the stream breaks before the evaluation's Ack.
  ASSERT_TRUE(tallyd_->Ack(1));
  ASSERT_TRUE(WaitQueued(1));  // the Ack is read before the hang-up
  ASSERT_TRUE(tallyd_->Hangup());
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(40), [&] { return Hellos() >= 2; }));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) { return m.has_eval() && m.seq() == 1; }));
  std::vector<tally::v1::WorkerMessage> second = WithoutHeartbeats(tallyd_->received());
  second.erase(second.begin(), second.begin() + 3);
  EXPECT_THAT(Kinds(second), ::testing::ElementsAre("hello", "eval jobs/1 5"));

  // Acknowledged now: a third stream carries only what is new.
  ASSERT_TRUE(tallyd_->Ack(1));
  ASSERT_TRUE(WaitQueued(0));
  ASSERT_TRUE(tallyd_->Hangup());
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(40), [&] { return Hellos() >= 3; }));
  reporter->Progress(ProgressAt("jobs/1", 2, 6));
  ASSERT_TRUE(tallyd_->WaitFor([](const auto& m) {
    return m.has_progress() && m.progress().step() == 6;
  }));
  std::vector<tally::v1::WorkerMessage> third = WithoutHeartbeats(tallyd_->received());
  third.erase(third.begin(), third.begin() + 5);
  EXPECT_THAT(Kinds(third), ::testing::ElementsAre("hello", "progress jobs/1 6"));
  EXPECT_EQ(third[1].seq(), 1u);
}

TEST_F(AgentTest, ThePreemptionDeadlineIsKeptOnTheAgentsClock) {
  StartTallyd();
  AgentOptions options = Options({});
  options.preemption_deadline = absl::Seconds(25);
  auto runner = std::make_unique<FakeRunner>(/*ignore_preempt=*/true);
  FakeRunner* fake = runner.get();
  StartAgent(options, std::move(runner), FakeSeams(server_.get()));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/1")));
  ASSERT_TRUE(fake->WaitStarted(1));
  agent_->Preempt("sigterm");
  auto notice = tallyd_->WaitFor([](const auto& m) { return m.has_notice(); });
  ASSERT_TRUE(notice.has_value());
  EXPECT_EQ(notice->notice().deadline_seconds(), 25);  // no time passed on the clock
  // Up to the delivery allowance (2 s) before the deadline, the attempt may
  // still checkpoint: however long that takes in real time. The agent has
  // looked at its clock since it moved, and waits on.
  clock_.Advance(absl::Seconds(22));
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_deadline_checks));
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  EXPECT_FALSE(agent_->HasAbandonedAttempts());
  clock_.Advance(absl::Seconds(1) + absl::Milliseconds(1));
  auto exit = tallyd_->WaitFor(ExitOf("jobs/1"));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit().outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
  EXPECT_THAT(exit->exit().reason(),
              HasSubstr("preemption checkpoint did not finish within the 25s deadline"));
  EXPECT_NE(RunReturned(absl::Seconds(20)), absl::InfinitePast());
  EXPECT_TRUE(agent_->HasAbandonedAttempts());
}

tally::v1::ControllerMessage StopMessage(const std::string& job, int32_t attempt = 1) {
  tally::v1::ControllerMessage m;
  m.mutable_stop()->set_job(job);
  m.mutable_stop()->set_attempt(attempt);
  m.mutable_stop()->set_reason("cancelled");
  return m;
}

TEST_F(AgentTest, AnIdleWorkerLeavesAfterExitWhenIdleButNeverWhileAnAttemptRuns) {
  StartTallyd();
  AgentOptions options = Options({});
  options.exit_when_idle = absl::Seconds(30);
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner* fake = runner.get();
  StartAgent(options, std::move(runner), FakeSeams(server_.get()));
  ASSERT_TRUE(tallyd_->WaitConnected());
  // The Hello's write returned: the timer started.
  ASSERT_TRUE(WaitCount(&Agent::Counters::num_hellos, 1));
  // Each "stays" below: the idle watcher has looked since the clock moved,
  // and left the worker be.
  clock_.Advance(absl::Seconds(29));
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_idle_checks));
  EXPECT_FALSE(agent_->LeftIdle());

  // A job arrives in time; it runs far past the idle timeout untouched.
  ASSERT_TRUE(tallyd_->Send(AssignmentMessage("jobs/1")));
  ASSERT_TRUE(fake->WaitStarted(1));
  clock_.Advance(absl::Minutes(10));
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_idle_checks));
  EXPECT_FALSE(agent_->LeftIdle());
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  EXPECT_EQ(fake->seen()[0].stop, train::StopKind::kNone);

  // The timer starts again at the attempt's exit (set before the exit is
  // queued, so before tallyd reads it).
  ASSERT_TRUE(tallyd_->Send(StopMessage("jobs/1")));
  ASSERT_TRUE(tallyd_->WaitFor(ExitOf("jobs/1")).has_value());
  clock_.Advance(absl::Seconds(29));
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_idle_checks));
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  EXPECT_FALSE(agent_->LeftIdle());
  clock_.Advance(absl::Seconds(1));
  ASSERT_NE(RunReturned(absl::Seconds(20)), absl::InfinitePast()) << "Run() did not return";
  {
    absl::MutexLock lock(&run_mu_);
    EXPECT_EQ(run_rc_, 0);
  }
  EXPECT_TRUE(agent_->LeftIdle());
  EXPECT_THAT(Kinds(tallyd_->received()),
              ::testing::ElementsAre("hello", "progress jobs/1 7",
                                     "exit jobs/1 ATTEMPT_OUTCOME_STOPPED", "notice idle"));
  EXPECT_THAT(Logged(), HasSubstr("--exit_when_idle"));
}

TEST_F(AgentTest, AnAssignmentRacingTheIdleNoticeIsNeverRunNorFailed) {
  StartTallyd();
  tallyd_->ReplyToNotice(AssignmentMessage("jobs/2"));
  AgentOptions options = Options({});
  options.exit_when_idle = absl::Seconds(5);
  auto runner = std::make_unique<FakeRunner>();
  FakeRunner* fake = runner.get();
  StartAgent(options, std::move(runner), FakeSeams(server_.get()));
  ASSERT_TRUE(tallyd_->WaitConnected());
  ASSERT_TRUE(WaitCount(&Agent::Counters::num_hellos, 1));  // the timer started
  clock_.Advance(absl::Seconds(5));
  // If the answer was queued after the stream ended, the worker reconnects
  // to deliver it (the wait before that is on the agent's clock).
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Milliseconds(5), [this] {
    return RunReturned(absl::ZeroDuration()) != absl::InfinitePast();
  })) << "Run() did not return";
  {
    absl::MutexLock lock(&run_mu_);
    EXPECT_EQ(run_rc_, 0);
  }
  EXPECT_TRUE(fake->seen().empty());
  EXPECT_FALSE(agent_->HasAbandonedAttempts());
  EXPECT_THAT(Logged(), HasSubstr("attempt 1 of jobs/2: refused, the worker is going away (idle)"));
  // The answer reaches tallyd if the stream still takes it; if the stream
  // ended first, tallyd counts the attempt preempted all the same (its
  // worker went away after a notice). Never a failure.
  for (const auto& m : tallyd_->received()) {
    if (!m.has_exit()) continue;
    EXPECT_EQ(m.exit().outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED);
    EXPECT_EQ(m.exit().preemption_cause(), "idle");
  }
}

TEST_F(AgentTest, WithoutTallydAnIdleWorkerKeepsTryingInsteadOfLeaving) {
  AgentOptions options = Options({});
  options.exit_when_idle = absl::Seconds(5);
  StartAgent(options, nullptr, FakeSeams(nullptr));
  ASSERT_TRUE(AdvanceUntil(&clock_, absl::Seconds(1),
                           [this] { return connections_.Attempts().size() >= 20; }));
  // The idle watcher has looked since, and left the worker be.
  ASSERT_TRUE(WaitForMore(&Agent::Counters::num_idle_checks));
  EXPECT_EQ(RunReturned(absl::ZeroDuration()), absl::InfinitePast());
  EXPECT_FALSE(agent_->LeftIdle());
}

}  // namespace
}  // namespace tally::worker
