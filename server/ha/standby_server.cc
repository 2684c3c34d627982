#include "server/ha/standby_server.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace tally::ha {

// Answers every method no registered service claims (all of tally.v1.*).
class StandbyServer::Generic final : public grpc::CallbackGenericService {
 public:
  explicit Generic(const StandbyServer* owner) : owner_(owner) {}

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* /*ctx*/) override {
    class Refuse final : public grpc::ServerGenericBidiReactor {
     public:
      explicit Refuse(std::string message) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
      }
      void OnDone() override { delete this; }
    };
    return new Refuse(owner_->UnavailableMessage());
  }

 private:
  const StandbyServer* owner_;
};

StandbyServer::StandbyServer() : generic_(std::make_unique<Generic>(this)) {}

StandbyServer::~StandbyServer() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials,
    const std::function<void(grpc::ServerBuilder*)>& configure) {
  std::unique_ptr<StandbyServer> s(new StandbyServer());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  if (configure) configure(&builder);
  builder.AddListeningPort(listen, std::move(credentials), &s->port_);
  builder.RegisterCallbackGenericService(s->generic_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen: cannot listen on ", listen, " (address in use?)"));
  }
  grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService();
  health->SetServingStatus("", false);
  health->SetServingStatus(kLivenessService, true);
  return s;
}

void StandbyServer::SetLeader(const std::string& description) {
  absl::MutexLock lock(&mu_);
  leader_ = description;
}

std::string StandbyServer::UnavailableMessage() const {
  absl::MutexLock lock(&mu_);
  return absl::StrCat("this tallyd is a standby; the leader is ", leader_);
}

void StandbyServer::Shutdown(absl::Duration deadline) {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(deadline));
  server_->Wait();
  server_.reset();
}

}  // namespace tally::ha
