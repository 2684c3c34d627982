// Where tallyd finds its PostgreSQL connection string, and how one is shown in
// logs without its password.
#ifndef TALLY_SERVER_HA_DSN_H_
#define TALLY_SERVER_HA_DSN_H_

#include <string>

#include "absl/status/statusor.h"

namespace tally::ha {

// The three ways to give tallyd its DSN. The two flags exclude each other;
// either one wins over the environment variable (a Secret mounted as a file
// and a stale variable in the image should not race).
struct DsnSources {
  std::string flag;       // --postgres_dsn
  std::string file_flag;  // --postgres_dsn_file
  std::string env;        // $TALLY_POSTGRES_DSN
};

// The DSN to use. INVALID_ARGUMENT when none is given (naming all three ways)
// or both flags are; NOT_FOUND / FAILED_PRECONDITION when the file cannot be
// read or is empty. A file's trailing whitespace (its newline) is trimmed.
absl::StatusOr<std::string> ResolveDsn(const DsnSources& sources);

// `dsn` (keyword/value or postgresql:// URI) as "host=... port=... dbname=...
// user=..." without the password or any other secret, for logs. A DSN libpq
// cannot parse is shown as "(unparsable DSN)", never verbatim.
std::string RedactDsn(const std::string& dsn);

}  // namespace tally::ha

#endif  // TALLY_SERVER_HA_DSN_H_
