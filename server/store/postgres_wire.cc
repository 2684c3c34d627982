#include "server/store/postgres_wire.h"

#include <endian.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_join.h"

namespace tally::store::pg {

Param Int(int64_t v) {
  const uint64_t be = htobe64(static_cast<uint64_t>(v));
  return {std::string(reinterpret_cast<const char*>(&be), sizeof(be)), kInt8Oid, 1};
}
Param Float(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  bits = htobe64(bits);
  return {std::string(reinterpret_cast<const char*>(&bits), sizeof(bits)), kFloat8Oid, 1};
}
Param Text(const std::string& v) { return {v, kTextOid, 1}; }
Param NullableText(const std::string& v) {
  if (v.empty()) return {std::nullopt, kTextOid, 1};
  return Text(v);
}
Param Bytes(const std::string& v) { return {v, kByteaOid, 1}; }
Param IntArray(const std::vector<int64_t>& v) {
  return {absl::StrCat("{", absl::StrJoin(v, ","), "}"), kInt8ArrayOid, 0};
}

int64_t Result::Int(int row, int col) const {
  const char* p = PQgetvalue(r_, row, col);
  switch (PQftype(r_, col)) {
    case kInt8Oid: {
      uint64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<int64_t>(be64toh(v));
    }
    case kInt4Oid: {
      uint32_t v;
      std::memcpy(&v, p, 4);
      return static_cast<int32_t>(be32toh(v));
    }
    case kInt2Oid: {
      uint16_t v;
      std::memcpy(&v, p, 2);
      return static_cast<int16_t>(be16toh(v));
    }
    case kBoolOid:
      return *p != 0;
    default:
      return 0;
  }
}

double Result::Double(int row, int col) const {
  uint64_t v;
  std::memcpy(&v, PQgetvalue(r_, row, col), 8);
  v = be64toh(v);
  double d;
  std::memcpy(&d, &v, 8);
  return d;
}

int64_t Result::AffectedRows() const {
  const char* n = PQcmdTuples(const_cast<PGresult*>(r_));
  return *n ? std::strtoll(n, nullptr, 10) : 0;
}

std::string ServerName(const std::string& dsn) {
  char* err = nullptr;
  PQconninfoOption* opts = PQconninfoParse(dsn.c_str(), &err);
  if (opts == nullptr) {
    PQfreemem(err);
    return "PostgreSQL";
  }
  std::string host = "localhost", port = "5432", db;
  for (PQconninfoOption* o = opts; o->keyword != nullptr; ++o) {
    if (o->val == nullptr || *o->val == '\0') continue;
    const std::string k = o->keyword;
    if (k == "host" || (k == "hostaddr" && host == "localhost")) host = o->val;
    if (k == "port") port = o->val;
    if (k == "dbname") db = o->val;
  }
  PQconninfoFree(opts);
  return absl::StrCat("PostgreSQL at ", host, ":", port, db.empty() ? "" : "/", db);
}

absl::StatusOr<Result> Connection::Exec(const char* sql, const std::vector<Param>& params) {
  std::vector<Oid> types;
  std::vector<const char*> values;
  std::vector<int> lengths, formats;
  for (const Param& p : params) {
    types.push_back(p.type);
    values.push_back(p.value ? p.value->data() : nullptr);
    lengths.push_back(p.value ? static_cast<int>(p.value->size()) : 0);
    formats.push_back(p.format);
  }
  Result r(PQexecParams(c_, sql, static_cast<int>(params.size()), types.data(), values.data(),
                        lengths.data(), formats.data(), 1));
  RETURN_IF_ERROR(Check(r, sql));
  return r;
}

absl::Status Connection::ExecScript(const char* sql) {
  Result r(PQexec(c_, sql));
  return Check(r, sql);
}

absl::Status Connection::Check(const Result& r, absl::string_view what) {
  const PGresult* res = r.raw();
  const ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return absl::OkStatus();
  std::string detail = PQerrorMessage(c_);
  while (!detail.empty() && (detail.back() == '\n' || detail.back() == ' ')) detail.pop_back();
  const char* state = res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : nullptr;
  const std::string sqlstate = state ? state : "";
  if (Broken() || sqlstate.rfind("08", 0) == 0 || sqlstate.rfind("57P", 0) == 0) {
    lost_ = true;
    return absl::UnavailableError(
        absl::StrCat("lost the connection to ", server_, " (", detail,
                     "); tallyd reconnects and retries, try again shortly"));
  }
  std::string msg =
      absl::StrCat(server_, ": ", detail, " [SQLSTATE ", sqlstate, "] in: ", what.substr(0, 80));
  if (sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "55P03") {
    return absl::UnavailableError(absl::StrCat(msg, "; retry"));
  }
  if (sqlstate.rfind("53", 0) == 0) return absl::ResourceExhaustedError(msg);
  if (sqlstate.rfind("22", 0) == 0) return absl::InvalidArgumentError(msg);
  return absl::InternalError(msg);
}

}  // namespace tally::store::pg
