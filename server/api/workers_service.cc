#include "server/api/services.h"

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/text.h"
#include "server/api/refused_reactor.h"

// Workers.Connect: one bidirectional stream a worker, admitted by the gate
// and bounded per credential, carried by a WorkerStream.
namespace tally::api {
namespace {

// One Workers.Connect stream. Reads run one at a time on gRPC's threads and
// call into the core; writes drain a queue the core fills (Push, under the
// core's lock). A numbered report the core took (committed, or refused for
// good) is acknowledged once OnMessage returns: an Ack goes after whatever
// the report made the core send. It owns itself from Begin until OnDone; the
// core's map of sessions may hold it a little longer, so every entry point
// checks closed_.
class WorkerStream final
    : public grpc::ServerBidiReactor<tally::v1::WorkerMessage,
                                     tally::v1::ControllerMessage>,
      public WorkerSession {
 public:
  static WorkerStream* Begin(Core* core, grpc::CallbackServerContext* context,
                             WorkerIdentity identity, StreamLimiter::Lease lease,
                             const Gate* gate, Presented presented) {
    auto s = std::make_shared<WorkerStream>(core, context, std::move(identity));
    s->lease_ = std::move(lease);
    s->self_ = s;
    std::weak_ptr<WorkerStream> weak = s;
    s->credential_ = gate->WatchWorkerStream(
        std::move(presented), s->identity_, [weak](const absl::Status& why) {
          if (std::shared_ptr<WorkerStream> alive = weak.lock()) alive->Revoke(why);
        });
    s->StartRead(&s->in_);
    return s.get();
  }

  // The stream's credential was revoked or expired. Nothing more is
  // written to the stream and reports read after this are not acted on; the
  // scheduler hears that the worker is gone (nothing is placed on it from
  // then on); then the stream finishes with `why` (once no write is in
  // flight), which also ends the pending read.
  void Revoke(const absl::Status& why) {
    bool registered = false;
    bool finish = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      if (revoked_ || finished_) return;
      revoked_ = true;
      registered = registered_;
      closed_ = true;
      out_.clear();
      finish_status_ = ToGrpcStatus(why);
      if (!writing_) {
        finished_ = finish = true;
        status = finish_status_;
      }
    }
    if (registered) core_->Goodbye(worker_id_, this, generation_);
    if (finish) Finish(std::move(status));
  }

  WorkerStream(Core* core, grpc::CallbackServerContext* context, WorkerIdentity identity)
      : core_(core), context_(context), identity_(std::move(identity)) {}

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The worker ended its side or the stream broke.
      if (Revoked()) {
        EndStream(RevokedStatus());
        return;
      }
      // After a Hello, what is queued (the Acks of its last reports) is
      // written before the stream finishes.
      EndStream(hello_done_ ? grpc::Status::OK : grpc::Status::CANCELLED, 0,
                /*flush=*/hello_done_);
      return;
    }
    if (!hello_done_) {
      if (!in_.has_hello()) {
        EndStream(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                               "the first message on a Workers.Connect stream must "
                               "be a Hello"));
        return;
      }
      if (!identity_.Allows(in_.hello().worker_id())) {
        EndStream(grpc::Status(
            grpc::StatusCode::PERMISSION_DENIED,
            absl::StrCat("hello.worker_id: this stream's credential (", identity_.Describe(),
                         ") cannot speak for worker \"", EscapeUnprintable(in_.hello().worker_id()),
                         "\"; start tally-worker with --worker_id set to the name its "
                         "certificate or token carries")));
        return;
      }
      if (Revoked()) {
        EndStream(RevokedStatus());
        return;
      }
      absl::StatusOr<int64_t> generation = core_->Hello(in_.hello(), self_, identity_);
      if (!generation.ok()) {
        EndStream(ToGrpcStatus(generation.status()));
        return;
      }
      bool revoked = false;
      {
        absl::MutexLock lock(&mu_);
        worker_id_ = in_.hello().worker_id();
        generation_ = *generation;
        revoked = revoked_;
        registered_ = !revoked;
      }
      hello_done_ = true;
      if (revoked) {
        // Revoked while the Hello was being accepted: leave at once.
        EndStream(RevokedStatus());
        return;
      }
    } else {
      if (Revoked()) {
        EndStream(RevokedStatus());
        return;
      }
      const uint64_t seq = in_.seq();
      absl::Status s = core_->Run(
          [&](sched::Scheduler& sch) { return sch.OnMessage(worker_id_, in_); });
      if (!s.ok()) {
        // A refusal is for good: acknowledged, so the worker does not send
        // it again. Anything else (a failed commit) is not: the worker
        // sends it again on its next stream.
        EndStream(ToGrpcStatus(s), s.code() == absl::StatusCode::kInvalidArgument ? seq : 0);
        return;
      }
      if (seq > 0) {
        tally::v1::ControllerMessage ack;
        ack.mutable_ack()->set_seq(seq);
        Push(ack);
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    bool write = false;
    bool finish = false;
    bool with_last = false;
    grpc::Status status;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) {
        // The stream broke: nothing more is written; end the read side too
        // (which says goodbye) unless it has ended.
        flushing_ = false;
        out_.clear();
        if (!closed_) {
          closed_ = true;
          context_->TryCancel();
        }
      }
      if (!closed_ || flushing_) {
        write = NextWrite();
      }
      if (!write && closed_ && (read_done_ || revoked_) && !finished_) {
        finished_ = finish = true;
        status = finish_status_;
        with_last = has_last_;
      }
    }
    if (write) StartWrite(&current_);
    if (finish) FinishWith(std::move(status), with_last);
  }

  void OnDone() override {
    lease_.Release();
    credential_.Release();
    std::shared_ptr<WorkerStream> self = std::move(self_);
  }

  void Push(const tally::v1::ControllerMessage& m) override {
    {
      absl::MutexLock lock(&mu_);
      if (closed_) return;
      if (writing_) {
        // One Ack says everything up to its number: a queued one is raised.
        if (m.has_ack() && !out_.empty() && out_.back().has_ack()) {
          out_.back().mutable_ack()->set_seq(m.ack().seq());
          return;
        }
        out_.push_back(m);
        return;
      }
      current_ = m;
      writing_ = true;
    }
    StartWrite(&current_);
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    closed_ = true;
    out_.clear();
    // Under the lock: closed_ was false, so Finish has not been called and
    // the context is still alive.
    context_->TryCancel();
  }

 private:
  // Whether Revoke ran, and the status it finishes the stream with.
  bool Revoked() {
    absl::MutexLock lock(&mu_);
    return revoked_;
  }
  grpc::Status RevokedStatus() {
    absl::MutexLock lock(&mu_);
    return finish_status_;
  }

  // The read side is over: leave the core, then finish once no write is
  // outstanding. `ack` > 0: the stream's last message acknowledges the
  // reports up to it (a report refused for good). `flush`: what is queued
  // is written first (the worker ended its side after its last reports).
  void EndStream(grpc::Status status, uint64_t ack = 0, bool flush = false) {
    if (hello_done_) core_->Goodbye(worker_id_, this, generation_);
    bool finish = false;
    bool with_last = false;
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      read_done_ = true;
      if (!flush) out_.clear();
      finish_status_ = status;
      if (ack > 0) {
        last_.mutable_ack()->set_seq(ack);
        has_last_ = true;
      }
      flushing_ = !out_.empty();  // OnWriteDone writes the rest
      if (!writing_ && flushing_) {
        write = NextWrite();
      } else if (!writing_ && !flushing_ && !finished_) {
        finished_ = finish = true;
        with_last = has_last_;
      }
    }
    if (write) StartWrite(&current_);
    if (finish) FinishWith(std::move(status), with_last);
  }

  // The next queued message becomes the write in flight; false when none is
  // queued.
  bool NextWrite() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (out_.empty()) return false;
    current_ = std::move(out_.front());
    out_.pop_front();
    writing_ = true;
    return true;
  }

  void FinishWith(grpc::Status status, bool with_last) {
    if (with_last) {
      StartWriteAndFinish(&last_, grpc::WriteOptions(), std::move(status));
    } else {
      Finish(std::move(status));
    }
  }

  Core* const core_;
  grpc::CallbackServerContext* const context_;
  const WorkerIdentity identity_;
  StreamLimiter::Lease lease_;
  Gate::StreamWatch credential_;
  std::shared_ptr<WorkerStream> self_;
  // Touched only by the read side (one read at a time).
  tally::v1::WorkerMessage in_;
  bool hello_done_ = false;

  absl::Mutex mu_;
  // Set by the read side, under mu_, once the Hello is accepted; read by
  // Revoke.
  std::string worker_id_;
  int64_t generation_ = 0;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;  // the core holds this session
  bool revoked_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  std::deque<tally::v1::ControllerMessage> out_ ABSL_GUARDED_BY(mu_);
  tally::v1::ControllerMessage current_;  // owned by the write in flight
  // Written with the stream's status when has_last_; set once, by EndStream.
  tally::v1::ControllerMessage last_;
  bool has_last_ ABSL_GUARDED_BY(mu_) = false;
  // Closed, and writing what was queued before finishing.
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

WorkersService::WorkersService(Core* core, Options options)
    : core_(core),
      gate_(options.gate),
      limiter_({"Workers.Connect streams", options.max_streams_per_principal,
                "max_worker_streams_per_principal", options.max_streams, "max_worker_streams"}) {}

grpc::ServerBidiReactor<tally::v1::WorkerMessage, tally::v1::ControllerMessage>*
WorkersService::Connect(grpc::CallbackServerContext* context) {
  // Refused before anything is read: the stream ends with the reason.
  using RefusedStream =
      Refused<grpc::ServerBidiReactor<tally::v1::WorkerMessage, tally::v1::ControllerMessage>>;
  Presented presented = ReadPresented(*context);
  absl::StatusOr<WorkerIdentity> identity = GateOr(gate_)->AdmitWorker(presented);
  if (!identity.ok()) return new RefusedStream(ToGrpcStatus(identity.status()));
  // One credential (or one address, unauthenticated) holds a bounded number
  // of streams, Hello sent or not.
  absl::StatusOr<StreamLimiter::Lease> lease = limiter_.Acquire(
      identity->anonymous ? PeerPrincipal(*context) : identity->Describe());
  if (!lease.ok()) return new RefusedStream(ToGrpcStatus(lease.status()));
  return WorkerStream::Begin(core_, context, std::move(*identity), std::move(*lease),
                             GateOr(gate_), std::move(presented));
}


}  // namespace tally::api
