#include "server/ha/leader_lease.h"

#include <libpq-fe.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace tally::ha {

std::string LeaseState::Describe() const {
  if (!valid || holder.empty()) return "unknown (no valid lease)";
  return absl::StrCat(holder, " (epoch ", epoch, ")");
}

LeaderLease::LeaderLease(std::string dsn, std::string holder, absl::Duration lease_timeout)
    : dsn_(std::move(dsn)), holder_(std::move(holder)), lease_timeout_(lease_timeout) {}

LeaderLease::~LeaderLease() {
  if (conn_ != nullptr) PQfinish(conn_);
}

std::string LeaderLease::IntervalParam() const {
  return absl::StrCat(absl::ToInt64Milliseconds(lease_timeout_), " milliseconds");
}

absl::Status LeaderLease::EnsureConnected() {
  if (conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK) return absl::OkStatus();
  if (conn_ != nullptr) {
    PQfinish(conn_);
    conn_ = nullptr;
  }
  // The DSN is expanded first; the keywords after it bound how long a dead
  // server or a silent network can hold a lease call.
  const int64_t user_timeout_ms = std::max<int64_t>(absl::ToInt64Milliseconds(lease_timeout_) / 3, 200);
  const std::string user_timeout = absl::StrCat(user_timeout_ms);
  const char* keys[] = {"dbname",         "connect_timeout",   "keepalives",
                        "keepalives_idle", "keepalives_interval", "keepalives_count",
                        "tcp_user_timeout", "application_name", nullptr};
  const char* values[] = {dsn_.c_str(), "2", "1", "1", "1", "3", user_timeout.c_str(),
                          "tallyd-lease", nullptr};
  conn_ = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
    std::string why = conn_ != nullptr ? PQerrorMessage(conn_) : "out of memory";
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
    return absl::UnavailableError(
        absl::StrCat("lease: cannot connect to PostgreSQL: ", why, " (tallyd retries)"));
  }
  // synchronous_commit on whatever the server's default: a lease taken or
  // renewed is on disk before this tallyd acts on it, so a database crash
  // cannot hand the same epoch to a second tallyd.
  const std::string set = absl::StrCat("SET statement_timeout = ", user_timeout_ms,
                                       "; SET synchronous_commit = on");
  PGresult* r = PQexec(conn_, set.c_str());
  const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
  std::string why = ok ? "" : PQresultErrorMessage(r);
  PQclear(r);
  if (!ok) {
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    PQfinish(conn_);
    conn_ = nullptr;
    return absl::UnavailableError(
        absl::StrCat("lease: cannot set up the lease connection: ", why, " (tallyd retries)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<std::string>>> LeaderLease::Exec(
    const char* sql, const std::vector<std::string>& params) {
  if (absl::Status s = EnsureConnected(); !s.ok()) return s;
  std::vector<const char*> values;
  for (const std::string& p : params) values.push_back(p.c_str());
  PGresult* r = PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr,
                             values.data(), nullptr, nullptr, 0);
  const ExecStatusType st = PQresultStatus(r);
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
    const char* sqlstate = PQresultErrorField(r, PG_DIAG_SQLSTATE);
    std::string why = PQresultErrorMessage(r);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    const bool missing_table = sqlstate != nullptr && std::string(sqlstate) == "42P01";
    PQclear(r);
    if (missing_table) {
      return absl::FailedPreconditionError(
          "lease: table tally_lease does not exist; the store creates it when it opens the "
          "database");
    }
    if (PQstatus(conn_) != CONNECTION_OK) {
      PQfinish(conn_);
      conn_ = nullptr;
    }
    return absl::UnavailableError(absl::StrCat("lease: ", why, " (tallyd retries)"));
  }
  std::vector<std::vector<std::string>> rows;
  for (int i = 0; i < PQntuples(r); ++i) {
    std::vector<std::string> row;
    for (int j = 0; j < PQnfields(r); ++j) row.emplace_back(PQgetvalue(r, i, j));
    rows.push_back(std::move(row));
  }
  PQclear(r);
  return rows;
}

absl::StatusOr<std::optional<int64_t>> LeaderLease::TryAcquire() {
  auto rows = Exec(
      "UPDATE tally_lease SET holder = $1, epoch = epoch + 1, "
      "expires_at = now() + $2::interval "
      "WHERE id = 1 AND expires_at < now() RETURNING epoch",
      {holder_, IntervalParam()});
  if (!rows.ok()) return rows.status();
  if (rows->empty()) return std::nullopt;
  int64_t epoch = 0;
  if (!absl::SimpleAtoi((*rows)[0][0], &epoch)) {
    return absl::InternalError(absl::StrCat("lease: bad epoch \"", (*rows)[0][0], "\""));
  }
  return epoch;
}

absl::Status LeaderLease::Renew(int64_t epoch) {
  const char* const sql =
      "UPDATE tally_lease SET expires_at = now() + $2::interval "
      "WHERE id = 1 AND epoch = $1 RETURNING epoch";
  const bool had_connection = conn_ != nullptr;
  auto rows = Exec(sql, {absl::StrCat(epoch), IntervalParam()});
  if (!rows.ok() && absl::IsUnavailable(rows.status()) && had_connection && conn_ == nullptr) {
    // The database dropped the connection (a restart): the first statement
    // sent on it fails. A renewal is idempotent, so it goes once more, on a
    // fresh connection, rather than waiting a third of the lease for the
    // next one.
    rows = Exec(sql, {absl::StrCat(epoch), IntervalParam()});
  }
  if (!rows.ok()) return rows.status();
  if (rows->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("lease: epoch ", epoch, " is no longer current; another tallyd took over"));
  }
  return absl::OkStatus();
}

absl::Status LeaderLease::Release(int64_t epoch) {
  auto rows = Exec(
      "UPDATE tally_lease SET expires_at = '-infinity' WHERE id = 1 AND epoch = $1",
      {absl::StrCat(epoch)});
  return rows.status();
}

absl::StatusOr<LeaseState> LeaderLease::Read() {
  auto rows = Exec("SELECT holder, epoch, expires_at > now() FROM tally_lease WHERE id = 1", {});
  if (!rows.ok()) return rows.status();
  if (rows->empty()) {
    return absl::FailedPreconditionError("lease: tally_lease has no row 1");
  }
  LeaseState s;
  s.holder = (*rows)[0][0];
  if (!absl::SimpleAtoi((*rows)[0][1], &s.epoch)) {
    return absl::InternalError(absl::StrCat("lease: bad epoch \"", (*rows)[0][1], "\""));
  }
  s.valid = (*rows)[0][2] == "t";
  return s;
}

LeaseKeeper::LeaseKeeper(LeaderLease* lease, int64_t epoch, absl::Duration acquired_at,
                         Options options)
    : lease_(lease),
      epoch_(epoch),
      options_(std::move(options)),
      deadline_(options_.clock, options_.lease_timeout, acquired_at) {
  renewer_ = std::thread([this] { RenewLoop(); });
  watcher_ = std::thread([this] { WatchLoop(); });
}

LeaseKeeper::~LeaseKeeper() { Stop(); }

void LeaseKeeper::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (renewer_.joinable()) renewer_.join();
  if (watcher_.joinable()) watcher_.join();
}

void LeaseKeeper::Lose(const std::string& why) {
  if (lost_.exchange(true)) return;
  if (options_.on_lost) options_.on_lost(why);
}

void LeaseKeeper::RenewLoop() {
  const absl::Duration every = options_.lease_timeout / 3;
  while (!stop_.WaitForNotificationWithTimeout(every)) {
    if (lost_.load()) return;
    const absl::Duration sent = options_.clock->Elapsed();
    absl::Status s = lease_->Renew(epoch_);
    if (s.ok()) {
      deadline_.Renewed(sent);
    } else if (absl::IsFailedPrecondition(s)) {
      Lose(std::string(s.message()));
      return;
    } else {
      // The watcher decides when a run of failures has cost the lease.
      spdlog::warn("renewing the leader lease (epoch {}): {}", epoch_, std::string(s.message()));
    }
  }
}

void LeaseKeeper::WatchLoop() {
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
    if (lost_.load()) return;
    if (options_.must_restart && options_.must_restart()) {
      Lose("the store refused a write for a newer lease epoch or lost a COMMIT's outcome; "
           "state must be recovered from the database");
      return;
    }
    const bool expired = deadline_.Expired();
    if (expired && !options_.on_lapsed) {
      Lose(absl::StrCat("the leader lease (epoch ", epoch_, ") was not renewed for ",
                        absl::FormatDuration(options_.lease_timeout),
                        " (--lease_timeout); another tallyd may have taken over"));
      return;
    }
    if (expired && !lapsed_.load()) {
      lapsed_.store(true);
      lapsed_at_ = options_.clock->Elapsed();
      options_.on_lapsed(absl::StrCat(
          "the leader lease (epoch ", epoch_, ") was not renewed for ",
          absl::FormatDuration(options_.lease_timeout),
          " (--lease_timeout: the database could not be reached); another tallyd may lead "
          "now, so this one serves nothing until a renewal shows the lease is still its own"));
    } else if (expired && options_.clock->Elapsed() - lapsed_at_ > options_.max_lapse) {
      Lose(absl::StrCat("the leader lease (epoch ", epoch_, ") could not be renewed for ",
                        absl::FormatDuration(options_.max_lapse),
                        " after it lapsed; state must be recovered from the database"));
      return;
    } else if (!expired && lapsed_.load()) {
      lapsed_.store(false);
      if (options_.on_restored) options_.on_restored();
    }
  }
}

}  // namespace tally::ha
