#include "worker/data/corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/data/json_limits.h"

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

constexpr int kMaxJsonlDepth = 128;

std::string Where(const std::string& path, int64_t line) {
  return absl::StrCat(path, ":", line);
}

// Reads at most `cap` bytes into `buf`; 0 at the end of the input.
using ByteSource = std::function<absl::StatusOr<size_t>(char* buf, size_t cap)>;

// Splits a byte source into lines ('\n' removed), refusing any line longer
// than a limit before it is held: memory stays at the limit plus one buffer.
class LineReader {
 public:
  LineReader(ByteSource source, const std::string& path, int64_t max_line_bytes)
      : source_(std::move(source)), path_(path), max_line_bytes_(max_line_bytes) {}

  // True with the next line, false at the end of the input.
  absl::StatusOr<bool> Next(std::string* line) {
    line->clear();
    bool started = false;
    while (true) {
      if (pos_ == end_) {
        if (eof_) return started;
        absl::StatusOr<size_t> n = source_(buffer_, sizeof(buffer_));
        if (!n.ok()) return n.status();
        pos_ = 0;
        end_ = *n;
        if (end_ == 0) {
          eof_ = true;
          continue;
        }
      }
      started = true;
      const char* begin = buffer_ + pos_;
      const auto* nl = static_cast<const char*>(std::memchr(begin, '\n', end_ - pos_));
      const size_t take = nl ? static_cast<size_t>(nl - begin) : end_ - pos_;
      if (static_cast<int64_t>(line->size() + take) > max_line_bytes_) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(path_, line_no_ + 1), ": line is longer than ", max_line_bytes_,
            " bytes (raise --max_line_bytes if it is meant to be, or check that the file "
            "is text)"));
      }
      line->append(begin, take);
      pos_ += take;
      if (nl) {
        ++pos_;
        ++line_no_;
        return true;
      }
    }
  }

 private:
  ByteSource source_;
  const std::string& path_;
  const int64_t max_line_bytes_;
  char buffer_[1 << 16];
  size_t pos_ = 0;
  size_t end_ = 0;
  bool eof_ = false;
  int64_t line_no_ = 0;  // lines completed
};

// Accumulates lines into a document, trimming blank lines at either end.
class DocBuilder {
 public:
  DocBuilder(const std::string& path, int64_t max_doc_bytes)
      : path_(path), max_doc_bytes_(max_doc_bytes) {}

  absl::Status AddLine(absl::string_view line, int64_t line_no) {
    const bool blank = absl::StripAsciiWhitespace(line).empty();
    if (text_.empty() && pending_blank_ == 0 && blank) return absl::OkStatus();
    if (text_.empty() && pending_blank_ == 0) first_line_ = line_no;
    if (blank) {
      ++pending_blank_;
      return absl::OkStatus();
    }
    const size_t separator = text_.empty() ? 0 : pending_blank_ + 1;
    if (static_cast<int64_t>(text_.size() + separator + line.size()) > max_doc_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path_, first_line_), ": the document starting here is longer than ",
          max_doc_bytes_, " bytes (at line ", line_no,
          "; raise --max_doc_bytes, or check how the file is split into documents)"));
    }
    text_.append(separator, '\n');
    pending_blank_ = 0;
    text_.append(line.data(), line.size());
    return absl::OkStatus();
  }
  absl::Status Flush(const DocumentSink& sink) {
    absl::Status s;
    if (!text_.empty()) s = sink(text_, DocumentSource{&path_, first_line_});
    text_.clear();
    pending_blank_ = 0;
    return s;
  }

 private:
  const std::string& path_;
  const int64_t max_doc_bytes_;
  std::string text_;
  int64_t pending_blank_ = 0;
  int64_t first_line_ = 0;
};

absl::Status CheckOptions(const CorpusOptions& options) {
  if (options.max_line_bytes < 1 || options.max_doc_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_line_bytes and max_doc_bytes must be positive, got ", options.max_line_bytes,
        " and ", options.max_doc_bytes));
  }
  return absl::OkStatus();
}

// A JSONL line's object with only its `field` built (other members, and
// anything nested below the field unless `keep_nested`, are parsed but not
// built); a null json for a blank line.
absl::StatusOr<nlohmann::json> ParseJsonlLine(const std::string& line, int64_t line_no,
                                              const std::string& path, const std::string& field,
                                              bool keep_nested) {
  if (absl::StripAsciiWhitespace(line).empty()) return nlohmann::json();
  if (JsonNestsDeeperThan(line, kMaxJsonlDepth)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path, line_no), ": JSON nested deeper than ", kMaxJsonlDepth, " levels"));
  }
  const nlohmann::json::parser_callback_t keep_field =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (depth == 0) return true;
        if (event == nlohmann::json::parse_event_t::key && depth == 1) {
          return parsed.is_string() && parsed.get_ref<const std::string&>() == field;
        }
        return keep_nested || depth == 1;
      };
  nlohmann::json j = nlohmann::json::parse(line, keep_field, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(path, line_no), ": not a valid JSON line"));
  }
  if (!j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path, line_no), ": expected a JSON object, got ", j.type_name()));
  }
  return j;
}

absl::Status ReadJsonlLine(const std::string& line, int64_t line_no, const std::string& path,
                           const CorpusOptions& options, const DocumentSink& sink) {
  absl::StatusOr<nlohmann::json> parsed =
      ParseJsonlLine(line, line_no, path, options.field, /*keep_nested=*/false);
  if (!parsed.ok()) return parsed.status();
  if (parsed->is_null()) return absl::OkStatus();
  const nlohmann::json& j = *parsed;
  auto it = j.find(options.field);
  if (it != j.end() && it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path, line_no), ": field \"", options.field,
        "\" holds an array: for pre-tokenized input give --vocab_size (and --bos/--eos)"));
  }
  if (it == j.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path, line_no), ": no string field \"",
                                                   options.field,
                                                   "\" (choose the field with --field)"));
  }
  const std::string& text = it->get_ref<const std::string&>();
  // JSON escapes can carry lone surrogates; the text must be UTF-8.
  if (FindInvalidUtf8(text) != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(Where(path, line_no), ": field \"",
                                                   options.field,
                                                   "\" is not valid UTF-8 once decoded"));
  }
  if (static_cast<int64_t>(text.size()) > options.max_doc_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path, line_no), ": the document is ", text.size(), " bytes, longer than ",
        options.max_doc_bytes, " (raise --max_doc_bytes)"));
  }
  if (absl::StripAsciiWhitespace(text).empty()) return absl::OkStatus();
  return sink(text, DocumentSource{&path, line_no});
}

// A line of pre-tokenized JSONL: `field` holds an array of ids.
absl::Status ReadJsonlIdsLine(const std::string& line, int64_t line_no, const std::string& path,
                              const CorpusOptions& options, int64_t vocab_size,
                              const TokenIdsSink& sink, std::vector<uint32_t>* ids) {
  absl::StatusOr<nlohmann::json> parsed =
      ParseJsonlLine(line, line_no, path, options.field, /*keep_nested=*/true);
  if (!parsed.ok()) return parsed.status();
  if (parsed->is_null()) return absl::OkStatus();
  const nlohmann::json& j = *parsed;
  auto it = j.find(options.field);
  if (it == j.end() || !it->is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(path, line_no), ": no field \"", options.field,
        "\" holding an array of token ids (choose the field with --field; text is read "
        "without --vocab_size)"));
  }
  ids->clear();
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& v = (*it)[i];
    if (!v.is_number_integer()) {
      return absl::InvalidArgumentError(absl::StrCat(Where(path, line_no), ": \"", options.field,
                                                     "\"[", i, "] is ", v.dump().substr(0, 32),
                                                     ", not an integer token id"));
    }
    const bool negative = v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0;
    if (negative || v.get<uint64_t>() >= static_cast<uint64_t>(vocab_size)) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(path, line_no), ": \"", options.field, "\"[", i, "] is ", v.dump(),
                       ", outside the vocabulary [0, ", vocab_size, ") (check --vocab_size)"));
    }
    ids->push_back(static_cast<uint32_t>(v.get<uint64_t>()));
  }
  if (ids->empty()) return absl::OkStatus();
  return sink(*ids, DocumentSource{&path, line_no});
}

absl::Status ReadCorpus(ByteSource source, const std::string& path, const CorpusOptions& options,
                        const DocumentSink& sink, const TokenIdsSink* ids_sink = nullptr,
                        int64_t vocab_size = 0) {
  std::vector<uint32_t> ids;
  if (auto s = CheckOptions(options); !s.ok()) return s;
  LineReader lines(std::move(source), path, options.max_line_bytes);
  DocBuilder doc(path, options.max_doc_bytes);
  std::string line;
  int64_t line_no = 0;
  while (true) {
    absl::StatusOr<bool> more = lines.Next(&line);
    if (!more.ok()) return more.status();
    if (!*more) break;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (const size_t bad = FindInvalidUtf8(line); bad != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(path, line_no), ": byte ", bad + 1,
          " is not valid UTF-8 (convert the file to UTF-8, e.g. with iconv)"));
    }
    absl::Status s;
    switch (options.format) {
      case CorpusFormat::kTextFile:
        s = doc.AddLine(line, line_no);
        break;
      case CorpusFormat::kTextSeparator:
        s = absl::StripAsciiWhitespace(line) == options.separator ? doc.Flush(sink)
                                                                   : doc.AddLine(line, line_no);
        break;
      case CorpusFormat::kTextBlankLine:
        s = absl::StripAsciiWhitespace(line).empty() ? doc.Flush(sink)
                                                     : doc.AddLine(line, line_no);
        break;
      case CorpusFormat::kJsonl:
        s = ids_sink != nullptr
                ? ReadJsonlIdsLine(line, line_no, path, options, vocab_size, *ids_sink, &ids)
                : ReadJsonlLine(line, line_no, path, options, sink);
        break;
    }
    if (!s.ok()) return s;
  }
  return doc.Flush(sink);
}

// Opens `path` and runs `read` over its bytes (ReadCorpus's source).
absl::Status WithFile(const std::string& path,
                      const std::function<absl::Status(ByteSource)>& read) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    if (errno == ENOENT) return absl::NotFoundError(path + ": no such file");
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  std::unique_ptr<FILE, int (*)(FILE*)> closer(f, &std::fclose);
  return read([&](char* buf, size_t cap) -> absl::StatusOr<size_t> {
    const size_t n = std::fread(buf, 1, cap, f);
    if (n == 0 && std::ferror(f)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
    }
    return n;
  });
}

// `bytes` as ReadCorpus's source.
ByteSource FromBytes(absl::string_view bytes) {
  return [bytes](char* buf, size_t cap) mutable -> absl::StatusOr<size_t> {
    const size_t n = std::min(cap, bytes.size());
    std::memcpy(buf, bytes.data(), n);
    bytes.remove_prefix(n);
    return n;
  };
}

absl::Status NeedJsonl(const CorpusOptions& options) {
  if (options.format == CorpusFormat::kJsonl) return absl::OkStatus();
  return absl::InvalidArgumentError("pre-tokenized input is read from JSONL (--format=jsonl)");
}

}  // namespace

absl::Status ReadCorpusFile(const std::string& path, const CorpusOptions& options,
                            const DocumentSink& sink) {
  return WithFile(
      path, [&](ByteSource source) { return ReadCorpus(std::move(source), path, options, sink); });
}

absl::Status ReadCorpusBytes(absl::string_view bytes, const std::string& name,
                             const CorpusOptions& options, const DocumentSink& sink) {
  return ReadCorpus(FromBytes(bytes), name, options, sink);
}

absl::Status ReadTokenIdsFile(const std::string& path, const CorpusOptions& options,
                              int64_t vocab_size, const TokenIdsSink& sink) {
  if (absl::Status s = NeedJsonl(options); !s.ok()) return s;
  return WithFile(path, [&](ByteSource source) {
    return ReadCorpus(std::move(source), path, options, {}, &sink, vocab_size);
  });
}

absl::Status ReadTokenIdsBytes(absl::string_view bytes, const std::string& name,
                               const CorpusOptions& options, int64_t vocab_size,
                               const TokenIdsSink& sink) {
  if (absl::Status s = NeedJsonl(options); !s.ok()) return s;
  return ReadCorpus(FromBytes(bytes), name, options, {}, &sink, vocab_size);
}

}  // namespace tally::data
