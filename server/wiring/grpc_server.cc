#include "server/wiring/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/api/grpc_server_limits.h"
#include "server/api/services.h"

namespace tally::wiring {

absl::StatusOr<GrpcServer> StartGrpcServer(const GrpcServerInputs& in, api::Frontend* frontend) {
  grpc::EnableDefaultHealthCheckService(true);
  if (in.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  api::ApplyGrpcServerLimits(in.limits, &builder);
  GrpcServer g;
  builder.AddListeningPort(in.listen, in.credentials, &g.port);
  for (grpc::Service* service : frontend->services()) builder.RegisterService(service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<api::MetricsInterceptorFactory>(
      in.registry, in.clock,
      std::vector<std::string>{"tally.v1.Jobs", "tally.v1.Experiments", "tally.v1.Workers"}));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  g.server = builder.BuildAndStart();
  if (g.server == nullptr || g.port == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", in.listen, " (address in use?)"));
  }
  grpc::HealthCheckServiceInterface* health = g.server->GetHealthCheckService();
  health->SetServingStatus("", false);
  health->SetServingStatus(api::kLivenessService, true);
  return g;
}

}  // namespace tally::wiring
