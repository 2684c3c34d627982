// GrpcConnector's rotation over several tallyd addresses. A ChannelFactory
// seam records the addresses dialled and hands out in-process channels to
// fake tallyds, so no socket is opened.
#include "worker/agent/connector.h"

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::worker {
namespace {

using ::testing::ElementsAre;

// A tallyd that answers every Connect with `status` once it has read the
// worker's Hello, and counts them.
class FakeWorkers final : public tally::v1::Workers::Service {
 public:
  explicit FakeWorkers(grpc::Status status) : status_(std::move(status)) {}
  grpc::Status Connect(grpc::ServerContext*,
                       grpc::ServerReaderWriter<tally::v1::ControllerMessage,
                                                tally::v1::WorkerMessage>* stream) override {
    tally::v1::WorkerMessage hello;
    stream->Read(&hello);
    ++connections_;
    return status_;
  }
  int connections() const { return connections_.load(); }

 private:
  const grpc::Status status_;
  std::atomic<int> connections_{0};
};

// Records each address dialled; those in `servers` get an in-process
// channel to that server, others a channel that is never used.
struct Dialer {
  std::vector<std::string> dialled;
  std::map<std::string, grpc::Server*> servers;

  ChannelFactory Factory() {
    return [this](const std::string& address,
                  const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                  const grpc::ChannelArguments& args) {
      dialled.push_back(address);
      auto it = servers.find(address);
      if (it != servers.end()) return it->second->InProcessChannel(args);
      // Never called: a channel connects only on its first call.
      return grpc::CreateChannel("127.0.0.1:1", grpc::InsecureChannelCredentials());
    };
  }
};

std::unique_ptr<grpc::Server> InProcess(grpc::Service* service) {
  grpc::ServerBuilder builder;
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

// Opens the Workers.Connect stream on `stub`, sends a Hello and returns
// how the call ended.
grpc::Status OneConnection(tally::v1::Workers::StubInterface* stub) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Connect(&context);
  tally::v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id("w");
  stream->Write(hello);
  stream->WritesDone();
  return stream->Finish();
}

TEST(GrpcConnectorTest, OneAddressIsDialledEveryTime) {
  Dialer dialer;
  GrpcConnector connector("tallyd:50051", dialer.Factory());
  for (int i = 0; i < 3; ++i) ASSERT_NE(connector.Connect(Credentials{}), nullptr);
  EXPECT_THAT(dialer.dialled, ElementsAre("tallyd:50051", "tallyd:50051", "tallyd:50051"));
}

TEST(GrpcConnectorTest, EachReconnectDialsTheNextAddressRoundRobin) {
  Dialer dialer;
  GrpcConnector connector(" a:1, b:2 ,c:3", dialer.Factory());
  EXPECT_THAT(connector.addresses(), ElementsAre("a:1", "b:2", "c:3"));
  EXPECT_EQ(connector.next_address(), "a:1");
  for (int i = 0; i < 5; ++i) connector.Connect(Credentials{});
  EXPECT_THAT(dialer.dialled, ElementsAre("a:1", "b:2", "c:3", "a:1", "b:2"));
  EXPECT_EQ(connector.next_address(), "c:3");
}

TEST(GrpcConnectorTest, EmptyEntriesAreSkippedAndAnEmptyListDialsItsText) {
  Dialer dialer;
  GrpcConnector list("a:1,,b:2,", dialer.Factory());
  EXPECT_THAT(list.addresses(), ElementsAre("a:1", "b:2"));
  GrpcConnector nothing("", dialer.Factory());
  nothing.Connect(Credentials{});
  EXPECT_THAT(dialer.dialled, ElementsAre(""));
}

// A standby answers UNAVAILABLE; the next connection goes to the leader,
// the one after that back to the standby (the worker does not stick to a
// tallyd, it moves on whenever a connection ends).
TEST(GrpcConnectorTest, AStandbyAnsweringUnavailableIsFollowedByTheLeader) {
  FakeWorkers standby(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "this tallyd is a standby; the leader is leader:2 (epoch 4)"));
  FakeWorkers leader(grpc::Status::OK);
  auto standby_server = InProcess(&standby);
  auto leader_server = InProcess(&leader);
  ASSERT_NE(standby_server, nullptr);
  ASSERT_NE(leader_server, nullptr);
  Dialer dialer;
  dialer.servers = {{"standby:1", standby_server.get()}, {"leader:2", leader_server.get()}};
  GrpcConnector connector("standby:1,leader:2", dialer.Factory());

  auto first = connector.Connect(Credentials{});
  EXPECT_EQ(OneConnection(first.get()).error_code(), grpc::StatusCode::UNAVAILABLE);
  auto second = connector.Connect(Credentials{});
  EXPECT_TRUE(OneConnection(second.get()).ok());
  auto third = connector.Connect(Credentials{});
  EXPECT_EQ(OneConnection(third.get()).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(standby.connections(), 2);
  EXPECT_EQ(leader.connections(), 1);
  EXPECT_THAT(dialer.dialled, ElementsAre("standby:1", "leader:2", "standby:1"));
  standby_server->Shutdown();
  leader_server->Shutdown();
}

}  // namespace
}  // namespace tally::worker
