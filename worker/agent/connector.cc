#include "worker/agent/connector.h"

#include <grpcpp/grpcpp.h>

namespace tally::worker {
namespace {

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentialsFor(const Credentials& c) {
  if (c.ca_pem.empty()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = c.ca_pem;
  ssl.pem_private_key = c.key_pem;
  ssl.pem_cert_chain = c.cert_pem;
  return grpc::SslCredentials(ssl);
}

}  // namespace

std::unique_ptr<tally::v1::Workers::StubInterface> GrpcConnector::Connect(
    const Credentials& credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A fresh channel for every connection: one that failed carries gRPC's
  // own reconnect backoff (1 s growing to 2 min), which kept workers away
  // from a restarted tallyd for seconds, past its heartbeat timeout, so
  // attempts that could have been re-adopted were lost. The agent's own
  // backoff (with jitter) paces the retries instead.
  return tally::v1::Workers::NewStub(
      grpc::CreateCustomChannel(controller_, ChannelCredentialsFor(credentials), args));
}

}  // namespace tally::worker
