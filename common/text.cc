#include "common/text.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tally {
namespace {

// Decodes the UTF-8 sequence at text[i]. Returns its length in bytes and sets
// *cp, or returns 0 when the bytes there are not well-formed UTF-8 (RFC 3629:
// no overlong forms, no surrogates, nothing past U+10FFFF).
size_t DecodeUtf8(absl::string_view text, size_t i, char32_t* cp) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  char32_t min;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80, *cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800, *cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, min = 0x10000, *cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (text.size() - i < len) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (byte(i + k) & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return len;
}

bool IsControl(char32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x2028 ||
         cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) ||
         (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

bool IsValidUtf8(absl::string_view text) {
  char32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

std::optional<std::string> UnprintableReason(absl::string_view text) {
  char32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) {
      return absl::StrFormat("is not valid UTF-8 (byte 0x%02x at offset %d)",
                             static_cast<uint8_t>(text[i]), i);
    }
    if (cp == 0) return absl::StrFormat("contains a NUL byte at offset %d", i);
    if (IsControl(cp)) {
      return absl::StrFormat("contains control character U+%04X at offset %d",
                             static_cast<uint32_t>(cp), i);
    }
    i += len;
  }
  return std::nullopt;
}

size_t Utf8Length(absl::string_view text) {
  if (!IsValidUtf8(text)) return text.size();
  size_t n = 0;
  for (char c : text) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
  return n;
}

std::string EscapeUnprintable(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  char32_t cp;
  for (size_t i = 0; i < text.size();) {
    const size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(text[i]));
      ++i;
      continue;
    }
    if (!IsControl(cp)) {
      out.append(text.data() + i, len);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp <= 0x7F) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint32_t>(cp));
    } else {
      absl::StrAppendFormat(&out, "\\u{%04X}", static_cast<uint32_t>(cp));
    }
    i += len;
  }
  return out;
}

std::string QuoteForMessage(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) {
    return absl::StrCat("\"", EscapeUnprintable(text), "\"");
  }
  size_t cut = max_bytes;
  // Back up over continuation bytes so a character is not split.
  while (cut > 0 && (static_cast<uint8_t>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat("\"", EscapeUnprintable(text.substr(0, cut)), "...\" (",
                      text.size(), " bytes)");
}

std::string FormatDollars(double usd) {
  if (usd != 0 && usd < 0.01 && usd > -0.01) return absl::StrFormat("$%.6f", usd);
  return absl::StrFormat("$%.4f", usd);
}

absl::Status CheckLabelValue(absl::string_view field, absl::string_view value) {
  const bool ok = !value.empty() && value.size() <= 64 &&
                  std::all_of(value.begin(), value.end(), [](char c) {
                    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                           (c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' ||
                           c == '-';
                  });
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": must be 1-64 characters of letters, digits and _ . : -, got ",
      QuoteForMessage(value, 64), " (", value.size(), " bytes)"));
}

absl::StatusOr<std::string> TenantName(absl::string_view field, absl::string_view raw) {
  const absl::string_view name = absl::StripAsciiWhitespace(raw);
  if (name.empty() && !raw.empty()) {
    // Never "no tenant" (for an admin: every tenant) by accident.
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": is only whitespace; leave it out for no tenant"));
  }
  if (name.empty()) return std::string();
  if (absl::Status s = CheckLabelValue(field, name); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(s.message(), " (a tenant name becomes a metric label)"));
  }
  return std::string(name);
}

}  // namespace tally
