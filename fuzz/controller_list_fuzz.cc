// Fuzzes ParseControllerList (common/controller_list.h): what tally-worker
// and tallyctl do with --controller, $TALLY_CONTROLLER and a context's
// address.
//
// Input: the whole value.
//
// Beyond "no crash, no sanitizer report" it checks:
// - a refused list is INVALID_ARGUMENT whose message starts with the source
//   ("--controller") and carries no control character (the input is
//   escaped, so a hostile value cannot write to the terminal);
// - an accepted list has one address per comma-separated part, each
//   non-empty, printable ASCII without blanks or commas, none twice;
// - the accepted addresses joined with commas parse back to the same list.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/controller_list.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "controller_list_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

constexpr absl::string_view kSource = "--controller";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view value(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<std::string>> list = tally::ParseControllerList(value, kSource);
  if (!list.ok()) {
    if (!absl::IsInvalidArgument(list.status())) Fail("a refusal is not INVALID_ARGUMENT");
    const absl::string_view message = list.status().message();
    if (!absl::StartsWith(message, kSource)) Fail("a refusal does not name --controller");
    for (char c : message) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) Fail("a refusal carries a control character");
    }
    return 0;
  }
  size_t parts = 1;
  for (char c : value) parts += c == ',' ? 1 : 0;
  if (list->size() != parts) Fail("an accepted list lost or gained an address");
  std::set<std::string> seen;
  for (const std::string& a : *list) {
    if (a.empty()) Fail("an accepted address is empty");
    for (char c : a) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u <= 0x20 || u >= 0x7f || c == ',') Fail("an accepted address has a blank or comma");
    }
    if (!seen.insert(a).second) Fail("an accepted list names an address twice");
  }
  absl::StatusOr<std::vector<std::string>> again =
      tally::ParseControllerList(absl::StrJoin(*list, ","), kSource);
  if (!again.ok() || *again != *list) Fail("an accepted list does not read back the same");
  return 0;
}
