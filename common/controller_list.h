// tallyd's addresses as clients are given them (--controller,
// $TALLY_CONTROLLER, a tallyctl context): one address, or several separated
// by commas, e.g. "tally-0.tally:50051,tally-1.tally:50051". With several
// (a leader and its standbys), a client that cannot reach one, or is told
// UNAVAILABLE by it, moves on to the next.
#ifndef TALLY_COMMON_CONTROLLER_LIST_H_
#define TALLY_COMMON_CONTROLLER_LIST_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

// Splits `value` at commas (blanks around each address are dropped) and
// checks each address: HOST:PORT (an IPv6 host in brackets, [::1]:50051),
// or a gRPC target with its scheme (dns:///host:port, ipv4:1.2.3.4:5,
// unix:/path). INVALID_ARGUMENT, naming `source` (e.g. "--controller") and
// the address at fault, for an empty list or address, a missing or bad
// port, a bad host, or an address given twice.
absl::StatusOr<std::vector<std::string>> ParseControllerList(absl::string_view value,
                                                             absl::string_view source);

}  // namespace tally

#endif  // TALLY_COMMON_CONTROLLER_LIST_H_
