#include "worker/data/corpus.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace tally::data {

size_t FindInvalidUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + static_cast<size_t>(n) >= s.size()) return i;  // truncated
    for (int k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n + 1;
  }
  return absl::string_view::npos;
}

namespace {

std::string Where(const std::string& path, int64_t line) {
  return absl::StrCat(path, ":", line);
}

// Accumulates lines into a document, trimming blank lines at either end.
class DocBuilder {
 public:
  void AddLine(absl::string_view line, int64_t line_no) {
    const bool blank = absl::StripAsciiWhitespace(line).empty();
    if (text_.empty() && pending_blank_ == 0 && blank) return;
    if (text_.empty() && pending_blank_ == 0) first_line_ = line_no;
    if (blank) {
      ++pending_blank_;
      return;
    }
    if (!text_.empty()) text_.append(pending_blank_ + 1, '\n');
    pending_blank_ = 0;
    text_.append(line.data(), line.size());
  }
  absl::Status Flush(const std::string& path, const DocumentSink& sink) {
    absl::Status s;
    if (!text_.empty()) s = sink(text_, DocumentSource{&path, first_line_});
    text_.clear();
    pending_blank_ = 0;
    return s;
  }

 private:
  std::string text_;
  int pending_blank_ = 0;
  int64_t first_line_ = 0;
};

}  // namespace

absl::Status ReadCorpusFile(const std::string& path, const CorpusOptions& options,
                            const DocumentSink& sink) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) return absl::NotFoundError(path + ": no such file");
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  DocBuilder doc;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (const size_t bad = FindInvalidUtf8(line); bad != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path, line_no), ": byte ", bad + 1,
          " is not valid UTF-8 (convert the file to UTF-8, e.g. with iconv)"));
    }
    switch (options.format) {
      case CorpusFormat::kTextFile:
        doc.AddLine(line, line_no);
        break;
      case CorpusFormat::kTextSeparator:
        if (absl::StripAsciiWhitespace(line) == options.separator) {
          if (auto s = doc.Flush(path, sink); !s.ok()) return s;
        } else {
          doc.AddLine(line, line_no);
        }
        break;
      case CorpusFormat::kTextBlankLine:
        if (absl::StripAsciiWhitespace(line).empty()) {
          if (auto s = doc.Flush(path, sink); !s.ok()) return s;
        } else {
          doc.AddLine(line, line_no);
        }
        break;
      case CorpusFormat::kJsonl: {
        if (absl::StripAsciiWhitespace(line).empty()) break;
        nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(path, line_no), ": not a valid JSON line"));
        }
        if (!j.is_object()) {
          return absl::InvalidArgumentError(
              absl::StrCat(Where(path, line_no), ": expected a JSON object, got ",
                           j.type_name()));
        }
        auto it = j.find(options.field);
        if (it == j.end() || !it->is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              Where(path, line_no), ": no string field \"", options.field,
              "\" (choose the field with --field)"));
        }
        const std::string& text = it->get_ref<const std::string&>();
        // JSON escapes can carry lone surrogates; the text must be UTF-8.
        if (FindInvalidUtf8(text) != absl::string_view::npos) {
          return absl::InvalidArgumentError(absl::StrCat(
              Where(path, line_no), ": field \"", options.field,
              "\" is not valid UTF-8 once decoded"));
        }
        if (!absl::StripAsciiWhitespace(text).empty()) {
          if (auto s = sink(text, DocumentSource{&path, line_no}); !s.ok()) return s;
        }
        break;
      }
    }
  }
  if (in.bad()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": read error after line ", line_no));
  }
  return doc.Flush(path, sink);
}

}  // namespace tally::data
