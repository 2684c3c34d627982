#include "server/api/services.h"


#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "common/text.h"
#include "common/watch_metadata.h"
#include "server/api/job_filter.h"
#include "server/api/refused_reactor.h"
#include "server/store/job_store.h"
#include "google/protobuf/descriptor.h"

namespace tally::api {
namespace {

constexpr int kDefaultPageSize = 50;
constexpr int kMaxPageSize = 1000;

// A List call's page: its size (0: the default, capped) and the id to list
// below (0: from the newest), or INVALID_ARGUMENT naming the field.
struct Page {
  int size = kDefaultPageSize;
  int64_t before_id = 0;
};
absl::StatusOr<Page> ParsePage(int32_t page_size, const std::string& page_token) {
  if (page_size < 0) return absl::InvalidArgumentError("page_size: must not be negative");
  Page p;
  if (page_size > 0) p.size = std::min(page_size, kMaxPageSize);
  if (!page_token.empty() &&
      (!absl::SimpleAtoi(page_token, &p.before_id) || p.before_id <= 0)) {
    return absl::InvalidArgumentError(
        "page_token: not a token this server returned; pass next_page_token from the "
        "previous response");
  }
  return p;
}

const Clock* ClockOr(const Clock* clock) {
  static const RealClock real;
  return clock != nullptr ? clock : &real;
}

// Who a change is recorded as made by: nobody when callers are not
// authenticated.
sched::Actor ActorOf(const auth::Principal& p) {
  if (p.method == "anonymous") return {};
  return sched::Actor{p.name, p.tenant};
}

// A cancel's reason is stored on the record and its events and shown to
// others (admins, watchers): at most 1000 printable characters.
absl::Status CheckReason(const std::string& reason) {
  if (reason.size() > 1000) {
    return absl::InvalidArgumentError("reason: must be at most 1000 characters");
  }
  if (std::optional<std::string> why = UnprintableReason(reason)) {
    return absl::InvalidArgumentError(absl::StrCat("reason: must be printable text; it ", *why));
  }
  return absl::OkStatus();
}

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat(name, " not found"));
}

// The tenant a List call shows: global admins any (or the one they ask for),
// others (tenant admins too) only their own.
absl::StatusOr<std::optional<std::string>> ListTenant(const auth::Principal& p,
                                                      const std::string& asked) {
  if (IsGlobalAdmin(p)) {
    if (asked.empty()) return std::optional<std::string>();
    return std::optional<std::string>(asked);
  }
  if (!asked.empty() && asked != p.tenant) {
    return absl::PermissionDeniedError(absl::StrCat(
        "tenant: ", p.name, " may list only its own tenant (", p.tenant,
        "); leave tenant empty"));
  }
  return std::optional<std::string>(p.tenant);
}

using FinishedWriteReactor = Refused<grpc::ServerWriteReactor<tally::v1::JobEvent>>;

// The key of per-caller stream limits: the principal when calls are
// authenticated, else what `peer` makes of the caller (its address).
std::string StreamKey(const PrincipalFn& peer, const grpc::ServerContextBase& context,
                      const auth::Principal& principal) {
  if (principal.method == "anonymous") return peer(context);
  return absl::StrCat(principal.method, ":", principal.name);
}

// One WatchJob stream: a JobWatch whose sends are the stream's writes. It
// owns itself from Begin until gRPC calls OnDone; the hub may hold it a
// little longer.
class WatchReactor final : public grpc::ServerWriteReactor<tally::v1::JobEvent>,
                           public JobWatch {
 public:
  static WatchReactor* Begin(grpc::CallbackServerContext* context, WatchHub* hub,
                             int64_t job_id, int64_t after_sequence, StreamLimiter::Lease lease,
                             const Gate* gate, Presented presented,
                             const auth::Principal& caller) {
    auto w = std::make_shared<WatchReactor>(hub, job_id, after_sequence, std::move(lease));
    w->self_ = w;
    // A revoked or expired credential ends the watch with the refusal.
    std::weak_ptr<WatchReactor> weak = w;
    w->credential_ = gate->WatchUserStream(
        std::move(presented), Access::kRead, "WatchJob", caller, [weak](const absl::Status& why) {
          if (std::shared_ptr<WatchReactor> alive = weak.lock()) alive->Revoke(why);
        });
    // At once, events or not: the client knows its stream is established
    // (an idle job sends nothing for a long time).
    context->AddInitialMetadata(kWatchEstablishedKey, "1");
    w->StartSendInitialMetadata();
    w->Start();
    return w.get();
  }

  WatchReactor(WatchHub* hub, int64_t job_id, int64_t after_sequence,
               StreamLimiter::Lease lease)
      : JobWatch(hub, job_id, after_sequence), lease_(std::move(lease)) {}

  void OnSendInitialMetadataDone(bool) override {}
  void OnWriteDone(bool ok) override { OnSent(ok); }
  void OnCancel() override { Cancel(); }
  void OnDone() override {
    lease_.Release();
    credential_.Release();
    std::shared_ptr<WatchReactor> self = std::move(self_);
  }

 private:
  void StartSend(const tally::v1::JobEvent* event) override { StartWrite(event); }
  void End(absl::Status status) override { Finish(ToGrpcStatus(status)); }

  StreamLimiter::Lease lease_;
  Gate::StreamWatch credential_;
  std::shared_ptr<WatchReactor> self_;
};

}  // namespace

namespace {

StreamLimiter::Options WatchLimits(const JobsService::Options& options) {
  StreamLimiter::Options limits;
  limits.what = "WatchJob streams";
  limits.max_per_principal = options.max_watch_streams_per_principal;
  limits.per_principal_flag = "max_watch_streams_per_principal";
  limits.max_total = options.max_watch_streams;
  limits.total_flag = "max_watch_streams";
  limits.reserved = options.watch_streams_reserved;
  limits.reserved_flag = "watch_streams_reserved";
  return limits;
}

}  // namespace

JobsService::JobsService(Core* core, Options options)
    : core_(core),
      principal_(std::move(options.principal)),
      gate_(GateOr(options.gate)),
      data_roots_(options.data_roots),
      priority_caps_(options.priority_caps),
      submit_limiter_(options.submit_limiter),
      clock_(ClockOr(options.clock)),
      watch_limiter_(WatchLimits(options)) {}

absl::StatusOr<store::JobRecord> JobsService::VisibleJob(const auth::Principal& p,
                                                         int64_t id) const {
  absl::StatusOr<store::JobRecord> rec = core_->store()->GetJob(id);
  if (!rec.ok()) return rec.status();
  if (!CanSee(p, rec->job().tenant())) return NotFound(JobName(id));
  return rec;
}

#define ADMIT_USER(context, access, what)                                       \
  absl::StatusOr<auth::Principal> caller = gate_->AdmitUser(*context, access, what); \
  if (!caller.ok()) return ToGrpcStatus(caller.status())

grpc::Status JobsService::SubmitJob(grpc::ServerContext* context,
                                    const tally::v1::SubmitJobRequest* req,
                                    tally::v1::Job* resp) {
  ADMIT_USER(context, Access::kWrite, "SubmitJob");
  if (submit_limiter_ != nullptr && caller->method != "anonymous") {
    if (absl::Status s =
            submit_limiter_->Take(StreamKey(principal_, *context, *caller), clock_->Now());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (!req->has_spec()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "spec: is required");
  }
  if (priority_caps_ != nullptr) {
    if (absl::Status s = priority_caps_->CheckJob(*caller, req->spec()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (data_roots_ != nullptr) {
    if (absl::Status s = data_roots_->CheckJobSpec(req->spec()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  absl::StatusOr<tally::v1::Job> job =
      core_->Submit(req->spec(), req->request_id(), ActorOf(*caller));
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp = *job;
  return grpc::Status::OK;
}

grpc::Status JobsService::GetJob(grpc::ServerContext* context,
                                 const tally::v1::GetJobRequest* req,
                                 tally::v1::Job* resp) {
  ADMIT_USER(context, Access::kRead, "GetJob");
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  // A live job comes from the scheduler, its cost accrued to this moment.
  std::optional<tally::v1::Job> live =
      core_->Run([&](sched::Scheduler& s) { return s.ActiveJobView(*id); });
  if (live) {
    if (!CanSee(*caller, live->tenant())) return ToGrpcStatus(NotFound(JobName(*id)));
    *resp = std::move(*live);
    return grpc::Status::OK;
  }
  absl::StatusOr<store::JobRecord> rec = VisibleJob(*caller, *id);
  if (!rec.ok()) return ToGrpcStatus(rec.status());
  *resp = rec->job();
  return grpc::Status::OK;
}

grpc::Status JobsService::EstimateCost(grpc::ServerContext* context,
                                       const tally::v1::EstimateCostRequest* req,
                                       tally::v1::CostEstimate* resp) {
  ADMIT_USER(context, Access::kRead, "EstimateCost");
  if (!req->has_spec()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "spec: is required");
  }
  absl::StatusOr<tally::v1::CostEstimate> e =
      core_->Run([&](sched::Scheduler& s) { return s.EstimateCost(req->spec()); });
  if (!e.ok()) return ToGrpcStatus(e.status());
  *resp = *e;
  return grpc::Status::OK;
}

namespace {

// A job as ListJobs shows it: without its train curve (GetJob has it), so a
// page of long jobs stays small.
void AddListed(const tally::v1::Job& job, tally::v1::ListJobsResponse* resp) {
  tally::v1::Job* out = resp->add_jobs();
  *out = job;
  out->clear_train_curve();
}

}  // namespace

grpc::Status JobsService::ListJobs(grpc::ServerContext* context,
                                   const tally::v1::ListJobsRequest* req,
                                   tally::v1::ListJobsResponse* resp) {
  ADMIT_USER(context, Access::kRead, "ListJobs");
  absl::StatusOr<Page> page = ParsePage(req->page_size(), req->page_token());
  if (!page.ok()) return ToGrpcStatus(page.status());
  absl::StatusOr<std::optional<std::string>> tenant = ListTenant(*caller, req->tenant());
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  store::JobQuery q;
  q.tenant = *tenant;
  q.limit = page->size;
  q.before_id = page->before_id;
  for (int s : req->states()) {
    const auto state = static_cast<tally::v1::JobState>(s);
    if (state == tally::v1::JOB_STATE_UNSPECIFIED ||
        !tally::v1::JobState_IsValid(s)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("states: ", s, " is not a job state"));
    }
    q.states.push_back(state);
  }
  absl::StatusOr<JobFilter> filter = ParseJobFilter(*req);
  if (!filter.ok()) return ToGrpcStatus(filter.status());
  if (filter->empty()) {
    ++q.limit;  // one more tells whether there is a next page
    absl::StatusOr<std::vector<store::JobRecord>> jobs = core_->store()->ListJobs(q);
    if (!jobs.ok()) return ToGrpcStatus(jobs.status());
    const bool more = static_cast<int>(jobs->size()) == q.limit;
    if (more) jobs->pop_back();
    for (const auto& j : *jobs) AddListed(j.job(), resp);
    if (more && !jobs->empty()) {
      resp->set_next_page_token(absl::StrCat(jobs->back().id()));
    }
    return grpc::Status::OK;
  }
  // Filtered: the store's pages are read until this page is full, bounded by
  // how many jobs one call may look at; the token then says where the next
  // call goes on (so a page may be short, or empty, and still have a next).
  constexpr int kMaxScannedPerCall = 20000;
  const int want = q.limit;
  q.limit = std::max(want + 1, 500);
  int scanned = 0;
  while (true) {
    absl::StatusOr<std::vector<store::JobRecord>> jobs = core_->store()->ListJobs(q);
    if (!jobs.ok()) return ToGrpcStatus(jobs.status());
    for (const auto& j : *jobs) {
      ++scanned;
      if (!Matches(*filter, j.job())) {
        q.before_id = j.id();
        continue;
      }
      if (resp->jobs_size() == want) {  // a match beyond this page
        resp->set_next_page_token(absl::StrCat(q.before_id));
        return grpc::Status::OK;
      }
      AddListed(j.job(), resp);
      q.before_id = j.id();
    }
    if (static_cast<int>(jobs->size()) < q.limit) return grpc::Status::OK;  // the last
    if (scanned >= kMaxScannedPerCall) {
      resp->set_next_page_token(absl::StrCat(q.before_id));
      return grpc::Status::OK;
    }
  }
}

grpc::Status JobsService::CancelJob(grpc::ServerContext* context,
                                    const tally::v1::CancelJobRequest* req,
                                    tally::v1::Job* resp) {
  ADMIT_USER(context, Access::kWrite, "CancelJob");
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (absl::Status s = CheckReason(req->reason()); !s.ok()) return ToGrpcStatus(s);
  if (absl::StatusOr<store::JobRecord> rec = VisibleJob(*caller, *id); !rec.ok()) {
    return ToGrpcStatus(rec.status());
  }
  absl::StatusOr<tally::v1::Job> job = core_->Run(
      [&](sched::Scheduler& s) { return s.Cancel(*id, req->reason(), ActorOf(*caller).name); });
  if (!job.ok()) return ToGrpcStatus(job.status());
  *resp = *job;
  return grpc::Status::OK;
}

ExperimentsService::ExperimentsService(Core* core, Options options)
    : core_(core),
      principal_(std::move(options.principal)),
      gate_(GateOr(options.gate)),
      data_roots_(options.data_roots),
      priority_caps_(options.priority_caps),
      submit_limiter_(options.submit_limiter),
      clock_(ClockOr(options.clock)),
      watch_limiter_({"WatchExperiment streams", options.max_watch_streams_per_principal,
                      "max_experiment_watch_streams_per_principal",
                      options.max_watch_streams, "max_experiment_watch_streams",
                      options.watch_streams_reserved,
                      "experiment_watch_streams_reserved"}) {}

absl::Status ExperimentsService::CheckVisible(const auth::Principal& p, int64_t id) const {
  if (IsGlobalAdmin(p)) return absl::OkStatus();
  absl::StatusOr<store::ExperimentRecord> rec = core_->store()->GetExperiment(id);
  if (!rec.ok()) return rec.status();
  if (!CanSee(p, rec->experiment().tenant())) return NotFound(ExperimentName(id));
  return absl::OkStatus();
}

grpc::Status ExperimentsService::CreateExperiment(grpc::ServerContext* context,
                                                  const tally::v1::CreateExperimentRequest* req,
                                                  tally::v1::Experiment* resp) {
  ADMIT_USER(context, Access::kWrite, "CreateExperiment");
  if (submit_limiter_ != nullptr && caller->method != "anonymous") {
    if (absl::Status s =
            submit_limiter_->Take(StreamKey(principal_, *context, *caller), clock_->Now());
        !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (!req->has_spec()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "spec: is required (an ExperimentSpec: base, variants, target)");
  }
  if (priority_caps_ != nullptr) {
    if (absl::Status s = priority_caps_->CheckExperiment(*caller, req->spec()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  if (data_roots_ != nullptr) {
    if (absl::Status s = data_roots_->CheckExperimentSpec(req->spec()); !s.ok()) {
      return ToGrpcStatus(s);
    }
  }
  absl::StatusOr<tally::v1::Experiment> e = core_->RunExperiments(
      [&](experiments::ExperimentManager& m) {
        return m.Create(req->spec(), req->request_id(),
                        ActorOf(*caller));
      });
  if (!e.ok()) return ToGrpcStatus(e.status());
  *resp = std::move(*e);
  return grpc::Status::OK;
}

grpc::Status ExperimentsService::GetExperiment(grpc::ServerContext* context,
                                               const tally::v1::GetExperimentRequest* req,
                                               tally::v1::Experiment* resp) {
  ADMIT_USER(context, Access::kRead, "GetExperiment");
  absl::StatusOr<int64_t> id = ParseExperimentName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (absl::Status s = CheckVisible(*caller, *id); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<tally::v1::Experiment> e =
      core_->RunExperiments([&](experiments::ExperimentManager& m) { return m.Get(*id); });
  if (!e.ok()) return ToGrpcStatus(e.status());
  *resp = std::move(*e);
  return grpc::Status::OK;
}

grpc::Status ExperimentsService::ListExperiments(grpc::ServerContext* context,
                                                 const tally::v1::ListExperimentsRequest* req,
                                                 tally::v1::ListExperimentsResponse* resp) {
  ADMIT_USER(context, Access::kRead, "ListExperiments");
  absl::StatusOr<Page> page = ParsePage(req->page_size(), req->page_token());
  if (!page.ok()) return ToGrpcStatus(page.status());
  absl::StatusOr<std::optional<std::string>> tenant = ListTenant(*caller, req->tenant());
  if (!tenant.ok()) return ToGrpcStatus(tenant.status());
  absl::StatusOr<std::vector<tally::v1::Experiment>> list =
      core_->RunExperiments([&](experiments::ExperimentManager& m) {
        // One more tells whether there is a next page.
        return m.List(page->before_id, page->size + 1, *tenant);
      });
  if (!list.ok()) return ToGrpcStatus(list.status());
  const bool more = static_cast<int>(list->size()) > page->size;
  if (more) list->pop_back();
  for (auto& e : *list) *resp->add_experiments() = std::move(e);
  if (more && resp->experiments_size() > 0) {
    absl::StatusOr<int64_t> last = ParseExperimentName(
        resp->experiments(resp->experiments_size() - 1).name());
    if (last.ok()) resp->set_next_page_token(absl::StrCat(*last));
  }
  return grpc::Status::OK;
}

grpc::Status ExperimentsService::CancelExperiment(grpc::ServerContext* context,
                                                  const tally::v1::CancelExperimentRequest* req,
                                                  tally::v1::Experiment* resp) {
  ADMIT_USER(context, Access::kWrite, "CancelExperiment");
  absl::StatusOr<int64_t> id = ParseExperimentName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (absl::Status s = CheckVisible(*caller, *id); !s.ok()) return ToGrpcStatus(s);
  if (absl::Status s = CheckReason(req->reason()); !s.ok()) return ToGrpcStatus(s);
  absl::StatusOr<tally::v1::Experiment> e = core_->RunExperiments(
      [&](experiments::ExperimentManager& m) {
        return m.Cancel(*id, req->reason(), ActorOf(*caller).name);
      });
  if (!e.ok()) return ToGrpcStatus(e.status());
  *resp = std::move(*e);
  return grpc::Status::OK;
}

grpc::Status ExperimentsService::WatchExperiment(
    grpc::ServerContext* context, const tally::v1::WatchExperimentRequest* req,
    grpc::ServerWriter<tally::v1::ExperimentEvent>* writer) {
  Presented presented = ReadPresented(*context);
  absl::StatusOr<auth::Principal> caller =
      gate_->AdmitUser(presented, Access::kRead, "WatchExperiment");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<int64_t> id = ParseExperimentName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (absl::Status s = CheckVisible(*caller, *id); !s.ok()) return ToGrpcStatus(s);
  if (req->after_sequence() < 0) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "after_sequence: must not be negative");
  }
  absl::StatusOr<StreamLimiter::Lease> lease =
      watch_limiter_.Acquire(StreamKey(principal_, *context, *caller));
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  // A revoked or expired credential ends the watch within the wait below
  // (one second).
  struct Revocation {
    absl::Mutex mu;
    absl::Status why ABSL_GUARDED_BY(mu);
  };
  auto revocation = std::make_shared<Revocation>();
  const auto revoked = [&revocation]() -> absl::Status {
    absl::MutexLock lock(&revocation->mu);
    return revocation->why;
  };
  Gate::StreamWatch credential = gate_->WatchUserStream(
      std::move(presented), Access::kRead, "WatchExperiment", *caller,
      [weak = std::weak_ptr<Revocation>(revocation)](const absl::Status& why) {
        if (std::shared_ptr<Revocation> r = weak.lock()) {
          absl::MutexLock lock(&r->mu);
          r->why = why;
        }
      });
  // At once, events or not: the client knows its stream is established.
  context->AddInitialMetadata(kWatchEstablishedKey, "1");
  writer->SendInitialMetadata();
  int64_t after = req->after_sequence();
  while (true) {
    // The version first: a commit after this read wakes the wait below.
    const int64_t version = core_->experiment_version();
    absl::StatusOr<store::ExperimentRecord> rec = core_->store()->GetExperiment(*id);
    if (!rec.ok()) return ToGrpcStatus(rec.status());
    absl::StatusOr<std::vector<tally::v1::ExperimentEvent>> events =
        core_->store()->ListExperimentEvents(*id, after, 256);
    if (!events.ok()) return ToGrpcStatus(events.status());
    for (const auto& e : *events) {
      if (absl::Status why = revoked(); !why.ok()) return ToGrpcStatus(why);
      if (context->IsCancelled() || !writer->Write(e)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      }
      after = e.sequence();
    }
    if (events->size() == 256) continue;
    if (rec->experiment().state() != tally::v1::EXPERIMENT_STATE_RUNNING &&
        after >= rec->experiment().last_event_sequence()) {
      return grpc::Status::OK;
    }
    // Wait for a commit; each second, see whether the watcher went away.
    // The store is read again only once some experiment has committed.
    while (core_->experiment_version() == version) {
      if (absl::Status why = revoked(); !why.ok()) return ToGrpcStatus(why);
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      }
      if (!core_->WaitExperiments(version, absl::Seconds(1))) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "tallyd is shutting down; watch again with after_sequence");
      }
    }
  }
}

grpc::ServerWriteReactor<tally::v1::JobEvent>* JobsService::WatchJob(
    grpc::CallbackServerContext* context, const tally::v1::WatchJobRequest* req) {
  Presented presented = ReadPresented(*context);
  absl::StatusOr<auth::Principal> caller = gate_->AdmitUser(presented, Access::kRead, "WatchJob");
  if (!caller.ok()) return new FinishedWriteReactor(ToGrpcStatus(caller.status()));
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return new FinishedWriteReactor(ToGrpcStatus(id.status()));
  if (!IsGlobalAdmin(*caller)) {
    if (absl::StatusOr<store::JobRecord> rec = VisibleJob(*caller, *id); !rec.ok()) {
      return new FinishedWriteReactor(ToGrpcStatus(rec.status()));
    }
  }
  if (req->after_sequence() < 0) {
    return new FinishedWriteReactor(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT, "after_sequence: must not be negative"));
  }
  absl::StatusOr<StreamLimiter::Lease> lease =
      watch_limiter_.Acquire(StreamKey(principal_, *context, *caller));
  if (!lease.ok()) return new FinishedWriteReactor(ToGrpcStatus(lease.status()));
  return WatchReactor::Begin(context, core_->watch_hub(), *id, req->after_sequence(),
                             std::move(*lease), gate_, std::move(presented), *caller);
}

grpc::Status JobsService::ListCheckpoints(
    grpc::ServerContext* context, const tally::v1::ListCheckpointsRequest* req,
    tally::v1::ListCheckpointsResponse* resp) {
  ADMIT_USER(context, Access::kRead, "ListCheckpoints");
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  absl::StatusOr<store::JobRecord> rec = VisibleJob(*caller, *id);
  if (!rec.ok()) return ToGrpcStatus(rec.status());
  auto checkpoints = core_->store()->ListCheckpoints(*id);
  if (!checkpoints.ok()) return ToGrpcStatus(checkpoints.status());
  for (auto& c : *checkpoints) *resp->add_checkpoints() = std::move(c);
  return grpc::Status::OK;
}

}  // namespace tally::api
