// The gRPC services of tallyd: Jobs (users) and Workers (tally-worker
// streams), and the interceptor that counts requests by method and code.
// Only this folder and main.cc include grpcpp.
#ifndef TALLY_SERVER_API_SERVICES_H_
#define TALLY_SERVER_API_SERVICES_H_

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "server/api/core.h"
#include "server/api/data_roots.h"
#include "server/api/gate.h"
#include "server/api/priority_caps.h"
#include "server/api/rate_limiter.h"
#include "server/api/stream_limiter.h"
#include "server/metrics/grpc_metrics.h"
#include "server/metrics/registry.h"
#include "tally/v1/experiments.grpc.pb.h"
#include "tally/v1/jobs.grpc.pb.h"
#include "tally/v1/workers.grpc.pb.h"

#include <grpcpp/support/server_interceptor.h>

namespace tally::api {

// Jobs. WatchJob runs on gRPC's callback API (no thread per stream): each
// stream is a JobWatch fed by the core's WatchHub. The other methods are
// synchronous.
class JobsService final
    : public tally::v1::Jobs::WithCallbackMethod_WatchJob<tally::v1::Jobs::Service> {
 public:
  struct Options {
    // Open WatchJob streams per caller and in all; 0: no limit.
    int64_t max_watch_streams_per_principal = 1000;
    int64_t max_watch_streams = 20000;
    // The last places of max_watch_streams, kept for callers holding none
    // (StreamLimiter::Options::reserved); 0: none kept.
    int64_t watch_streams_reserved = 0;
    // Submits per authenticated caller (limits.submits_per_second; shared
    // with ExperimentsService's CreateExperiment, must outlive the
    // service); null: no limit. The anonymous admin of a tallyd without
    // user authentication is not limited. Timed by `clock` (null: the real
    // clock).
    RateLimiter* submit_limiter = nullptr;
    const Clock* clock = nullptr;
    // Who an unauthenticated call is from (the key of the per-caller limit).
    PrincipalFn principal = PeerPrincipal;
    // Who may call (must outlive the service); null: everyone, as admin.
    const Gate* gate = nullptr;
    // Where a submitted spec's datasets must lie (must outlive the
    // service); null: anywhere. A spec naming one outside is refused
    // INVALID_ARGUMENT before it is queued.
    const DataRoots* data_roots = nullptr;
    // The highest priority each tenant's jobs may have (must outlive the
    // service); null: no cap beyond the spec's range.
    const PriorityCaps* priority_caps = nullptr;
  };
  JobsService(Core* core, Options options);
  explicit JobsService(Core* core) : JobsService(core, Options()) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const tally::v1::SubmitJobRequest*,
                         tally::v1::Job*) override;
  grpc::Status GetJob(grpc::ServerContext*, const tally::v1::GetJobRequest*,
                      tally::v1::Job*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const tally::v1::ListJobsRequest*,
                        tally::v1::ListJobsResponse*) override;
  grpc::Status CancelJob(grpc::ServerContext*, const tally::v1::CancelJobRequest*,
                         tally::v1::Job*) override;
  grpc::ServerWriteReactor<tally::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* context,
      const tally::v1::WatchJobRequest* request) override;
  grpc::Status ListCheckpoints(grpc::ServerContext*,
                               const tally::v1::ListCheckpointsRequest*,
                               tally::v1::ListCheckpointsResponse*) override;
  grpc::Status EstimateCost(grpc::ServerContext*, const tally::v1::EstimateCostRequest*,
                            tally::v1::CostEstimate*) override;
  // job_logs_service.cc. WatchJobLogs holds one of gRPC's threads while it
  // waits, so its streams have limits of their own (LogWatchLimits).
  grpc::Status GetJobLogs(grpc::ServerContext*, const tally::v1::GetJobLogsRequest*,
                          tally::v1::GetJobLogsResponse*) override;
  grpc::Status WatchJobLogs(grpc::ServerContext*, const tally::v1::WatchJobLogsRequest*,
                            grpc::ServerWriter<tally::v1::LogLine>*) override;

 private:
  static StreamLimiter::Options LogWatchLimits();
  // The job `id` as `p` may see it: NOT_FOUND (as for a job that does not
  // exist) when it belongs to another tenant.
  absl::StatusOr<store::JobRecord> VisibleJob(const auth::Principal& p, int64_t id) const;

  Core* const core_;
  const PrincipalFn principal_;
  const Gate* const gate_;
  const DataRoots* const data_roots_;
  const PriorityCaps* const priority_caps_;
  RateLimiter* const submit_limiter_;
  const Clock* const clock_;
  StreamLimiter watch_limiter_;
  StreamLimiter log_watch_limiter_{LogWatchLimits()};
};

// Experiments, synchronous. A WatchExperiment stream holds one of gRPC's
// threads while it waits (experiments are few and their events rare), so
// streams are limited like WatchJob's, with their own, smaller, limits.
class ExperimentsService final : public tally::v1::Experiments::Service {
 public:
  struct Options {
    int64_t max_watch_streams_per_principal = 64;
    int64_t max_watch_streams = 512;
    int64_t watch_streams_reserved = 0;
    // As JobsService's: CreateExperiment takes from the same bucket.
    RateLimiter* submit_limiter = nullptr;
    const Clock* clock = nullptr;
    PrincipalFn principal = PeerPrincipal;
    const Gate* gate = nullptr;
    // As JobsService's; every variant's resolved spec is checked.
    const DataRoots* data_roots = nullptr;
    const PriorityCaps* priority_caps = nullptr;
  };
  ExperimentsService(Core* core, Options options);
  explicit ExperimentsService(Core* core) : ExperimentsService(core, Options()) {}

  grpc::Status CreateExperiment(grpc::ServerContext*,
                                const tally::v1::CreateExperimentRequest*,
                                tally::v1::Experiment*) override;
  grpc::Status GetExperiment(grpc::ServerContext*, const tally::v1::GetExperimentRequest*,
                             tally::v1::Experiment*) override;
  grpc::Status ListExperiments(grpc::ServerContext*,
                               const tally::v1::ListExperimentsRequest*,
                               tally::v1::ListExperimentsResponse*) override;
  grpc::Status CancelExperiment(grpc::ServerContext*,
                                const tally::v1::CancelExperimentRequest*,
                                tally::v1::Experiment*) override;
  grpc::Status WatchExperiment(grpc::ServerContext*,
                               const tally::v1::WatchExperimentRequest*,
                               grpc::ServerWriter<tally::v1::ExperimentEvent>*) override;

 private:
  // NOT_FOUND for another tenant's experiment, as for a missing one.
  absl::Status CheckVisible(const auth::Principal& p, int64_t id) const;

  Core* const core_;
  const PrincipalFn principal_;
  const Gate* const gate_;
  const DataRoots* const data_roots_;
  const PriorityCaps* const priority_caps_;
  RateLimiter* const submit_limiter_;
  const Clock* const clock_;
  StreamLimiter watch_limiter_;
};

// Workers.Connect on gRPC's callback API: a stream is a reactor, not a
// thread. The protocol: the first message is a Hello (INVALID_ARGUMENT
// otherwise, or whatever Scheduler::OnHello rejects it with); the stream
// becomes the worker's only once the Hello is accepted. The stream's
// credential (Gate::AdmitWorker) must name the Hello's worker_id.
class WorkersService final : public tally::v1::Workers::CallbackService {
 public:
  struct Options {
    // Open Connect streams (a Hello sent or not) per credential (per peer
    // address when workers are not authenticated) and in all; 0: no limit.
    int64_t max_streams_per_principal = 64;
    int64_t max_streams = 4096;
    // Who may connect (must outlive the service); null: anyone.
    const Gate* gate = nullptr;
  };
  WorkersService(Core* core, Options options);
  explicit WorkersService(Core* core) : WorkersService(core, Options()) {}

  const StreamLimiter& stream_limiter() const { return limiter_; }
  grpc::ServerBidiReactor<tally::v1::WorkerMessage, tally::v1::ControllerMessage>*
  Connect(grpc::CallbackServerContext* context) override;

 private:
  Core* const core_;
  const Gate* const gate_;
  StreamLimiter limiter_;
};

// gRPC server metrics in the grpc-prometheus convention
// (metrics::GrpcServerMetrics) for every call, with every method of
// `services` (full names, e.g. "tally.v1.Jobs") created at 0 for each code.
class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  MetricsInterceptorFactory(metrics::Registry* registry, const Clock* clock,
                            const std::vector<std::string>& services);
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const Clock* clock_;
  metrics::GrpcServerMetrics metrics_;
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_SERVICES_H_
