#include "common/controller_list.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/text.h"

namespace tally {
namespace {

constexpr absl::string_view kForm =
    "give HOST:PORT[,HOST:PORT...], e.g. tally-0.tally:50051,tally-1.tally:50051";

// gRPC target schemes that name their own address syntax.
constexpr absl::string_view kSchemes[] = {"dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:"};

bool IsHostChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ||
         c == '_';
}

bool IsPrintable(absl::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const unsigned char u = static_cast<unsigned char>(c);
    return u > 0x20 && u < 0x7f;
  });
}

// Empty when `address` is a valid HOST:PORT, else what is wrong with it.
std::string HostPortProblem(absl::string_view address) {
  // "http://host:port" is what a web address looks like; gRPC takes none.
  if (const size_t scheme_end = address.find("://"); scheme_end != absl::string_view::npos) {
    absl::string_view rest = address.substr(scheme_end + 3);
    rest = rest.substr(0, rest.find('/'));
    return absl::StrCat("is a URL: tallyd is reached at HOST:PORT without \"",
                        EscapeUnprintable(address.substr(0, scheme_end + 3)), "\" (give \"",
                        EscapeUnprintable(rest), "\"; for TLS, set ca_cert)");
  }
  absl::string_view host;
  absl::string_view port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == absl::string_view::npos) return "has '[' without ']'";
    host = address.substr(1, close - 1);
    absl::string_view rest = address.substr(close + 1);
    if (!absl::ConsumePrefix(&rest, ":")) return "has no port after the IPv6 host";
    port = rest;
    if (host.empty() ||
        !std::all_of(host.begin(), host.end(), [](char c) {
          return absl::ascii_isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.' ||
                 c == '%';
        })) {
      return "has a bad IPv6 host";
    }
  } else {
    const size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return "has no port";
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.empty()) return "has no host";
    if (absl::StrContains(host, ':')) return "has an IPv6 host that is not in brackets ([::1]:50051)";
    if (!std::all_of(host.begin(), host.end(), IsHostChar)) {
      return "has a host with characters other than letters, digits, '-', '.' and '_'";
    }
  }
  int number = 0;
  if (port.empty() || !std::all_of(port.begin(), port.end(),
                                   [](char c) { return absl::ascii_isdigit(c); }) ||
      port.size() > 5 || !absl::SimpleAtoi(port, &number) || number < 1 || number > 65535) {
    return absl::StrCat("has port \"", EscapeUnprintable(port),
                        "\"; a port is a number from 1 to 65535");
  }
  return "";
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseControllerList(absl::string_view value,
                                                             absl::string_view source) {
  if (absl::StripAsciiWhitespace(value).empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": no address; ", kForm));
  }
  std::vector<std::string> out;
  const std::vector<absl::string_view> parts = absl::StrSplit(value, ',');
  for (size_t i = 0; i < parts.size(); ++i) {
    const absl::string_view address = absl::StripAsciiWhitespace(parts[i]);
    const std::string where =
        parts.size() == 1 ? std::string(source)
                          : absl::StrCat(source, ": address ", i + 1, " of ", parts.size());
    if (address.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " is empty (\"", EscapeUnprintable(value), "\"); ", kForm));
    }
    const std::string quoted = absl::StrCat("\"", EscapeUnprintable(address), "\"");
    if (!IsPrintable(address)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", quoted, " has blanks or unprintable characters; ", kForm));
    }
    bool scheme = false;
    for (absl::string_view s : kSchemes) {
      if (absl::StartsWith(address, s)) {
        scheme = true;
        if (address.size() == s.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": ", quoted, " names no address after its scheme; ", kForm));
        }
        break;
      }
    }
    if (!scheme) {
      if (std::string problem = HostPortProblem(address); !problem.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": ", quoted, " ", problem, "; ", kForm));
      }
    }
    if (std::find(out.begin(), out.end(), address) != out.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", quoted, " is given twice; list each tallyd once"));
    }
    out.emplace_back(address);
  }
  return out;
}

}  // namespace tally
