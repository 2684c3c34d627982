#include "server/metrics/grpc_metrics.h"

namespace tally::metrics {
namespace {

constexpr int kNumCodes = 17;

// grpc-prometheus' default buckets.
Histogram::BucketBoundaries HandlingBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

}  // namespace

const char* GrpcServerMetrics::CodeName(int code) {
  static const char* const kNames[kNumCodes] = {
      "OK",       "Canceled",        "Unknown",          "InvalidArgument",
      "DeadlineExceeded",   "NotFound",        "AlreadyExists",    "PermissionDenied",
      "ResourceExhausted",  "FailedPrecondition", "Aborted",       "OutOfRange",
      "Unimplemented",      "Internal",        "Unavailable",      "DataLoss",
      "Unauthenticated"};
  return code >= 0 && code < kNumCodes ? kNames[code] : "Unknown";
}

GrpcServerMetrics::GrpcServerMetrics(Registry* registry) {
  started_ = &BuildCounter()
                  .Name("grpc_server_started_total")
                  .Help("Total number of RPCs started on the server.")
                  .Register(*registry);
  handled_ = &BuildCounter()
                  .Name("grpc_server_handled_total")
                  .Help("Total number of RPCs completed on the server, regardless of success "
                        "or failure.")
                  .Register(*registry);
  received_ = &BuildCounter()
                   .Name("grpc_server_msg_received_total")
                   .Help("Total number of RPC stream messages received on the server.")
                   .Register(*registry);
  sent_ = &BuildCounter()
               .Name("grpc_server_msg_sent_total")
               .Help("Total number of gRPC stream messages sent by the server.")
               .Register(*registry);
  handling_seconds_ = &BuildHistogram()
                           .Name("grpc_server_handling_seconds")
                           .Help("Histogram of response latency (seconds) of gRPC that had "
                                 "been application-level handled by the server (unary calls).")
                           .Register(*registry);
}

Labels GrpcServerMetrics::MethodLabels(const std::string& full_method, const std::string& type) {
  std::string name = full_method;
  if (!name.empty() && name[0] == '/') name.erase(0, 1);
  const size_t slash = name.find('/');
  Labels l = {{"grpc_type", type}};
  if (slash == std::string::npos || slash == 0 || slash + 1 == name.size()) {
    l["grpc_service"] = "unknown";
    l["grpc_method"] = name.empty() ? "unknown" : name;
  } else {
    l["grpc_service"] = name.substr(0, slash);
    l["grpc_method"] = name.substr(slash + 1);
  }
  return l;
}

void GrpcServerMetrics::AddMethod(const std::string& full_method, const std::string& type) {
  const Labels m = MethodLabels(full_method, type);
  started_->Add(m);
  received_->Add(m);
  sent_->Add(m);
  for (int code = 0; code < kNumCodes; ++code) {
    Labels h = m;
    h["grpc_code"] = CodeName(code);
    handled_->Add(h);
  }
  if (type == "unary") handling_seconds_->Add(m, HandlingBuckets());
}

GrpcServerMetrics::Call GrpcServerMetrics::Started(const std::string& full_method,
                                                   const std::string& type) {
  Call c;
  c.method = MethodLabels(full_method, type);
  c.unary = type == "unary";
  started_->Add(c.method).Increment();
  c.received = &received_->Add(c.method);
  c.sent = &sent_->Add(c.method);
  return c;
}

void GrpcServerMetrics::Handled(const Call& call, int code, double seconds) {
  Labels h = call.method;
  h["grpc_code"] = CodeName(code);
  handled_->Add(h).Increment();
  if (call.unary) handling_seconds_->Add(call.method, HandlingBuckets()).Observe(seconds);
}

}  // namespace tally::metrics
