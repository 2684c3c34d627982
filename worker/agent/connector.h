// Connector: how the agent reaches tallyd. The agent calls Connect() once
// per connection, with the credentials read for that connection, and opens
// its Workers.Connect stream on the stub it returns; a connection that
// fails shows as that stream's status, so Connect() itself does not fail.
//
// Thread-safety: the agent calls Connect() from Run()'s thread only.
#ifndef TALLY_WORKER_AGENT_CONNECTOR_H_
#define TALLY_WORKER_AGENT_CONNECTOR_H_

#include <memory>
#include <string>

#include "tally/v1/workers.grpc.pb.h"
#include "worker/agent/credentials.h"

namespace tally::worker {

class Connector {
 public:
  virtual ~Connector() = default;
  virtual std::unique_ptr<tally::v1::Workers::StubInterface> Connect(
      const Credentials& credentials) = 0;
};

// A fresh gRPC channel to `controller` (host:port) for every connection:
// TLS when the credentials hold a CA (mutual when they hold a certificate
// and key), plaintext otherwise; keepalive pings every 10 s, also while idle.
class GrpcConnector final : public Connector {
 public:
  explicit GrpcConnector(std::string controller) : controller_(std::move(controller)) {}
  std::unique_ptr<tally::v1::Workers::StubInterface> Connect(
      const Credentials& credentials) override;

 private:
  const std::string controller_;
};

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_CONNECTOR_H_
