// How a watch (of a job's or an experiment's events) rides through tallyd
// restarting or briefly unreachable: how often and how long it tries again
// (Retry), and what the user is told meanwhile (WatchConnection).
// Single-threaded: one of each per watch.
#ifndef TALLY_CLI_TALLYCTL_WATCH_RECONNECT_H_
#define TALLY_CLI_TALLYCTL_WATCH_RECONNECT_H_

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/watch_metadata.h"

namespace tally::cli {

// A watch rides through tallyd restarting or briefly unreachable.
// UNAVAILABLE: tallyd draining or unreachable. CANCELLED we did not ask for:
// a call that reached a tallyd mid-shutdown. Both are worth a retry, for a
// while: 20 tries take about a minute and a half, 5 about six seconds.
struct Retry {
  int limit = 20;
  absl::Duration backoff = absl::Milliseconds(200);
  int failures = 0;

  // Whether to try again after `s`: it is UNAVAILABLE or CANCELLED, and no
  // more than `limit` tries in a row have failed, this one counted.
  bool Again(const grpc::Status& s) {
    const bool retryable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           s.error_code() == grpc::StatusCode::CANCELLED;
    return retryable && ++failures <= limit;
  }
  // Sleeps for the backoff, then doubles it, up to 5 seconds.
  void Wait() {
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
  // After a success: the count and the backoff start again.
  void Reset() { failures = 0, backoff = absl::Milliseconds(200); }
};

// A watch's connection as the user hears of it: once when the stream to
// tallyd is lost, however many attempts the reconnection takes, and once
// when a stream is back (tallyd's "tally-watch-established" initial
// metadata, or an event).
class WatchConnection {
 public:
  // Tells stderr the stream is lost (`why`) and the watch will resume after
  // event `after`; once, until Check finds a stream back.
  void Lost(const std::string& why, int64_t after) {
    if (lost_) return;
    lost_ = true;
    std::cerr << "tallyctl: lost the watch stream (" << why << "); reconnecting, to resume "
              << "after event " << after << "\n";
  }
  // After each new stream's initial metadata (or its first event): true
  // when tallyd accepted the watch.
  bool Check(const grpc::ClientContext& ctx, bool got_event, int64_t after) {
    const auto& md = ctx.GetServerInitialMetadata();
    const bool established = got_event || md.find(kWatchEstablishedKey) != md.end();
    if (established && lost_) {
      lost_ = false;
      std::cerr << "tallyctl: reconnected; resuming after event " << after << "\n";
    }
    return established;
  }

 private:
  bool lost_ = false;
};

}  // namespace tally::cli

#endif  // TALLY_CLI_TALLYCTL_WATCH_RECONNECT_H_
