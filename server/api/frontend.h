// Frontend: the services tallyd's one gRPC server registers for the whole
// life of the process.
//
// Until Serve() every call is refused UNAVAILABLE with the message last set
// (a standby names the leader; a tallyd still recovering says so), which
// clients given several addresses take as the sign to try the next one.
// From Serve() on each call goes to the leader's services.
//
// Why one server: a standby that serves from a server of its own must shut
// it down once it leads, and gRPC cancels every call that reaches a server
// while it shuts down. Clients saw CANCELLED, not the UNAVAILABLE they
// retry, for the calls that raced the hand-over. With one server bound once
// nothing is handed over.
//
// Thread-safety: SetRefusal and Serve may be called from any thread while
// calls are served. The services given to Serve must outlive the server's
// Shutdown.
#ifndef TALLY_SERVER_API_FRONTEND_H_
#define TALLY_SERVER_API_FRONTEND_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "server/api/services.h"

namespace tally::api {

// The health service name that answers SERVING on standbys and leaders alike
// (for liveness probes); "" is SERVING on the leader only.
inline constexpr char kLivenessService[] = "tally.live";

class Frontend {
 public:
  // `refusal`: what calls are refused with until the first SetRefusal.
  explicit Frontend(std::string refusal);
  ~Frontend();
  Frontend(const Frontend&) = delete;
  Frontend& operator=(const Frontend&) = delete;

  // Jobs, Experiments and Workers, to register on the server (owned here).
  std::vector<grpc::Service*> services();

  // The message of an UNAVAILABLE refusal until Serve().
  void SetRefusal(std::string message);
  std::string Refusal() const;

  // Every call from now on goes to these (not null).
  void Serve(JobsService* jobs, ExperimentsService* experiments, WorkersService* workers);

 private:
  class Jobs;
  class Experiments;
  class Workers;
  struct Leader {
    JobsService* jobs = nullptr;
    ExperimentsService* experiments = nullptr;
    WorkersService* workers = nullptr;
  };
  // The leader's services; all null before Serve().
  Leader leader() const;
  grpc::Status Unavailable() const;
  // A synchronous method's call: to the leader's `kService`'s `kMethod`
  // once served, else refused.
  template <auto kService, auto kMethod, typename... Args>
  grpc::Status Forward(Args... args) const {
    auto* to = leader().*kService;
    return to != nullptr ? (to->*kMethod)(args...) : Unavailable();
  }

  mutable absl::Mutex mu_;
  std::string refusal_ ABSL_GUARDED_BY(mu_);
  Leader leader_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Jobs> jobs_;
  std::unique_ptr<Experiments> experiments_;
  std::unique_ptr<Workers> workers_;
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_FRONTEND_H_
