// --address_file: where tallyd says, once it serves, which ports it bound
// ("grpc=HOST:PORT metrics=HOST:PORT"), for scripts and tests that start it
// on port 0. Readers take the file's appearance as the sign that it serves.
#ifndef TALLY_SERVER_WIRING_ADDRESS_FILE_H_
#define TALLY_SERVER_WIRING_ADDRESS_FILE_H_

#include <string>

#include "absl/status/status.h"

namespace tally::wiring {

// FailedPrecondition, naming the flag, unless `path`'s temporary file can be
// written. The temporary file is made and removed: `path` itself appears
// only once tallyd serves.
absl::Status CheckAddressFile(const std::string& path);

// Writes `text` to `path` atomically (a temporary file renamed over it), so a
// reader never sees half of it. Errors name the flag and the path.
absl::Status WriteAddressFile(const std::string& path, const std::string& text);

}  // namespace tally::wiring

#endif  // TALLY_SERVER_WIRING_ADDRESS_FILE_H_
