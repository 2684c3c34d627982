#include "server/api/services.h"

#include <grpcpp/grpcpp.h>

#include "google/protobuf/descriptor.h"

// MetricsInterceptorFactory: tally_grpc_server_* for every call.
namespace tally::api {

namespace {

const char* TypeLabel(grpc::experimental::ServerRpcInfo::Type type) {
  switch (type) {
    case grpc::experimental::ServerRpcInfo::Type::UNARY:
      return "unary";
    case grpc::experimental::ServerRpcInfo::Type::CLIENT_STREAMING:
      return "client_stream";
    case grpc::experimental::ServerRpcInfo::Type::SERVER_STREAMING:
      return "server_stream";
    case grpc::experimental::ServerRpcInfo::Type::BIDI_STREAMING:
      return "bidi_stream";
  }
  return "unknown";
}

const char* TypeLabel(const google::protobuf::MethodDescriptor& m) {
  if (m.client_streaming()) return m.server_streaming() ? "bidi_stream" : "client_stream";
  return m.server_streaming() ? "server_stream" : "unary";
}

// One call: started when created, handled once with the code the client
// sees. A call the client abandoned (a killed worker's stream, a deadline)
// counts as Canceled whatever status the handler then sends, and a call that
// ends without sending a status counts as Canceled too.
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(grpc::experimental::ServerRpcInfo* info, const Clock* clock,
                     metrics::GrpcServerMetrics* metrics)
      : info_(info),
        clock_(clock),
        start_(clock->Now()),
        metrics_(metrics),
        call_(metrics->Started(info->method() ? info->method() : "", TypeLabel(info->type()))) {}

  ~MetricsInterceptor() override {
    if (!handled_) {
      metrics_->Handled(call_, static_cast<int>(grpc::StatusCode::CANCELLED),
                        absl::ToDoubleSeconds(clock_->Now() - start_));
    }
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      call_.received->Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
      call_.sent->Increment();
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        !handled_) {
      handled_ = true;
      grpc::StatusCode code = methods->GetSendStatus().error_code();
      if (info_->server_context() != nullptr && info_->server_context()->IsCancelled()) {
        code = grpc::StatusCode::CANCELLED;
      }
      metrics_->Handled(call_, static_cast<int>(code),
                        absl::ToDoubleSeconds(clock_->Now() - start_));
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
  const Clock* const clock_;
  const absl::Time start_;
  metrics::GrpcServerMetrics* const metrics_;
  metrics::GrpcServerMetrics::Call call_;
  bool handled_ = false;
};

}  // namespace

MetricsInterceptorFactory::MetricsInterceptorFactory(metrics::Registry* registry,
                                                     const Clock* clock,
                                                     const std::vector<std::string>& services)
    : clock_(clock), metrics_(registry) {
  for (const std::string& name : services) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i) {
      const google::protobuf::MethodDescriptor& m = *service->method(i);
      metrics_.AddMethod(absl::StrCat("/", service->full_name(), "/", m.name()), TypeLabel(m));
    }
  }
}

grpc::experimental::Interceptor* MetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new MetricsInterceptor(info, clock_, &metrics_);
}

}  // namespace tally::api
