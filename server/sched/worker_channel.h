// WorkerChannel: how the scheduler reaches a connected worker. The API
// layer's worker streams implement it; tests record what was sent.
#ifndef TALLY_SERVER_SCHED_WORKER_CHANNEL_H_
#define TALLY_SERVER_SCHED_WORKER_CHANNEL_H_

#include <string>

#include "tally/v1/workers.pb.h"

namespace tally::sched {

// Send must not block: the scheduler calls it while the API layer holds the
// lock that serialises every scheduler call.
class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;
  virtual void Send(const std::string& worker_id,
                    const tally::v1::ControllerMessage& message) = 0;
};

}  // namespace tally::sched

#endif  // TALLY_SERVER_SCHED_WORKER_CHANNEL_H_
