#include "server/api/services.h"

#include <grpcpp/grpcpp.h>

#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "server/store/job_store.h"

namespace tally::api {
namespace {

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;

const char* CodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {
      "OK",           "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",     "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",    "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",          "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i <= 16 ? kNames[i] : "UNKNOWN";
}

}  // namespace

grpc::Status JobsService::SubmitJob(grpc::ServerContext*,
                                    const tally::v1::SubmitJobRequest* req,
                                    tally::v1::Job* resp) {
  if (!req->has_spec()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "spec: is required");
  }
  absl::StatusOr<tally::v1::Job> job = core_->Run(
      [&](sched::Scheduler& s) { return s.Submit(req->spec(), req->request_id()); });
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp = *job;
  return grpc::Status::OK;
}

grpc::Status JobsService::GetJob(grpc::ServerContext*,
                                 const tally::v1::GetJobRequest* req,
                                 tally::v1::Job* resp) {
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  // A live job comes from the scheduler, its cost accrued to this moment.
  std::optional<tally::v1::Job> live =
      core_->Run([&](sched::Scheduler& s) { return s.ActiveJobView(*id); });
  if (live) {
    *resp = std::move(*live);
    return grpc::Status::OK;
  }
  absl::StatusOr<store::JobRecord> rec = core_->store()->GetJob(*id);
  if (!rec.ok()) return ToGrpcStatus(rec.status());
  *resp = rec->job();
  return grpc::Status::OK;
}

grpc::Status JobsService::EstimateCost(grpc::ServerContext*,
                                       const tally::v1::EstimateCostRequest* req,
                                       tally::v1::CostEstimate* resp) {
  if (!req->has_spec()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "spec: is required");
  }
  absl::StatusOr<tally::v1::CostEstimate> e =
      core_->Run([&](sched::Scheduler& s) { return s.EstimateCost(req->spec()); });
  if (!e.ok()) return ToGrpcStatus(e.status());
  *resp = *e;
  return grpc::Status::OK;
}

grpc::Status JobsService::ListJobs(grpc::ServerContext*,
                                   const tally::v1::ListJobsRequest* req,
                                   tally::v1::ListJobsResponse* resp) {
  if (req->page_size() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "page_size: must not be negative");
  }
  store::JobQuery q;
  q.limit = req->page_size() == 0 ? kDefaultPageSize
                                  : std::min(req->page_size(), kMaxPageSize);
  if (!req->page_token().empty() &&
      (!absl::SimpleAtoi(req->page_token(), &q.before_id) || q.before_id <= 0)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "page_token: not a token this server returned; pass "
                        "next_page_token from the previous response");
  }
  for (int s : req->states()) {
    const auto state = static_cast<tally::v1::JobState>(s);
    if (state == tally::v1::JOB_STATE_UNSPECIFIED ||
        !tally::v1::JobState_IsValid(s)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("states: ", s, " is not a job state"));
    }
    q.states.push_back(state);
  }
  ++q.limit;  // one more tells whether there is a next page
  absl::StatusOr<std::vector<store::JobRecord>> jobs = core_->store()->ListJobs(q);
  if (!jobs.ok()) return ToGrpcStatus(jobs.status());
  const bool more = static_cast<int>(jobs->size()) == q.limit;
  if (more) jobs->pop_back();
  for (const auto& j : *jobs) *resp->add_jobs() = j.job();
  if (more && !jobs->empty()) {
    resp->set_next_page_token(absl::StrCat(jobs->back().id()));
  }
  return grpc::Status::OK;
}

grpc::Status JobsService::CancelJob(grpc::ServerContext*,
                                    const tally::v1::CancelJobRequest* req,
                                    tally::v1::Job* resp) {
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  absl::StatusOr<tally::v1::Job> job =
      core_->Run([&](sched::Scheduler& s) { return s.Cancel(*id, req->reason()); });
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp = *job;
  return grpc::Status::OK;
}

grpc::Status JobsService::WatchJob(grpc::ServerContext* context,
                                   const tally::v1::WatchJobRequest* req,
                                   grpc::ServerWriter<tally::v1::JobEvent>* writer) {
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (req->after_sequence() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "after_sequence: must not be negative");
  }
  int64_t after = req->after_sequence();
  while (!context->IsCancelled()) {
    // Read the job before its events: if it was terminal then, every event
    // it will ever have is already stored.
    absl::StatusOr<store::JobRecord> job = core_->store()->GetJob(*id);
    if (!job.ok()) return ToGrpcStatus(job.status());
    absl::StatusOr<std::vector<tally::v1::JobEvent>> events =
        core_->store()->ListEvents(*id, after, 256);
    if (!events.ok()) return ToGrpcStatus(events.status());
    for (const auto& e : *events) {
      if (!writer->Write(e)) return grpc::Status::CANCELLED;
      after = e.sequence();
    }
    if (!events->empty()) continue;
    if (store::IsTerminal(job->job().state()) &&
        after >= job->job().last_event_sequence()) {
      return grpc::Status::OK;
    }
    if (core_->shutting_down()) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("tallyd is shutting down; watch again "
                                       "with after_sequence=",
                                       after));
    }
    core_->AwaitChange(absl::Milliseconds(500));
  }
  return grpc::Status::CANCELLED;
}

grpc::Status JobsService::ListCheckpoints(
    grpc::ServerContext*, const tally::v1::ListCheckpointsRequest* req,
    tally::v1::ListCheckpointsResponse* resp) {
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  absl::StatusOr<store::JobRecord> rec = core_->store()->GetJob(*id);
  if (!rec.ok()) return ToGrpcStatus(rec.status());
  auto checkpoints = core_->store()->ListCheckpoints(*id);
  if (!checkpoints.ok()) return ToGrpcStatus(checkpoints.status());
  for (auto& c : *checkpoints) *resp->add_checkpoints() = std::move(c);
  return grpc::Status::OK;
}

grpc::Status WorkersService::Connect(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<tally::v1::ControllerMessage,
                             tally::v1::WorkerMessage>* stream) {
  tally::v1::WorkerMessage first;
  if (!stream->Read(&first)) return grpc::Status::CANCELLED;
  if (!first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message on a Workers.Connect stream must "
                        "be a Hello");
  }
  const std::string worker_id = first.hello().worker_id();
  auto session = std::make_shared<WorkerSession>(context);
  core_->Attach(worker_id, session);
  absl::StatusOr<int64_t> generation =
      core_->Run([&](sched::Scheduler& s) { return s.OnHello(first.hello()); });
  if (!generation.ok()) {
    core_->Detach(worker_id, session.get());
    return ToGrpcStatus(generation.status());
  }

  std::thread writer([&] {
    tally::v1::ControllerMessage m;
    while (session->Pop(&m)) {
      if (!stream->Write(m)) {
        session->Close();
        return;
      }
    }
  });

  grpc::Status result = grpc::Status::OK;
  tally::v1::WorkerMessage msg;
  while (stream->Read(&msg)) {
    absl::Status s =
        core_->Run([&](sched::Scheduler& sch) { return sch.OnMessage(worker_id, msg); });
    if (!s.ok()) {
      result = ToGrpcStatus(s);
      break;
    }
  }
  session->Close();
  writer.join();
  core_->Detach(worker_id, session.get());
  core_->Run([&](sched::Scheduler& s) {
    s.OnDisconnect(worker_id, *generation);
    return 0;
  });
  return result;
}

namespace {

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(std::string method, const Clock* clock,
                     metrics::Family<metrics::Counter>* requests,
                     metrics::Family<metrics::Histogram>* duration)
      : method_(std::move(method)),
        clock_(clock),
        start_(clock->Now()),
        requests_(requests),
        duration_(duration) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      requests_->Add({{"method", method_}, {"code", CodeName(status.error_code())}})
          .Increment();
      duration_
          ->Add({{"method", method_}},
                metrics::Histogram::ExponentialBuckets(0.0005, 4, 10))
          .Observe(absl::ToDoubleSeconds(clock_->Now() - start_));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  const Clock* clock_;
  const absl::Time start_;
  metrics::Family<metrics::Counter>* requests_;
  metrics::Family<metrics::Histogram>* duration_;
};

}  // namespace

MetricsInterceptorFactory::MetricsInterceptorFactory(metrics::Registry* registry,
                                                     const Clock* clock)
    : clock_(clock) {
  requests_ = &metrics::BuildCounter()
                   .Name("tally_grpc_requests_total")
                   .Help("gRPC requests handled, by method and status code.")
                   .Register(*registry);
  duration_ = &metrics::BuildHistogram()
                   .Name("tally_grpc_request_duration_seconds")
                   .Help("gRPC request duration by method (streams: their "
                         "whole life).")
                   .Register(*registry);
}

grpc::experimental::Interceptor* MetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  std::string method = info->method() ? info->method() : "unknown";
  if (!method.empty() && method[0] == '/') method.erase(0, 1);
  return new MetricsInterceptor(std::move(method), clock_, requests_, duration_);
}

}  // namespace tally::api
