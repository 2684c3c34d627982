// Refused: a callback-API stream reactor that ends at once with a status,
// for a call refused before anything is read or written. Internal to
// server/api.
#ifndef TALLY_SERVER_API_REFUSED_REACTOR_H_
#define TALLY_SERVER_API_REFUSED_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <utility>

namespace tally::api {

// A stream refused before it started (Reactor: a callback API reactor).
template <typename Reactor>
class Refused final : public Reactor {
 public:
  explicit Refused(grpc::Status status) { this->Finish(std::move(status)); }
  void OnDone() override { delete this; }
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_REFUSED_REACTOR_H_
