#include "worker/agent/connector.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "spdlog/spdlog.h"

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

std::vector<std::string> SplitAddresses(const std::string& controller) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(controller, ',')) {
    part = absl::StripAsciiWhitespace(part);
    if (!part.empty()) out.emplace_back(part);
  }
  // Nothing to rotate over: dial the text as given, so the connection's
  // error names it.
  if (out.empty()) out.push_back(controller);
  return out;
}

}  // namespace

GrpcConnector::GrpcConnector(const std::string& controller, ChannelFactory factory)
    : addresses_(SplitAddresses(controller)), factory_(std::move(factory)) {
  if (!factory_) {
    factory_ = [](const std::string& address,
                  const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                  const grpc::ChannelArguments& args) {
      return grpc::CreateCustomChannel(address, credentials, args);
    };
  }
}

std::unique_ptr<tally::v1::Workers::StubInterface> GrpcConnector::Connect(
    const Credentials& credentials) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  const std::string& address = addresses_[next_];
  if (addresses_.size() > 1) {
    spdlog::info("connecting to tallyd at {} (address {} of {})", address, next_ + 1,
                 addresses_.size());
  }
  next_ = (next_ + 1) % addresses_.size();
  // A fresh channel for every connection: one that failed carries gRPC's
  // own reconnect backoff (1 s growing to 2 min), which kept workers away
  // from a restarted tallyd for seconds, past its heartbeat timeout, so
  // attempts that could have been re-adopted were lost. The agent's own
  // backoff (with jitter) paces the retries instead.
  return tally::v1::Workers::NewStub(factory_(address, ChannelCredentialsFor(credentials), args));
}

}  // namespace tally::worker
