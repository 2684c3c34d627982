// The agent against a fake tallyd on loopback (port 0): the worker token in
// the Connect stream's metadata, files read again on every reconnect, mutual
// TLS, and the slower retry after tallyd refuses the worker's credentials.
#include "worker/agent/agent.h"

#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"

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

class NoRunner final : public Runner {
 public:
  tally::v1::AttemptExit Run(const tally::v1::Assignment&, Reporter*,
                             const train::StopFlag*) override {
    ADD_FAILURE() << "no assignment was sent";
    return {};
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
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      if (connections().size() >= n) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

 private:
  const grpc::Status end_with_;
  absl::Mutex mu_;
  std::vector<Connection> connections_ ABSL_GUARDED_BY(mu_);
};

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

  AgentOptions Options(CredentialFiles files) {
    AgentOptions o;
    o.controller = address_;
    o.worker_id = "w1";
    o.initial_backoff = absl::Milliseconds(10);
    o.max_backoff = absl::Milliseconds(40);
    o.credential_files = files;
    absl::StatusOr<Credentials> c = LoadCredentials(files);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) o.credentials = *c;
    return o;
  }

  void StartAgent(AgentOptions options) {
    agent_ = std::make_unique<Agent>(std::move(options), std::make_unique<NoRunner>());
    runner_thread_ = std::thread([this] { agent_->Run(); });
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    const std::string tmp = path + ".tmp";
    std::ofstream(tmp, std::ios::binary) << text;
    std::filesystem::rename(tmp, path);  // as a rotation would: never half-written
    return path;
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
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Agent> agent_;
  std::thread runner_thread_;
};

TEST_F(AgentTest, TheTokenIsSentAsBearerMetadataAndReadAgainOnReconnect) {
  StartServer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "closing"));
  CredentialFiles files;
  files.token = WriteFile("token", "first-token\n");
  StartAgent(Options(files));
  ASSERT_TRUE(service_->WaitFor(1));
  WriteFile("token", "  rotated-token \n");
  // Every connection after the rotation carries the new token.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (absl::Now() < deadline &&
         service_->connections().back().authorization != "Bearer rotated-token") {
    absl::SleepFor(absl::Milliseconds(5));
  }
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
  StartAgent(options);
  ASSERT_TRUE(service_->WaitFor(3));
  const auto c = service_->connections();
  for (size_t i = 1; i < c.size(); ++i) {
    // 10 to 40 ms apart after other errors; here at least the interval.
    EXPECT_GE(c[i].time - c[i - 1].time, absl::Milliseconds(390)) << "connection " << i;
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
  StartAgent(options);
  ASSERT_TRUE(service_->WaitFor(2));
  const auto c = service_->connections();
  EXPECT_GE(c[1].time - c[0].time, absl::Milliseconds(390));
  EXPECT_THAT(Logged(), AllOf(HasSubstr("PERMISSION_DENIED"),
                              HasSubstr("worker id w1 is not yours")));
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
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_TRUE(service_->connections().empty());
}

}  // namespace
}  // namespace tally::worker
