// Leader election for tallyds sharing one PostgreSQL database.
//
// Design. The store's schema holds one lease row,
//   tally_lease(id = 1, holder TEXT, epoch BIGINT, expires_at TIMESTAMPTZ),
// and every time comparison uses the database's clock (now()), so the
// tallyds' own clocks never matter:
//   acquire: UPDATE tally_lease SET holder=$1, epoch=epoch+1,
//              expires_at=now()+$2 WHERE id=1 AND expires_at < now()
//            RETURNING epoch            -- only an expired lease is taken
//   renew:   UPDATE tally_lease SET expires_at=now()+$2
//              WHERE id=1 AND epoch=$1  -- 0 rows: another tallyd took it
//   release: UPDATE tally_lease SET expires_at='-infinity'
//              WHERE id=1 AND epoch=$1  -- a standby takes over at once
// The leader renews every lease_timeout/3 (LeaseKeeper). Before recovering
// its state it calls PostgresJobStore::SetFencingEpoch(epoch): every write
// transaction then re-reads the epoch under FOR SHARE and refuses to commit
// if it changed, so a leader that was paused or partitioned and wakes up
// after a standby took over cannot commit anything. Safety rests on that
// fence alone; the keeper's exit (code 3) on a lost or stale lease only stops
// an old leader from serving stale reads and holding worker streams.
#ifndef TALLY_SERVER_HA_LEADER_LEASE_H_
#define TALLY_SERVER_HA_LEADER_LEASE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/ha/lease_deadline.h"

typedef struct pg_conn PGconn;

namespace tally::ha {

// The lease row as read.
struct LeaseState {
  std::string holder;  // "" before anyone took it
  int64_t epoch = 0;
  bool valid = false;  // expires_at > now() on the database's clock
  // "HOST:PORT (epoch N)", or "unknown (no valid lease)" when !valid.
  std::string Describe() const;
};

// The lease SQL over its own connection (never the store's, whose
// transactions could delay a renewal). It connects on first use and again
// after a connection error, each attempt bounded by a 2 s connect timeout;
// statements are bounded by a statement_timeout of lease_timeout/3.
//
// Errors: UNAVAILABLE when the server cannot be reached (retry later);
// FAILED_PRECONDITION when the lease table is missing (the store has not
// migrated the database yet). Not thread-safe: one thread at a time.
class LeaderLease {
 public:
  // `holder` is written into the row so standbys can name the leader
  // (HOST:PORT). `lease_timeout` is how long an acquired or renewed lease
  // stays valid.
  LeaderLease(std::string dsn, std::string holder, absl::Duration lease_timeout);
  ~LeaderLease();
  LeaderLease(const LeaderLease&) = delete;
  LeaderLease& operator=(const LeaderLease&) = delete;

  // Takes the lease if it has expired (or was released): its new epoch.
  // nullopt when another holder's lease is still valid.
  absl::StatusOr<std::optional<int64_t>> TryAcquire();
  // Extends the lease of `epoch` by lease_timeout from the database's now().
  // FAILED_PRECONDITION when the row's epoch is no longer `epoch`.
  absl::Status Renew(int64_t epoch);
  // Expires the lease of `epoch` now (clean shutdown). OK, doing nothing,
  // when the epoch is no longer ours.
  absl::Status Release(int64_t epoch);
  // Reads the row.
  absl::StatusOr<LeaseState> Read();

  const std::string& holder() const { return holder_; }
  absl::Duration lease_timeout() const { return lease_timeout_; }

 private:
  absl::Status EnsureConnected();
  // Runs `sql` with text parameters; the rows' first column, or an error
  // (dropping the connection when it broke).
  absl::StatusOr<std::vector<std::vector<std::string>>> Exec(
      const char* sql, const std::vector<std::string>& params);
  std::string IntervalParam() const;

  const std::string dsn_;
  const std::string holder_;
  const absl::Duration lease_timeout_;
  PGconn* conn_ = nullptr;
};

// Keeps a held lease: renews it every lease_timeout/3 on one thread, and on a
// second thread watches that the last successful renewal was sent less than
// lease_timeout ago (LeaseDeadline, on options.clock) and that the store does
// not need a restart. When the store needs a restart, or a renewal finds the
// lease taken (another tallyd's epoch), it calls `on_lost` once, with the
// reason, from one of its threads.
//
// A deadline passed without a renewal is a lapse, not a loss: the database
// could not be reached (a restart, a network blip), so nobody can say yet
// whether another tallyd took the lease. With `on_lapsed` set the keeper
// calls it (this tallyd must stop serving: another may lead now) and goes on
// renewing with its epoch; a renewal that succeeds proves nobody took the
// lease meanwhile (taking it raises the epoch), and `on_restored` is called
// (serve again: the state is still this tallyd's, since the fence let no
// other epoch commit); one that finds the lease taken calls `on_lost`; a
// lapse longer than max_lapse too. Without `on_lapsed`, a lapse calls
// `on_lost`. Stop() (or the destructor) joins both threads; after it returns
// no renewal is in flight, so Release is safe.
//
// The threads pace themselves on real time (a renewal every lease_timeout/3,
// a watch pass every 50 ms); what they decide on time (when a renewal was
// sent, whether the deadline has passed) is read from options.clock only.
class LeaseKeeper {
 public:
  struct Options {
    absl::Duration lease_timeout = absl::Seconds(10);
    // Polled every 50 ms, before the deadline is checked; true means the
    // store's state is no longer trustworthy (PostgresJobStore::MustRestart).
    std::function<bool()> must_restart;
    std::function<void(const std::string& why)> on_lost;
    // A lapse began (with why) and ended with a renewal; see above.
    std::function<void(const std::string& why)> on_lapsed;
    std::function<void()> on_restored;
    absl::Duration max_lapse = absl::Minutes(10);
    // Not owned; must outlive the keeper. Tests pass a FakeMonotonicClock.
    const MonotonicClock* clock = RealMonotonicClock::Get();
  };

  // `lease` must outlive the keeper and is used only by its renewal thread
  // until Stop() returns. `acquired_at` is options.clock->Elapsed() read
  // before the acquiring statement was sent (Acquired::sent): the lease is
  // valid for lease_timeout from no earlier than that.
  LeaseKeeper(LeaderLease* lease, int64_t epoch, absl::Duration acquired_at, Options options);
  ~LeaseKeeper();
  void Stop();
  bool lost() const { return lost_.load(); }
  bool lapsed() const { return lapsed_.load(); }

 private:
  void RenewLoop();
  void WatchLoop();
  void Lose(const std::string& why);

  LeaderLease* const lease_;
  const int64_t epoch_;
  const Options options_;
  // Renewed by the renewal thread, checked by the watcher.
  LeaseDeadline deadline_;
  std::atomic<bool> lost_{false};
  // Owned by the watcher thread; read by lapsed().
  std::atomic<bool> lapsed_{false};
  absl::Duration lapsed_at_;
  absl::Notification stop_;
  std::thread renewer_;
  std::thread watcher_;
};

}  // namespace tally::ha

#endif  // TALLY_SERVER_HA_LEADER_LEASE_H_
