// The gRPC services of tallyd: Jobs (users) and Workers (tally-worker
// streams), and the interceptor that counts requests by method and code.
// Only this folder and main.cc include grpcpp.
#ifndef TALLY_SERVER_API_SERVICES_H_
#define TALLY_SERVER_API_SERVICES_H_

#include <memory>

#include "common/clock.h"
#include "server/api/core.h"
#include "server/metrics/registry.h"
#include "tally/v1/jobs.grpc.pb.h"
#include "tally/v1/workers.grpc.pb.h"

#include <grpcpp/support/server_interceptor.h>

namespace tally::api {

class JobsService final : public tally::v1::Jobs::Service {
 public:
  explicit JobsService(Core* core) : core_(core) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const tally::v1::SubmitJobRequest*,
                         tally::v1::Job*) override;
  grpc::Status GetJob(grpc::ServerContext*, const tally::v1::GetJobRequest*,
                      tally::v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const tally::v1::ListJobsRequest*,
                        tally::v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const tally::v1::CancelJobRequest*,
                         tally::v1::Job*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const tally::v1::WatchJobRequest*,
                        grpc::ServerWriter<tally::v1::JobEvent>*) override;
  grpc::Status ListCheckpoints(grpc::ServerContext*,
                               const tally::v1::ListCheckpointsRequest*,
                               tally::v1::ListCheckpointsResponse*) override;
  grpc::Status EstimateCost(grpc::ServerContext*, const tally::v1::EstimateCostRequest*,
                            tally::v1::CostEstimate*) override;

 private:
  Core* const core_;
};

class WorkersService final : public tally::v1::Workers::Service {
 public:
  explicit WorkersService(Core* core) : core_(core) {}
  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<tally::v1::ControllerMessage,
                               tally::v1::WorkerMessage>* stream) override;

 private:
  Core* const core_;
};

// tally_grpc_requests_total{method,code} and
// tally_grpc_request_duration_seconds{method}.
class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  MetricsInterceptorFactory(metrics::Registry* registry, const Clock* clock);
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const Clock* clock_;
  metrics::Family<metrics::Counter>* requests_;
  metrics::Family<metrics::Histogram>* duration_;
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_SERVICES_H_
