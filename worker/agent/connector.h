// Connector: how the agent reaches tallyd. The agent calls Connect() once
// per connection, with the credentials read for that connection, and opens
// its Workers.Connect stream on the stub it returns; a connection that
// fails shows as that stream's status, so Connect() itself does not fail.
//
// Thread-safety: the agent calls Connect() from Run()'s thread only.
#ifndef TALLY_WORKER_AGENT_CONNECTOR_H_
#define TALLY_WORKER_AGENT_CONNECTOR_H_

#include <grpcpp/channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tally/v1/workers.grpc.pb.h"
#include "worker/agent/credentials.h"

namespace tally::worker {

class Connector {
 public:
  virtual ~Connector() = default;
  virtual std::unique_ptr<tally::v1::Workers::StubInterface> Connect(
      const Credentials& credentials) = 0;
};

// Makes the channel for one connection to `address`; the default is
// grpc::CreateCustomChannel. Tests pass one that records the addresses.
using ChannelFactory = std::function<std::shared_ptr<grpc::Channel>(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& args)>;

// A fresh gRPC channel for every connection: TLS when the credentials hold
// a CA (mutual when they hold a certificate and key), plaintext otherwise;
// keepalive pings every 10 s, also while idle.
//
// `controller` is one address (HOST:PORT, or a gRPC target such as
// dns:///tally:50051) or several separated by commas, as
// tally::ParseControllerList accepts them (the caller validates; blanks
// around commas and empty entries are ignored here). Connections go to the
// addresses round-robin, one further at each Connect(): the first to the
// first address, a reconnect to the next. Whatever ended the last
// connection (tallyd unreachable, a standby answering UNAVAILABLE, the
// leader going away), the next attempt tries the next tallyd, so a worker
// given the leader and its standbys finds whichever leads within one round.
class GrpcConnector final : public Connector {
 public:
  explicit GrpcConnector(const std::string& controller, ChannelFactory factory = nullptr);
  std::unique_ptr<tally::v1::Workers::StubInterface> Connect(
      const Credentials& credentials) override;

  const std::vector<std::string>& addresses() const { return addresses_; }
  // The address the next Connect() dials.
  const std::string& next_address() const { return addresses_[next_]; }

 private:
  std::vector<std::string> addresses_;  // never empty
  size_t next_ = 0;
  ChannelFactory factory_;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_CONNECTOR_H_
