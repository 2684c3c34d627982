// The Jobs, Experiments and Workers services as a client sees them: a Core
// over an in-memory store and a FakeClock, a Gate with two tenants' tokens,
// the services on a grpc::Server with no listening port, called through its
// in-process channel with the generated stubs.
#include "server/api/services.h"

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/api/core.h"
#include "server/api/gate.h"
#include "server/api/gate_test_util.h"
#include "server/metrics/registry.h"
#include "server/sched/scheduler_test_util.h"
#include "server/store/memory_job_store.h"
#include "tally/v1/experiments.grpc.pb.h"
#include "tally/v1/jobs.grpc.pb.h"
#include "tally/v1/workers.grpc.pb.h"

namespace tally::api {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;
using ::testing::UnorderedElementsAreArray;

// Tokens of the gate below.
constexpr char kAlice[] = "tok-alice";  // user, tenant research
constexpr char kBob[] = "tok-bob";      // user, tenant dev
constexpr char kVera[] = "tok-vera";    // viewer, tenant research
constexpr char kOps[] = "tok-ops";      // admin, every tenant
constexpr char kW1[] = "tok-w1";        // worker w1

// A context carrying `token` as its bearer token; none when empty.
std::unique_ptr<grpc::ClientContext> As(const std::string& token) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
  return context;
}

tally::v1::ExperimentSpec ExperimentSpec() {
  tally::v1::ExperimentSpec s;
  s.set_display_name("ab");
  *s.mutable_base() = sched::TinySpec();
  s.add_variants()->set_name("naive");
  s.add_variants()->set_name("packed");
  s.mutable_target()->set_from_variant("naive");
  return s;
}

class ServicesTest : public ::testing::Test {
 protected:
  ServicesTest() {
    sched::SchedulerOptions options;
    options.prices.usd_per_gpu_hour["cpu"] = 3.6;
    options.prices.flops_per_second_per_gpu["cpu"] = 1e9;
    core_ = std::make_unique<Core>(&store_, &clock_, &registry_, options);
    Credentials credentials;
    credentials.users = TokenTableOf({{"alice", "research", "user", kAlice},
                                      {"bob", "dev", "user", kBob},
                                      {"vera", "research", "viewer", kVera},
                                      {"ops", "", "admin", kOps}},
                                     auth::TokenTable::Kind::kUsers);
    credentials.workers =
        TokenTableOf({{"w1", "", "worker", kW1}}, auth::TokenTable::Kind::kWorkers);
    gate_ = std::make_unique<Gate>(&clock_, std::move(credentials));
    JobsService::Options jobs_options;
    jobs_options.gate = gate_.get();
    jobs_options.clock = &clock_;
    jobs_ = std::make_unique<JobsService>(core_.get(), jobs_options);
    ExperimentsService::Options experiments_options;
    experiments_options.gate = gate_.get();
    experiments_options.clock = &clock_;
    experiments_ = std::make_unique<ExperimentsService>(core_.get(), experiments_options);
    WorkersService::Options workers_options;
    workers_options.gate = gate_.get();
    workers_ = std::make_unique<WorkersService>(core_.get(), workers_options);
  }

  void SetUp() override {
    ASSERT_TRUE(core_->Init().ok());
    grpc::ServerBuilder builder;  // no listening port: in-process calls only
    builder.RegisterService(jobs_.get());
    builder.RegisterService(experiments_.get());
    builder.RegisterService(workers_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    std::shared_ptr<grpc::Channel> channel = server_->InProcessChannel(grpc::ChannelArguments());
    jobs_stub_ = tally::v1::Jobs::NewStub(channel);
    experiments_stub_ = tally::v1::Experiments::NewStub(channel);
    workers_stub_ = tally::v1::Workers::NewStub(channel);
  }

  void TearDown() override {
    core_->Shutdown();
    if (server_ != nullptr) server_->Shutdown();
  }

  grpc::Status Submit(const std::string& token, const tally::v1::JobSpec& spec, tally::v1::Job* job,
                      const std::string& request_id = "") {
    tally::v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    req.set_request_id(request_id);
    return jobs_stub_->SubmitJob(As(token).get(), req, job);
  }
  // Submits TinySpec as `token`; the job's name ("" on failure).
  std::string SubmitTiny(const std::string& token) {
    tally::v1::Job job;
    grpc::Status s = Submit(token, sched::TinySpec(), &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.name();
  }
  grpc::Status Get(const std::string& token, const std::string& name, tally::v1::Job* job) {
    tally::v1::GetJobRequest req;
    req.set_name(name);
    return jobs_stub_->GetJob(As(token).get(), req, job);
  }
  grpc::Status Cancel(const std::string& token, const std::string& name, tally::v1::Job* job) {
    tally::v1::CancelJobRequest req;
    req.set_name(name);
    return jobs_stub_->CancelJob(As(token).get(), req, job);
  }
  // The names of the jobs `token` lists (of `tenant`); empty on failure.
  std::vector<std::string> List(const std::string& token, grpc::Status* status,
                                const std::string& tenant = "") {
    tally::v1::ListJobsRequest req;
    req.set_tenant(tenant);
    tally::v1::ListJobsResponse resp;
    *status = jobs_stub_->ListJobs(As(token).get(), req, &resp);
    std::vector<std::string> names;
    for (const auto& j : resp.jobs()) names.push_back(j.name());
    return names;
  }
  std::vector<std::string> List(const std::string& token, const std::string& tenant = "") {
    grpc::Status s;
    std::vector<std::string> names = List(token, &s, tenant);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return names;
  }
  grpc::Status ListCheckpoints(const std::string& token, const std::string& name,
                               tally::v1::ListCheckpointsResponse* resp) {
    tally::v1::ListCheckpointsRequest req;
    req.set_name(name);
    return jobs_stub_->ListCheckpoints(As(token).get(), req, resp);
  }
  grpc::Status CreateExperiment(const std::string& token, tally::v1::Experiment* e) {
    tally::v1::CreateExperimentRequest req;
    *req.mutable_spec() = ExperimentSpec();
    return experiments_stub_->CreateExperiment(As(token).get(), req, e);
  }
  grpc::Status GetExperiment(const std::string& token, const std::string& name,
                             tally::v1::Experiment* e) {
    tally::v1::GetExperimentRequest req;
    req.set_name(name);
    return experiments_stub_->GetExperiment(As(token).get(), req, e);
  }
  grpc::Status CancelExperiment(const std::string& token, const std::string& name,
                                tally::v1::Experiment* e) {
    tally::v1::CancelExperimentRequest req;
    req.set_name(name);
    return experiments_stub_->CancelExperiment(As(token).get(), req, e);
  }
  std::vector<std::string> ListExperiments(const std::string& token, grpc::Status* status,
                                           const std::string& tenant = "") {
    tally::v1::ListExperimentsRequest req;
    req.set_tenant(tenant);
    tally::v1::ListExperimentsResponse resp;
    *status = experiments_stub_->ListExperiments(As(token).get(), req, &resp);
    std::vector<std::string> names;
    for (const auto& e : resp.experiments()) names.push_back(e.name());
    return names;
  }
  // WatchJob to the stream's end: its status.
  grpc::Status WatchJob(const std::string& token, const std::string& name,
                        std::vector<tally::v1::JobEvent>* events) {
    tally::v1::WatchJobRequest req;
    req.set_name(name);
    std::unique_ptr<grpc::ClientContext> context = As(token);
    auto reader = jobs_stub_->WatchJob(context.get(), req);
    tally::v1::JobEvent e;
    while (reader->Read(&e)) events->push_back(e);
    return reader->Finish();
  }
  grpc::Status WatchExperiment(const std::string& token, const std::string& name,
                               std::vector<tally::v1::ExperimentEvent>* events) {
    tally::v1::WatchExperimentRequest req;
    req.set_name(name);
    std::unique_ptr<grpc::ClientContext> context = As(token);
    auto reader = experiments_stub_->WatchExperiment(context.get(), req);
    tally::v1::ExperimentEvent e;
    while (reader->Read(&e)) events->push_back(e);
    return reader->Finish();
  }

  FakeClock clock_;
  store::InMemoryJobStore store_;
  metrics::Registry registry_;
  std::unique_ptr<Core> core_;
  std::unique_ptr<Gate> gate_;
  std::unique_ptr<JobsService> jobs_;
  std::unique_ptr<ExperimentsService> experiments_;
  std::unique_ptr<WorkersService> workers_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<tally::v1::Jobs::Stub> jobs_stub_;
  std::unique_ptr<tally::v1::Experiments::Stub> experiments_stub_;
  std::unique_ptr<tally::v1::Workers::Stub> workers_stub_;
};

TEST_F(ServicesTest, ASubmittedJobIsSeenByGetAndList) {
  tally::v1::Job submitted;
  grpc::Status s = Submit(kAlice, sched::TinySpec(), &submitted);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(submitted.name(), ::testing::StartsWith("jobs/"));
  EXPECT_EQ(submitted.state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(submitted.tenant(), "research");
  EXPECT_EQ(submitted.submitted_by(), "alice");

  tally::v1::Job got;
  s = Get(kAlice, submitted.name(), &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.name(), submitted.name());
  EXPECT_EQ(got.state(), tally::v1::JOB_STATE_QUEUED);
  EXPECT_EQ(got.spec().training().max_steps(), 1000);
  EXPECT_THAT(List(kAlice), ElementsAre(submitted.name()));
}

TEST_F(ServicesTest, ABadSpecIsInvalidArgumentNamingTheField) {
  tally::v1::JobSpec spec = sched::TinySpec();
  spec.mutable_training()->set_max_steps(0);
  tally::v1::Job job;
  grpc::Status s = Submit(kAlice, spec, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.training.max_steps: must be between 1 and"));

  tally::v1::SubmitJobRequest no_spec;
  s = jobs_stub_->SubmitJob(As(kAlice).get(), no_spec, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec: is required"));
  EXPECT_THAT(List(kAlice), IsEmpty()) << "nothing refused is queued";
}

TEST_F(ServicesTest, ARepeatedRequestIdReturnsTheSameJob) {
  tally::v1::Job first, again, other;
  ASSERT_TRUE(Submit(kAlice, sched::TinySpec(), &first, "req-1").ok());
  grpc::Status s = Submit(kAlice, sched::TinySpec(), &again, "req-1");
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(again.name(), first.name());
  EXPECT_EQ(again.request_id(), "req-1");
  ASSERT_TRUE(Submit(kAlice, sched::TinySpec(), &other, "req-2").ok());
  EXPECT_NE(other.name(), first.name());
  EXPECT_THAT(List(kAlice), UnorderedElementsAre(first.name(), other.name()));
}

TEST_F(ServicesTest, GetOfAMissingJobIsNotFound) {
  tally::v1::Job job;
  grpc::Status s = Get(kAlice, "jobs/999", &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("jobs/999"));
}

TEST_F(ServicesTest, AMalformedJobNameIsInvalidArgumentNamingTheField) {
  for (const std::string name : {"", "jobs/", "jobs/abc", "jobs/-3", "jobs/0", "job/1", "1"}) {
    SCOPED_TRACE(name);
    tally::v1::Job job;
    tally::v1::ListCheckpointsResponse checkpoints;
    for (const grpc::Status& s : {Get(kAlice, name, &job), Cancel(kAlice, name, &job),
                                  ListCheckpoints(kAlice, name, &checkpoints)}) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(s.error_message(), HasSubstr("name: expected a job name like \"jobs/42\""));
    }
  }
}

TEST_F(ServicesTest, CancellingTwiceIsAFailedPreconditionTheSecondTime) {
  const std::string name = SubmitTiny(kAlice);
  tally::v1::Job job;
  grpc::Status s = Cancel(kAlice, name, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.state(), tally::v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(job.cancelled_by(), "alice");
  s = Cancel(kAlice, name, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr(name + " has already ended (CANCELLED)"));
}

TEST_F(ServicesTest, EstimateCostOfAValidSpecPricesIt) {
  tally::v1::EstimateCostRequest req;
  *req.mutable_spec() = sched::TinySpec(2);
  tally::v1::CostEstimate estimate;
  grpc::Status s = jobs_stub_->EstimateCost(As(kAlice).get(), req, &estimate);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(estimate.throughput_source(), "configured");
  EXPECT_EQ(estimate.usd_per_gpu_hour(), 3.6);
  EXPECT_GT(estimate.gpu_hours(), 0);
  EXPECT_DOUBLE_EQ(estimate.gpu_hours(), estimate.seconds() * 2 / 3600);
  EXPECT_DOUBLE_EQ(estimate.cost_usd(), estimate.gpu_hours() * 3.6);
  EXPECT_THAT(List(kAlice), IsEmpty()) << "an estimate queues nothing";

  req.mutable_spec()->mutable_model()->set_num_layers(0);
  s = jobs_stub_->EstimateCost(As(kAlice).get(), req, &estimate);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.model.num_layers: must be between 1 and 256"));
}

TEST_F(ServicesTest, ListCheckpointsOfAJobWithNoneIsEmpty) {
  const std::string name = SubmitTiny(kAlice);
  tally::v1::ListCheckpointsResponse resp;
  grpc::Status s = ListCheckpoints(kAlice, name, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(resp.checkpoints(), IsEmpty());
  s = ListCheckpoints(kAlice, "jobs/999", &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServicesTest, AnExperimentIsCreatedGotListedAndCancelled) {
  tally::v1::Experiment created;
  grpc::Status s = CreateExperiment(kAlice, &created);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_THAT(created.name(), ::testing::StartsWith("experiments/"));
  EXPECT_EQ(created.state(), tally::v1::EXPERIMENT_STATE_RUNNING);
  EXPECT_EQ(created.tenant(), "research");
  EXPECT_EQ(created.created_by(), "alice");
  ASSERT_EQ(created.variants_size(), 2);
  EXPECT_EQ(created.variants(0).name(), "naive");

  tally::v1::Experiment got;
  s = GetExperiment(kAlice, created.name(), &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.name(), created.name());
  EXPECT_EQ(got.spec().display_name(), "ab");
  EXPECT_THAT(ListExperiments(kAlice, &s), ElementsAre(created.name()));
  EXPECT_TRUE(s.ok()) << s.error_message();

  tally::v1::Experiment cancelled;
  s = CancelExperiment(kAlice, created.name(), &cancelled);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(cancelled.state(), tally::v1::EXPERIMENT_STATE_CANCELLED);
  EXPECT_EQ(cancelled.cancelled_by(), "alice");
  s = GetExperiment(kAlice, created.name(), &got);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(got.state(), tally::v1::EXPERIMENT_STATE_CANCELLED);
  s = CancelExperiment(kAlice, created.name(), &cancelled);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("has already ended"));

  s = GetExperiment(kAlice, "experiments/999", &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  s = GetExperiment(kAlice, "jobs/1", &got);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("name: expected an experiment name"));
}

// Another tenant's job or experiment is NOT_FOUND, exactly as a missing one,
// for every call that names it; List shows the caller's tenant only.
TEST_F(ServicesTest, ATenantSeesAndActsOnItsOwnJobsAndExperimentsOnly) {
  const std::string alices = SubmitTiny(kAlice);
  const std::string bobs = SubmitTiny(kBob);
  tally::v1::Experiment alices_experiment;
  ASSERT_TRUE(CreateExperiment(kAlice, &alices_experiment).ok());

  tally::v1::Job job;
  grpc::Status s = Get(kBob, alices, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), alices + " not found") << "as for a job that does not exist";
  s = Cancel(kBob, alices, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  tally::v1::ListCheckpointsResponse checkpoints;
  EXPECT_EQ(ListCheckpoints(kBob, alices, &checkpoints).error_code(), grpc::StatusCode::NOT_FOUND);
  std::vector<tally::v1::JobEvent> events;
  EXPECT_EQ(WatchJob(kBob, alices, &events).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(events, IsEmpty());
  ASSERT_TRUE(Get(kAlice, alices, &job).ok());
  EXPECT_EQ(job.state(), tally::v1::JOB_STATE_QUEUED) << "bob's cancel changed nothing";

  tally::v1::Experiment e;
  s = GetExperiment(kBob, alices_experiment.name(), &e);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), alices_experiment.name() + " not found");
  EXPECT_EQ(CancelExperiment(kBob, alices_experiment.name(), &e).error_code(),
            grpc::StatusCode::NOT_FOUND);
  std::vector<tally::v1::ExperimentEvent> experiment_events;
  EXPECT_EQ(WatchExperiment(kBob, alices_experiment.name(), &experiment_events).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(GetExperiment(kAlice, alices_experiment.name(), &e).ok());
  EXPECT_EQ(e.state(), tally::v1::EXPERIMENT_STATE_RUNNING);

  // The experiment's variants, and its timing calibration, are alice's
  // jobs too.
  std::vector<std::string> research;
  for (const auto& v : e.variants()) {
    if (!v.job().empty()) research.push_back(v.job());
  }
  ASSERT_FALSE(e.calibration().job().empty());
  research.push_back(e.calibration().job());
  research.push_back(alices);
  EXPECT_THAT(List(kBob), ElementsAre(bobs));
  EXPECT_THAT(List(kAlice), UnorderedElementsAreArray(research));
  EXPECT_THAT(List(kVera), UnorderedElementsAreArray(research));
  EXPECT_THAT(List(kOps, "dev"), ElementsAre(bobs));
  EXPECT_EQ(List(kOps).size(), research.size() + 1);
  EXPECT_THAT(ListExperiments(kBob, &s), IsEmpty());
  EXPECT_THAT(ListExperiments(kAlice, &s), ElementsAre(alices_experiment.name()));

  // Asking for another tenant's list is refused, not answered empty.
  EXPECT_THAT(List(kBob, &s, "research"), IsEmpty());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("tenant: bob may list only its own tenant (dev)"));
  EXPECT_THAT(ListExperiments(kBob, &s, "research"), IsEmpty());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);

  // The global admin acts on any tenant's job.
  s = Cancel(kOps, alices, &job);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(job.state(), tally::v1::JOB_STATE_CANCELLED);
}

// Each RPC asks the gate for the access services.cc's handler names: a
// viewer reads everything of its tenant and changes nothing.
TEST_F(ServicesTest, AViewerMayCallEveryReadAndNoWrite) {
  const std::string name = SubmitTiny(kAlice);
  tally::v1::Experiment experiment;
  ASSERT_TRUE(CreateExperiment(kAlice, &experiment).ok());
  tally::v1::Experiment cancelled;
  ASSERT_TRUE(CancelExperiment(kAlice, experiment.name(), &cancelled).ok());

  tally::v1::Job job;
  for (const auto& [rpc, s] : std::vector<std::pair<std::string, grpc::Status>>{
           {"SubmitJob", Submit(kVera, sched::TinySpec(), &job)},
           {"CancelJob", Cancel(kVera, name, &job)},
           {"CreateExperiment", CreateExperiment(kVera, &cancelled)},
           {"CancelExperiment", CancelExperiment(kVera, experiment.name(), &cancelled)}}) {
    SCOPED_TRACE(rpc);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("vera is a viewer (read-only) and cannot call " + rpc +
                                             "; ask an admin for the user role"));
  }
  ASSERT_TRUE(Get(kAlice, name, &job).ok());
  EXPECT_EQ(job.state(), tally::v1::JOB_STATE_QUEUED);

  ASSERT_TRUE(Cancel(kAlice, name, &job).ok());  // so that its watch ends
  tally::v1::ListCheckpointsResponse checkpoints;
  tally::v1::EstimateCostRequest estimate_req;
  *estimate_req.mutable_spec() = sched::TinySpec();
  tally::v1::CostEstimate estimate;
  grpc::Status list_status, list_experiments_status;
  List(kVera, &list_status);
  ListExperiments(kVera, &list_experiments_status);
  std::vector<tally::v1::JobEvent> job_events;
  std::vector<tally::v1::ExperimentEvent> experiment_events;
  tally::v1::Experiment got;
  for (const auto& [rpc, s] : std::vector<std::pair<std::string, grpc::Status>>{
           {"GetJob", Get(kVera, name, &job)},
           {"ListJobs", list_status},
           {"ListCheckpoints", ListCheckpoints(kVera, name, &checkpoints)},
           {"EstimateCost", jobs_stub_->EstimateCost(As(kVera).get(), estimate_req, &estimate)},
           {"WatchJob", WatchJob(kVera, name, &job_events)},
           {"GetExperiment", GetExperiment(kVera, experiment.name(), &got)},
           {"ListExperiments", list_experiments_status},
           {"WatchExperiment", WatchExperiment(kVera, experiment.name(), &experiment_events)}}) {
    EXPECT_TRUE(s.ok()) << rpc << ": " << s.error_message();
  }
  EXPECT_THAT(job_events, ::testing::Not(IsEmpty()));
  EXPECT_EQ(job_events.back().state(), tally::v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(experiment_events, ::testing::Not(IsEmpty()));
}

TEST_F(ServicesTest, EveryCallWithoutAUserTokenIsRefused) {
  const std::string name = SubmitTiny(kAlice);
  tally::v1::Experiment experiment;
  ASSERT_TRUE(CreateExperiment(kAlice, &experiment).ok());
  const size_t num_jobs = List(kAlice).size();
  struct Caller {
    std::string token;
    grpc::StatusCode code;
    std::string message;
  };
  for (const Caller& caller :
       {Caller{"", grpc::StatusCode::UNAUTHENTICATED, "no credentials: send `authorization"},
        Caller{"tok-nobody", grpc::StatusCode::UNAUTHENTICATED, "unknown token"},
        Caller{kW1, grpc::StatusCode::PERMISSION_DENIED, "a worker token cannot call"}}) {
    SCOPED_TRACE(caller.token);
    tally::v1::Job job;
    tally::v1::ListCheckpointsResponse checkpoints;
    tally::v1::EstimateCostRequest estimate_req;
    *estimate_req.mutable_spec() = sched::TinySpec();
    tally::v1::CostEstimate estimate;
    tally::v1::Experiment e;
    grpc::Status list_status, list_experiments_status;
    std::vector<tally::v1::JobEvent> job_events;
    std::vector<tally::v1::ExperimentEvent> experiment_events;
    EXPECT_THAT(List(caller.token, &list_status), IsEmpty());
    EXPECT_THAT(ListExperiments(caller.token, &list_experiments_status), IsEmpty());
    for (const auto& [rpc, s] : std::vector<std::pair<std::string, grpc::Status>>{
             {"SubmitJob", Submit(caller.token, sched::TinySpec(), &job)},
             {"GetJob", Get(caller.token, name, &job)},
             {"ListJobs", list_status},
             {"CancelJob", Cancel(caller.token, name, &job)},
             {"WatchJob", WatchJob(caller.token, name, &job_events)},
             {"ListCheckpoints", ListCheckpoints(caller.token, name, &checkpoints)},
             {"EstimateCost",
              jobs_stub_->EstimateCost(As(caller.token).get(), estimate_req, &estimate)},
             {"CreateExperiment", CreateExperiment(caller.token, &e)},
             {"GetExperiment", GetExperiment(caller.token, experiment.name(), &e)},
             {"ListExperiments", list_experiments_status},
             {"CancelExperiment", CancelExperiment(caller.token, experiment.name(), &e)},
             {"WatchExperiment",
              WatchExperiment(caller.token, experiment.name(), &experiment_events)}}) {
      EXPECT_EQ(s.error_code(), caller.code) << rpc << ": " << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr(caller.message)) << rpc;
    }
    EXPECT_THAT(job_events, IsEmpty());
    EXPECT_THAT(experiment_events, IsEmpty());
  }
  EXPECT_EQ(List(kAlice).size(), num_jobs) << "no refused submit queued a job";
}

// Workers.Connect: a worker token opens a stream for its own worker id only;
// a user's token opens none.
TEST_F(ServicesTest, AWorkerTokenSpeaksForItsOwnWorkerIdOnly) {
  auto hello = [](const std::string& worker_id) {
    tally::v1::WorkerMessage m;
    m.mutable_hello()->set_worker_id(worker_id);
    m.mutable_hello()->set_gpu_type("cpu");
    m.mutable_hello()->set_slots(1);
    return m;
  };
  {
    std::unique_ptr<grpc::ClientContext> context = As(kW1);
    auto stream = workers_stub_->Connect(context.get());
    stream->Write(hello("w2"));
    stream->WritesDone();
    tally::v1::ControllerMessage m;
    EXPECT_FALSE(stream->Read(&m)) << "nothing is said to a refused worker";
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(),
                HasSubstr("hello.worker_id: this stream's credential (token for w1) cannot "
                          "speak for worker \"w2\""));
  }
  {
    std::unique_ptr<grpc::ClientContext> context = As(kAlice);
    auto stream = workers_stub_->Connect(context.get());
    stream->Write(hello("w1"));
    stream->WritesDone();
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(s.error_message(), HasSubstr("a user token cannot open a worker stream"));
  }
  {
    std::unique_ptr<grpc::ClientContext> context = As(kW1);
    auto stream = workers_stub_->Connect(context.get());
    ASSERT_TRUE(stream->Write(hello("w1")));
    tally::v1::ControllerMessage m;
    ASSERT_TRUE(stream->Read(&m));
    EXPECT_TRUE(m.has_welcome()) << m.ShortDebugString();
    stream->WritesDone();
    while (stream->Read(&m)) {
    }
    grpc::Status s = stream->Finish();
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
}

// GetJobLogs and WatchJobLogs: GetJob's tenancy (another tenant's job is
// NOT_FOUND), a page with filters, a tail, and a watch that ends with the job.
TEST_F(ServicesTest, JobLogsHaveTheJobsTenancyFiltersAndAWatchThatEnds) {
  const std::string alices = SubmitTiny(kAlice);
  const int64_t id = std::stoll(alices.substr(5));
  std::vector<tally::v1::LogLine> lines;
  for (int i = 0; i < 3; ++i) {
    tally::v1::LogLine l;
    l.set_attempt(1);
    l.set_rank(i % 2);
    l.set_level("info");
    l.set_source("trainer");
    l.set_text("line " + std::to_string(i));
    l.mutable_time()->set_seconds(1'700'000'000 + i);
    lines.push_back(l);
  }
  ASSERT_TRUE(store_.AppendJobLogs(id, lines, 1 << 20).ok());

  tally::v1::GetJobLogsRequest req;
  req.set_name(alices);
  tally::v1::GetJobLogsResponse resp;
  grpc::Status s = jobs_stub_->GetJobLogs(As(kBob).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(s.error_message(), alices + " not found");
  ASSERT_TRUE(jobs_stub_->GetJobLogs(As(kAlice).get(), req, &resp).ok());
  ASSERT_EQ(resp.lines_size(), 3);
  EXPECT_EQ(resp.lines(2).sequence(), 3);
  EXPECT_FALSE(resp.more());
  req.mutable_selector()->set_rank(1);
  ASSERT_TRUE(jobs_stub_->GetJobLogs(As(kVera).get(), req, &resp).ok());
  ASSERT_EQ(resp.lines_size(), 1);
  EXPECT_EQ(resp.lines(0).text(), "line 1");
  req.mutable_selector()->clear_rank();
  req.mutable_selector()->set_tail(-1);
  s = jobs_stub_->GetJobLogs(As(kAlice).get(), req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("selector.tail"));

  // Bob's watch is refused; alice's sends the tail and ends once the job
  // has ended.
  tally::v1::WatchJobLogsRequest watch;
  watch.set_name(alices);
  watch.mutable_selector()->set_tail(2);
  {
    auto ctx = As(kBob);
    auto reader = jobs_stub_->WatchJobLogs(ctx.get(), watch);
    tally::v1::LogLine l;
    EXPECT_FALSE(reader->Read(&l));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  tally::v1::Job job;
  ASSERT_TRUE(Cancel(kAlice, alices, &job).ok());
  auto ctx = As(kAlice);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = jobs_stub_->WatchJobLogs(ctx.get(), watch);
  std::vector<std::string> texts;
  tally::v1::LogLine l;
  while (reader->Read(&l)) texts.push_back(l.text());
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_THAT(texts, ElementsAre("line 1", "line 2"));
}

}  // namespace
}  // namespace tally::api
