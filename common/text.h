// Printable text: UTF-8 checks for strings users write (job specs) and
// escaping for strings shown on a terminal or in an error message.
//
// "Printable" here means valid UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF) without control characters: C0 (U+0000-U+001F,
// including NUL, tab and newline), DEL, C1 (U+0080-U+009F), the line and
// paragraph separators (U+2028, U+2029) and the bidirectional embedding,
// override and isolate controls (U+202A-U+202E, U+2066-U+2069), which make a
// terminal show text in an order other than the bytes'.
//
// All functions are pure and thread-safe.
#ifndef TALLY_COMMON_TEXT_H_
#define TALLY_COMMON_TEXT_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

// True when `text` is well-formed UTF-8 (protobuf's rule for string fields).
bool IsValidUtf8(absl::string_view text);

// Why `text` is not printable, e.g. "is not valid UTF-8 (byte 0xff at offset
// 3)" or "contains control character U+001B at offset 0", or nullopt when it
// is printable. The reason names the first problem only.
std::optional<std::string> UnprintableReason(absl::string_view text);

// The number of code points in valid UTF-8 `text` (bytes for invalid input).
size_t Utf8Length(absl::string_view text);

// `text` with every character that is not printable written as an escape:
// "\n", "\t", "\r", "\xNN" for other C0 bytes, DEL and bytes that are not
// valid UTF-8, "\u{XXXX}" for the other control characters. Printable text,
// including non-ASCII and backslashes, is unchanged: the result is for people
// to read, not to be unescaped.
std::string EscapeUnprintable(absl::string_view text);

// `text` for quoting in an error message: escaped as above, in double quotes,
// and cut after `max_bytes` bytes of input (at a character boundary) with
// "..." and the full length, so a message stays short whatever the input.
std::string QuoteForMessage(absl::string_view text, size_t max_bytes = 64);

// Dollars as tables and messages show them: "$1.2346", with six decimals for
// a non-zero amount under a cent ("$0.000837", tiny CPU runs).
std::string FormatDollars(double usd);

// A value that becomes a metric label (a worker's gpu_type): 1-64
// characters of [A-Za-z0-9_.:-]. INVALID_ARGUMENT naming `field`.
absl::Status CheckLabelValue(absl::string_view field, absl::string_view value);

// A tenant's name as written in a token file, a JWT claim or tallyd's
// config: surrounding whitespace dropped, then a label value (as
// CheckLabelValue: it names metric series); "" stays "" (no tenant), and
// whitespace alone is refused (it would read as no tenant). INVALID_ARGUMENT
// naming `field`.
absl::StatusOr<std::string> TenantName(absl::string_view field, absl::string_view raw);

}  // namespace tally

#endif  // TALLY_COMMON_TEXT_H_
