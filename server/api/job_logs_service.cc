// JobsService: GetJobLogs and WatchJobLogs, what a job's attempts printed,
// with GetJob's tenancy (another tenant's job is NOT_FOUND).
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/names.h"
#include "common/watch_metadata.h"
#include "google/protobuf/util/time_util.h"
#include "server/api/services.h"
#include "server/store/job_store.h"

namespace tally::api {
namespace {

constexpr int64_t kDefaultPage = 1000;
constexpr int64_t kMaxPage = 5000;
constexpr int64_t kMaxTail = 5000;

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// The store's query for a selector, or INVALID_ARGUMENT naming the field.
absl::StatusOr<store::LogQuery> QueryOf(const tally::v1::LogSelector& s) {
  store::LogQuery q;
  if (s.attempt() < 0) return Invalid("selector.attempt: 1 or more (0: every attempt)");
  if (s.has_rank() && (s.rank() < 0 || s.rank() > 65535)) {
    return Invalid("selector.rank: 0-65535 (unset: every rank)");
  }
  if (s.after_sequence() < 0) return Invalid("selector.after_sequence: must not be negative");
  if (s.tail() < 0 || s.tail() > kMaxTail) {
    return Invalid(absl::StrCat("selector.tail: 0-", kMaxTail, " lines (0: no tail)"));
  }
  if (s.has_since()) {
    if (s.since().seconds() < -62135596800 || s.since().seconds() > 253402300799 ||
        s.since().nanos() < 0 || s.since().nanos() > 999999999) {
      return Invalid("selector.since: not a valid timestamp");
    }
    q.since_micros = google::protobuf::util::TimeUtil::TimestampToMicroseconds(s.since());
  }
  q.attempt = s.attempt();
  q.rank = s.has_rank() ? s.rank() : -1;
  q.after_sequence = s.after_sequence();
  q.tail = s.tail();
  return q;
}

std::string LogStreamKey(const PrincipalFn& peer, const grpc::ServerContextBase& context,
                         const auth::Principal& principal) {
  if (principal.method == "anonymous") return peer(context);
  return absl::StrCat(principal.method, ":", principal.name);
}

}  // namespace

StreamLimiter::Options JobsService::LogWatchLimits() {
  StreamLimiter::Options limits;
  limits.what = "WatchJobLogs streams";
  limits.max_per_principal = 64;
  limits.max_total = 512;
  return limits;
}

grpc::Status JobsService::GetJobLogs(grpc::ServerContext* context,
                                     const tally::v1::GetJobLogsRequest* req,
                                     tally::v1::GetJobLogsResponse* resp) {
  absl::StatusOr<auth::Principal> caller = gate_->AdmitUser(*context, Access::kRead, "GetJobLogs");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  if (req->page_size() < 0 || req->page_size() > kMaxPage) {
    return ToGrpcStatus(Invalid(absl::StrCat("page_size: 0-", kMaxPage, " (0: ", kDefaultPage, ")")));
  }
  absl::StatusOr<store::LogQuery> q = QueryOf(req->selector());
  if (!q.ok()) return ToGrpcStatus(q.status());
  if (absl::StatusOr<store::JobRecord> rec = VisibleJob(*caller, *id); !rec.ok()) {
    return ToGrpcStatus(rec.status());
  }
  const int64_t page = req->page_size() > 0 ? req->page_size() : kDefaultPage;
  // One more than a page, to know whether more follow (a tail is one page).
  q->limit = q->tail > 0 ? page : page + 1;
  absl::StatusOr<std::vector<tally::v1::LogLine>> lines = core_->store()->ListJobLogs(*id, *q);
  if (!lines.ok()) return ToGrpcStatus(lines.status());
  if (static_cast<int64_t>(lines->size()) > page) {
    lines->resize(page);
    resp->set_more(true);
  }
  for (auto& l : *lines) *resp->add_lines() = std::move(l);
  return grpc::Status::OK;
}

grpc::Status JobsService::WatchJobLogs(grpc::ServerContext* context,
                                       const tally::v1::WatchJobLogsRequest* req,
                                       grpc::ServerWriter<tally::v1::LogLine>* writer) {
  Presented presented = ReadPresented(*context);
  absl::StatusOr<auth::Principal> caller =
      gate_->AdmitUser(presented, Access::kRead, "WatchJobLogs");
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  absl::StatusOr<int64_t> id = ParseJobName(req->name());
  if (!id.ok()) return ToGrpcStatus(id.status());
  absl::StatusOr<store::LogQuery> q = QueryOf(req->selector());
  if (!q.ok()) return ToGrpcStatus(q.status());
  if (absl::StatusOr<store::JobRecord> rec = VisibleJob(*caller, *id); !rec.ok()) {
    return ToGrpcStatus(rec.status());
  }
  absl::StatusOr<StreamLimiter::Lease> lease =
      log_watch_limiter_.Acquire(LogStreamKey(principal_, *context, *caller));
  if (!lease.ok()) return ToGrpcStatus(lease.status());
  // A revoked or expired credential ends the watch within a second.
  struct Revocation {
    absl::Mutex mu;
    absl::Status why ABSL_GUARDED_BY(mu);
  };
  auto revocation = std::make_shared<Revocation>();
  Gate::StreamWatch credential = gate_->WatchUserStream(
      std::move(presented), Access::kRead, "WatchJobLogs", *caller,
      [weak = std::weak_ptr<Revocation>(revocation)](const absl::Status& why) {
        if (std::shared_ptr<Revocation> r = weak.lock()) {
          absl::MutexLock lock(&r->mu);
          r->why = why;
        }
      });
  const auto revoked = [&revocation]() -> absl::Status {
    absl::MutexLock lock(&revocation->mu);
    return revocation->why;
  };
  context->AddInitialMetadata(kWatchEstablishedKey, "1");
  writer->SendInitialMetadata();
  logs::LogNotifier* notifier = core_->Run([](sched::Scheduler& s) { return s.log_notifier(); });
  q->limit = kDefaultPage;
  while (true) {
    // The version and the job's state first: lines stored after these reads
    // wake the wait below, and a job's lines are all stored before it ends.
    const int64_t version = notifier->version();
    absl::StatusOr<store::JobRecord> rec = core_->store()->GetJob(*id);
    if (!rec.ok()) return ToGrpcStatus(rec.status());
    absl::StatusOr<std::vector<tally::v1::LogLine>> lines = core_->store()->ListJobLogs(*id, *q);
    if (!lines.ok()) return ToGrpcStatus(lines.status());
    q->tail = 0;  // only the first read is a tail
    for (const auto& l : *lines) {
      if (absl::Status why = revoked(); !why.ok()) return ToGrpcStatus(why);
      if (context->IsCancelled() || !writer->Write(l)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      }
      q->after_sequence = l.sequence();
    }
    if (static_cast<int64_t>(lines->size()) == q->limit) continue;
    if (store::IsTerminal(rec->job().state())) return grpc::Status::OK;
    while (notifier->version() == version) {
      if (absl::Status why = revoked(); !why.ok()) return ToGrpcStatus(why);
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the watcher went away");
      }
      if (!notifier->Wait(version, absl::Seconds(1))) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "tallyd is shutting down; watch again with selector.after_sequence");
      }
      // A job that ended without lines since wakes no one: look again.
      absl::StatusOr<store::JobRecord> now = core_->store()->GetJob(*id);
      if (now.ok() && store::IsTerminal(now->job().state())) break;
    }
  }
}

}  // namespace tally::api
