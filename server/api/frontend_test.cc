// api::Frontend on an in-process server: every method refused UNAVAILABLE
// with the message set until Serve(), then every call reaching the leader's
// services.
#include "server/api/frontend.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/api/core.h"
#include "server/api/services.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/memory_job_store.h"

namespace tally::api {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kStandby[] = "this tallyd is a standby; the leader is 10.0.0.1:50051 (epoch 4)";

class FrontendTest : public ::testing::Test {
 protected:
  FrontendTest()
      : core_(&store_, &clock_, &registry_, sched::SchedulerOptions()),
        jobs_(&core_),
        experiments_(&core_),
        workers_(&core_),
        frontend_(kStandby) {}

  void SetUp() override {
    ASSERT_TRUE(core_.Init().ok());
    grpc::ServerBuilder builder;  // no listening port: in-process calls only
    for (grpc::Service* s : frontend_.services()) builder.RegisterService(s);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    std::shared_ptr<grpc::Channel> channel = server_->InProcessChannel(grpc::ChannelArguments());
    jobs_stub_ = tally::v1::Jobs::NewStub(channel);
    experiments_stub_ = tally::v1::Experiments::NewStub(channel);
    workers_stub_ = tally::v1::Workers::NewStub(channel);
  }

  void TearDown() override {
    core_.Shutdown();
    if (server_ != nullptr) server_->Shutdown();
  }

  // The status of every method of the three services, called once each.
  std::vector<std::pair<std::string, grpc::Status>> CallEveryMethod() {
    std::vector<std::pair<std::string, grpc::Status>> out;
    auto call = [&](const std::string& name, auto&& rpc) {
      grpc::ClientContext context;
      out.emplace_back(name, rpc(&context));
    };
    tally::v1::Job job;
    tally::v1::SubmitJobRequest submit;
    *submit.mutable_spec() = sched::TinySpec();
    call("SubmitJob", [&](auto* c) { return jobs_stub_->SubmitJob(c, submit, &job); });
    tally::v1::GetJobRequest get;
    get.set_name("jobs/1");
    call("GetJob", [&](auto* c) { return jobs_stub_->GetJob(c, get, &job); });
    tally::v1::ListJobsResponse jobs;
    call("ListJobs", [&](auto* c) { return jobs_stub_->ListJobs(c, {}, &jobs); });
    tally::v1::CancelJobRequest cancel;
    cancel.set_name("jobs/1");
    call("CancelJob", [&](auto* c) { return jobs_stub_->CancelJob(c, cancel, &job); });
    tally::v1::ListCheckpointsRequest checkpoints;
    checkpoints.set_name("jobs/1");
    tally::v1::ListCheckpointsResponse listed;
    call("ListCheckpoints",
         [&](auto* c) { return jobs_stub_->ListCheckpoints(c, checkpoints, &listed); });
    tally::v1::EstimateCostRequest estimate;
    *estimate.mutable_spec() = sched::TinySpec();
    tally::v1::CostEstimate cost;
    call("EstimateCost", [&](auto* c) { return jobs_stub_->EstimateCost(c, estimate, &cost); });
    tally::v1::WatchJobRequest watch;
    watch.set_name("jobs/1");
    call("WatchJob", [&](auto* c) {
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
      auto reader = jobs_stub_->WatchJob(c, watch);
      tally::v1::JobEvent e;
      while (reader->Read(&e)) {
      }
      return reader->Finish();
    });
    tally::v1::GetJobLogsRequest logs;
    logs.set_name("jobs/1");
    tally::v1::GetJobLogsResponse lines;
    call("GetJobLogs", [&](auto* c) { return jobs_stub_->GetJobLogs(c, logs, &lines); });
    tally::v1::WatchJobLogsRequest watch_logs;
    watch_logs.set_name("jobs/1");
    call("WatchJobLogs", [&](auto* c) {
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
      auto reader = jobs_stub_->WatchJobLogs(c, watch_logs);
      tally::v1::LogLine l;
      while (reader->Read(&l)) {
      }
      return reader->Finish();
    });
    tally::v1::Experiment experiment;
    tally::v1::CreateExperimentRequest create;
    call("CreateExperiment",
         [&](auto* c) { return experiments_stub_->CreateExperiment(c, create, &experiment); });
    tally::v1::GetExperimentRequest get_experiment;
    get_experiment.set_name("experiments/1");
    call("GetExperiment",
         [&](auto* c) { return experiments_stub_->GetExperiment(c, get_experiment, &experiment); });
    tally::v1::ListExperimentsResponse experiments;
    call("ListExperiments",
         [&](auto* c) { return experiments_stub_->ListExperiments(c, {}, &experiments); });
    tally::v1::CancelExperimentRequest cancel_experiment;
    cancel_experiment.set_name("experiments/1");
    call("CancelExperiment", [&](auto* c) {
      return experiments_stub_->CancelExperiment(c, cancel_experiment, &experiment);
    });
    tally::v1::WatchExperimentRequest watch_experiment;
    watch_experiment.set_name("experiments/1");
    call("WatchExperiment", [&](auto* c) {
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(300));
      auto reader = experiments_stub_->WatchExperiment(c, watch_experiment);
      tally::v1::ExperimentEvent e;
      while (reader->Read(&e)) {
      }
      return reader->Finish();
    });
    call("Connect", [&](auto* c) {
      c->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      auto stream = workers_stub_->Connect(c);
      tally::v1::WorkerMessage hello;  // no Hello in it: the leader refuses it too
      stream->Write(hello);
      stream->WritesDone();
      tally::v1::ControllerMessage m;
      while (stream->Read(&m)) {
      }
      return stream->Finish();
    });
    return out;
  }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  metrics::Registry registry_;
  Core core_;
  JobsService jobs_;
  ExperimentsService experiments_;
  WorkersService workers_;
  Frontend frontend_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<tally::v1::Jobs::Stub> jobs_stub_;
  std::unique_ptr<tally::v1::Experiments::Stub> experiments_stub_;
  std::unique_ptr<tally::v1::Workers::Stub> workers_stub_;
};

// Every method the three services' protos declare: a method the Frontend
// does not forward answers UNIMPLEMENTED, failing the tests below.
std::set<std::string> DeclaredMethods() {
  std::set<std::string> names;
  for (const google::protobuf::ServiceDescriptor* service :
       {tally::v1::Job::descriptor()->file()->FindServiceByName("Jobs"),
        tally::v1::Experiment::descriptor()->file()->FindServiceByName("Experiments"),
        tally::v1::WorkerMessage::descriptor()->file()->FindServiceByName("Workers")}) {
    for (int i = 0; i < service->method_count(); ++i) names.insert(service->method(i)->name());
  }
  return names;
}

TEST_F(FrontendTest, RefusesEveryMethodUnavailableWithItsMessageUntilServed) {
  const auto results = CallEveryMethod();
  std::set<std::string> called;
  for (const auto& [method, status] : results) called.insert(method);
  EXPECT_EQ(called, DeclaredMethods()) << "CallEveryMethod must call every method";
  for (const auto& [method, status] : results) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << method;
    EXPECT_EQ(status.error_message(), kStandby) << method;
  }
  EXPECT_EQ(store_.ListJobs(store::JobQuery()).value().size(), 0u);
}

TEST_F(FrontendTest, SetRefusalChangesWhatCallsAreRefusedWith) {
  frontend_.SetRefusal("this tallyd is a standby; the leader is 10.0.0.2:50051 (epoch 5)");
  for (const auto& [method, status] : CallEveryMethod()) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << method;
    EXPECT_THAT(status.error_message(), HasSubstr("10.0.0.2:50051 (epoch 5)")) << method;
  }
}

TEST_F(FrontendTest, OnceServedEveryMethodReachesTheLeadersServices) {
  frontend_.Serve(&jobs_, &experiments_, &workers_);
  for (const auto& [method, status] : CallEveryMethod()) {
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE)
        << method << ": " << status.error_message();
    EXPECT_THAT(status.error_message(), Not(HasSubstr("standby"))) << method;
  }
  // The submit reached the core: the job is stored and GetJob finds it.
  grpc::ClientContext context;
  tally::v1::GetJobRequest get;
  get.set_name("jobs/1");
  tally::v1::Job job;
  ASSERT_TRUE(jobs_stub_->GetJob(&context, get, &job).ok());
  EXPECT_EQ(job.spec().display_name(), sched::TinySpec().display_name());
}

}  // namespace
}  // namespace tally::api
