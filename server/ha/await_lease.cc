#include "server/ha/await_lease.h"

#include "spdlog/spdlog.h"

namespace tally::ha {

absl::StatusOr<std::optional<Acquired>> AwaitLease(LeaderLease* lease,
                                                   const AwaitOptions& options) {
  bool prepared = !options.prepare;
  std::string last_error;
  std::string last_leader;
  auto note_error = [&](const absl::Status& s) {
    std::string text(s.message());
    if (text != last_error) spdlog::warn("standby: {}", text);
    last_error = std::move(text);
  };
  while (true) {
    if (!prepared) {
      absl::Status s = options.prepare();
      if (s.ok()) {
        prepared = true;
        last_error.clear();
      } else if (absl::IsUnavailable(s)) {
        note_error(s);
      } else {
        return s;
      }
    }
    if (prepared) {
      const absl::Duration sent = options.clock->Elapsed();
      absl::StatusOr<std::optional<int64_t>> epoch = lease->TryAcquire();
      if (epoch.ok() && epoch->has_value()) return Acquired{**epoch, sent};
      absl::StatusOr<LeaseState> state =
          epoch.ok() ? lease->Read() : absl::StatusOr<LeaseState>(epoch.status());
      if (state.ok()) {
        last_error.clear();
        const std::string leader = state->Describe();
        if (leader != last_leader) {
          spdlog::info("standby: the leader is {}", leader);
          if (options.on_leader) options.on_leader(leader);
          last_leader = leader;
        }
      } else {
        note_error(state.status());
      }
    }
    if (!options.wait(options.poll_interval)) return std::nullopt;
  }
}

}  // namespace tally::ha
