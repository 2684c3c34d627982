// The libpq layer under PostgresJobStore: typed query parameters, binary
// results, and one connection whose errors become statuses a caller can act
// on (Unavailable: retry; the connection is then marked lost).
//
// Every query is parameterised (PQexecParams); results come back in binary:
// BYTEA is the serialized proto, integers are big-endian. Not thread-safe:
// PostgresJobStore uses a Connection under its own mutex.
#ifndef TALLY_SERVER_STORE_POSTGRES_WIRE_H_
#define TALLY_SERVER_STORE_POSTGRES_WIRE_H_

#include <libpq-fe.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace tally::store::pg {

// Type OIDs (pg_type.h), for parameters and binary results.
constexpr Oid kBoolOid = 16;
constexpr Oid kByteaOid = 17;
constexpr Oid kInt8Oid = 20;
constexpr Oid kInt2Oid = 21;
constexpr Oid kInt4Oid = 23;
constexpr Oid kTextOid = 25;
constexpr Oid kFloat8Oid = 701;
constexpr Oid kInt8ArrayOid = 1016;

// One query parameter: NULL, or bytes in binary format with a type.
struct Param {
  std::optional<std::string> value;
  Oid type = 0;
  int format = 1;  // 1 binary, 0 text
};

Param Int(int64_t v);
Param Float(double v);
Param Text(const std::string& v);
// NULL for "".
Param NullableText(const std::string& v);
Param Bytes(const std::string& v);
// A bigint[] in text format ("{1,2}"): the elements are integers we format.
Param IntArray(const std::vector<int64_t>& v);

// A query result in binary format; owns the PGresult.
class Result {
 public:
  explicit Result(PGresult* r) : r_(r) {}
  ~Result() { PQclear(r_); }
  Result(Result&& o) noexcept : r_(std::exchange(o.r_, nullptr)) {}
  Result& operator=(Result&&) = delete;

  int rows() const { return PQntuples(r_); }
  bool IsNull(int row, int col) const { return PQgetisnull(r_, row, col); }
  std::string Bytes(int row, int col) const {
    return std::string(PQgetvalue(r_, row, col), PQgetlength(r_, row, col));
  }
  // A bigint, integer, smallint or boolean column; 0 for another type.
  int64_t Int(int row, int col) const;
  double Double(int row, int col) const;
  const PGresult* raw() const { return r_; }
  std::string CmdStatus() const { return r_ ? PQcmdStatus(r_) : ""; }
  int64_t AffectedRows() const;

 private:
  PGresult* r_;
};

// A BYTEA cell holding a serialized `Proto`; DataLoss naming `table` when it
// does not parse.
template <typename Proto>
absl::StatusOr<Proto> ParseCell(const Result& r, int row, int col, absl::string_view table) {
  Proto p;
  if (!p.ParseFromString(r.Bytes(row, col))) {
    return absl::DataLossError(absl::StrCat("corrupt record in PostgreSQL table ", table));
  }
  return p;
}

template <typename Proto>
absl::StatusOr<std::vector<Proto>> ParseColumn(const Result& r, absl::string_view table) {
  std::vector<Proto> out;
  out.reserve(r.rows());
  for (int i = 0; i < r.rows(); ++i) {
    ASSIGN_OR_RETURN(Proto p, ParseCell<Proto>(r, i, 0, table));
    out.push_back(std::move(p));
  }
  return out;
}

// host:port/dbname from a DSN, for messages (never the DSN itself: it may
// hold a password).
std::string ServerName(const std::string& dsn);

// The connection and how its errors map to statuses. Owns `c`.
class Connection {
 public:
  explicit Connection(PGconn* c, std::string server) : c_(c), server_(std::move(server)) {}
  ~Connection() { PQfinish(c_); }

  bool Broken() const { return lost_ || PQstatus(c_) == CONNECTION_BAD; }
  // Reads anything the server sent while idle (a termination notice, EOF),
  // so Broken() is current.
  void Poll() { PQconsumeInput(c_); }

  // One statement with `params`; the result in binary format.
  absl::StatusOr<Result> Exec(const char* sql, const std::vector<Param>& params = {});

  // Several statements, no parameters.
  absl::Status ExecScript(const char* sql);

  // OK for a command or query that succeeded. Unavailable when the
  // connection is lost (marking it so) or for a serialization failure,
  // deadlock or lock timeout; ResourceExhausted, InvalidArgument or Internal
  // otherwise. Messages name the server, never the DSN.
  absl::Status Check(const Result& r, absl::string_view what);

 private:
  PGconn* c_;
  const std::string server_;
  bool lost_ = false;
};

}  // namespace tally::store::pg

#endif  // TALLY_SERVER_STORE_POSTGRES_WIRE_H_
