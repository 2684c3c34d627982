// Limits applied to untrusted JSON before it is parsed into a DOM, so that a
// hostile input cannot turn a small file into a large allocation.
#ifndef TALLY_WORKER_DATA_JSON_LIMITS_H_
#define TALLY_WORKER_DATA_JSON_LIMITS_H_

#include "absl/strings/string_view.h"

namespace tally::data {

// True when arrays and objects in `text` nest deeper than `max_depth`
// (brackets inside strings do not count). One pass, no allocation; `text`
// need not be valid JSON.
bool JsonNestsDeeperThan(absl::string_view text, int max_depth);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_JSON_LIMITS_H_
