// PostgresJobStore's schema: the migrations that build it, one per schema
// version, and the advisory lock that keeps two tallyds from running them at
// once.
#ifndef TALLY_SERVER_STORE_POSTGRES_SCHEMA_H_
#define TALLY_SERVER_STORE_POSTGRES_SCHEMA_H_

#include <cstdint>

namespace tally::store::pg {

// pg_advisory_xact_lock key for migrations: "tallymig" as an int64.
inline constexpr int64_t kMigrationLockKey = 0x74616c6c796d6967;

// The SQL script (several statements) that brings the schema from version
// `from` to `from + 1`, for 0 <= from < PostgresJobStore::kSchemaVersion.
// Append only: a released migration never changes.
const char* MigrationScript(int64_t from);

}  // namespace tally::store::pg

#endif  // TALLY_SERVER_STORE_POSTGRES_SCHEMA_H_
