#include "server/api/frontend.h"

#include <utility>

#include "server/api/refused_reactor.h"

namespace tally::api {

using tally::v1::ControllerMessage;
using tally::v1::WorkerMessage;

class Frontend::Jobs final
    : public tally::v1::Jobs::WithCallbackMethod_WatchJob<tally::v1::Jobs::Service> {
 public:
  explicit Jobs(const Frontend* owner) : owner_(owner) {}

  grpc::Status SubmitJob(grpc::ServerContext* c, const tally::v1::SubmitJobRequest* req,
                         tally::v1::Job* resp) override {
    return owner_->Forward<&Leader::jobs, &JobsService::SubmitJob>(c, req, resp);
  }
  grpc::Status GetJob(grpc::ServerContext* c, const tally::v1::GetJobRequest* req,
                      tally::v1::Job* resp) override {
    return owner_->Forward<&Leader::jobs, &JobsService::GetJob>(c, req, resp);
  }
  grpc::Status ListJobs(grpc::ServerContext* c, const tally::v1::ListJobsRequest* req,
                        tally::v1::ListJobsResponse* resp) override {
    return owner_->Forward<&Leader::jobs, &JobsService::ListJobs>(c, req, resp);
  }
  grpc::Status CancelJob(grpc::ServerContext* c, const tally::v1::CancelJobRequest* req,
                         tally::v1::Job* resp) override {
    return owner_->Forward<&Leader::jobs, &JobsService::CancelJob>(c, req, resp);
  }
  grpc::ServerWriteReactor<tally::v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* c, const tally::v1::WatchJobRequest* req) override {
    JobsService* to = owner_->leader().jobs;
    if (to != nullptr) return to->WatchJob(c, req);
    return new Refused<grpc::ServerWriteReactor<tally::v1::JobEvent>>(owner_->Unavailable());
  }
  grpc::Status ListCheckpoints(grpc::ServerContext* c, const tally::v1::ListCheckpointsRequest* req,
                               tally::v1::ListCheckpointsResponse* resp) override {
    return owner_->Forward<&Leader::jobs, &JobsService::ListCheckpoints>(c, req, resp);
  }
  grpc::Status EstimateCost(grpc::ServerContext* c, const tally::v1::EstimateCostRequest* req,
                            tally::v1::CostEstimate* resp) override {
    return owner_->Forward<&Leader::jobs, &JobsService::EstimateCost>(c, req, resp);
  }
  grpc::Status GetJobLogs(grpc::ServerContext* c, const tally::v1::GetJobLogsRequest* req,
                          tally::v1::GetJobLogsResponse* resp) override {
    return owner_->Forward<&Leader::jobs, &JobsService::GetJobLogs>(c, req, resp);
  }
  grpc::Status WatchJobLogs(grpc::ServerContext* c, const tally::v1::WatchJobLogsRequest* req,
                            grpc::ServerWriter<tally::v1::LogLine>* w) override {
    return owner_->Forward<&Leader::jobs, &JobsService::WatchJobLogs>(c, req, w);
  }

 private:
  const Frontend* const owner_;
};

class Frontend::Experiments final : public tally::v1::Experiments::Service {
 public:
  explicit Experiments(const Frontend* owner) : owner_(owner) {}

  grpc::Status CreateExperiment(grpc::ServerContext* c,
                                const tally::v1::CreateExperimentRequest* req,
                                tally::v1::Experiment* resp) override {
    return owner_->Forward<&Leader::experiments, &ExperimentsService::CreateExperiment>(c, req,
                                                                                        resp);
  }
  grpc::Status GetExperiment(grpc::ServerContext* c, const tally::v1::GetExperimentRequest* req,
                             tally::v1::Experiment* resp) override {
    return owner_->Forward<&Leader::experiments, &ExperimentsService::GetExperiment>(c, req, resp);
  }
  grpc::Status ListExperiments(grpc::ServerContext* c, const tally::v1::ListExperimentsRequest* req,
                               tally::v1::ListExperimentsResponse* resp) override {
    return owner_->Forward<&Leader::experiments, &ExperimentsService::ListExperiments>(c, req,
                                                                                       resp);
  }
  grpc::Status CancelExperiment(grpc::ServerContext* c,
                                const tally::v1::CancelExperimentRequest* req,
                                tally::v1::Experiment* resp) override {
    return owner_->Forward<&Leader::experiments, &ExperimentsService::CancelExperiment>(c, req,
                                                                                        resp);
  }
  grpc::Status WatchExperiment(grpc::ServerContext* c, const tally::v1::WatchExperimentRequest* req,
                               grpc::ServerWriter<tally::v1::ExperimentEvent>* w) override {
    return owner_->Forward<&Leader::experiments, &ExperimentsService::WatchExperiment>(c, req, w);
  }

 private:
  const Frontend* const owner_;
};

class Frontend::Workers final : public tally::v1::Workers::CallbackService {
 public:
  explicit Workers(const Frontend* owner) : owner_(owner) {}

  grpc::ServerBidiReactor<WorkerMessage, ControllerMessage>* Connect(
      grpc::CallbackServerContext* c) override {
    WorkersService* to = owner_->leader().workers;
    if (to != nullptr) return to->Connect(c);
    return new Refused<grpc::ServerBidiReactor<WorkerMessage, ControllerMessage>>(
        owner_->Unavailable());
  }

 private:
  const Frontend* const owner_;
};

Frontend::Frontend(std::string refusal)
    : refusal_(std::move(refusal)),
      jobs_(std::make_unique<Jobs>(this)),
      experiments_(std::make_unique<Experiments>(this)),
      workers_(std::make_unique<Workers>(this)) {}

Frontend::~Frontend() = default;

std::vector<grpc::Service*> Frontend::services() {
  return {jobs_.get(), experiments_.get(), workers_.get()};
}

void Frontend::SetRefusal(std::string message) {
  absl::MutexLock lock(&mu_);
  refusal_ = std::move(message);
}

std::string Frontend::Refusal() const {
  absl::MutexLock lock(&mu_);
  return refusal_;
}

void Frontend::Serve(JobsService* jobs, ExperimentsService* experiments, WorkersService* workers) {
  absl::MutexLock lock(&mu_);
  leader_ = Leader{jobs, experiments, workers};
}

Frontend::Leader Frontend::leader() const {
  absl::MutexLock lock(&mu_);
  return leader_;
}

grpc::Status Frontend::Unavailable() const {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, Refusal());
}

}  // namespace tally::api
