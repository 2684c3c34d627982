// Fuzzes tally-prep's corpus readers (worker/data/corpus.h): the text readers
// (one document per file, separator lines, blank lines), the JSONL reader, and
// (for JSONL inputs) the pre-tokenized reader over the same bytes, whose ids
// must all lie below the vocabulary (bit 4 of byte 0 picks 300 or 70,000).
//
// Input: byte 0 picks the format (low two bits) and, for JSONL, the field
// name; the rest is the file's contents. Each document handed to the sink
// must be non-empty valid UTF-8 without surrounding blank lines, its first
// line must be in the file, and documents come in file order.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "fuzz/scratch_dir.h"
#include "worker/data/corpus.h"

namespace {

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "corpus_fuzz: invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  tally::data::CorpusOptions options;
  switch (data[0] & 3) {
    case 0: options.format = tally::data::CorpusFormat::kTextFile; break;
    case 1: options.format = tally::data::CorpusFormat::kTextSeparator; break;
    case 2: options.format = tally::data::CorpusFormat::kTextBlankLine; break;
    case 3: options.format = tally::data::CorpusFormat::kJsonl; break;
  }
  if (data[0] & 4) options.separator = "---";
  if (data[0] & 8) options.field = "content";
  const std::string contents(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string path = tally::fuzz::ScratchDir() + "/corpus.txt";
  tally::fuzz::WriteFileOrDie(path, contents);
  int64_t num_lines = 0;
  for (char c : contents) num_lines += c == '\n';
  if (!contents.empty() && contents.back() != '\n') ++num_lines;

  int64_t last_line = 0;
  const absl::Status s = tally::data::ReadCorpusFile(
      path, options,
      [&](absl::string_view text, const tally::data::DocumentSource& where) {
        if (text.empty()) Fail("an empty document");
        if (absl::StripAsciiWhitespace(text).empty()) Fail("a blank document");
        if (const size_t bad = tally::data::FindInvalidUtf8(text);
            bad != absl::string_view::npos) {
          Fail(absl::StrCat("a document with invalid UTF-8 at byte ", bad));
        }
        if (options.format != tally::data::CorpusFormat::kJsonl &&
            (text.front() == '\n' || text.back() == '\n')) {
          Fail("a text document with a leading or trailing blank line");
        }
        if (where.file == nullptr || *where.file != path) Fail("a document names no file");
        if (where.first_line < 1 || where.first_line > num_lines) {
          Fail(absl::StrCat("first_line ", where.first_line, " outside the file's ",
                            num_lines, " lines"));
        }
        if (where.first_line <= last_line) {
          Fail(absl::StrCat("documents out of order: line ", where.first_line, " after ",
                            last_line));
        }
        last_line = where.first_line;
        return absl::OkStatus();
      });
  if (!s.ok() && (s.code() != absl::StatusCode::kInvalidArgument || s.message().empty())) {
    Fail("a bad corpus is not INVALID_ARGUMENT with a message: " + s.ToString());
  }
  if (tally::data::FindInvalidUtf8(contents) == absl::string_view::npos &&
      options.format != tally::data::CorpusFormat::kJsonl && !s.ok()) {
    Fail("a valid UTF-8 text corpus is rejected: " + s.ToString());
  }
  if (options.format == tally::data::CorpusFormat::kJsonl) {
    const int64_t vocab = (data[0] & 16) ? 70000 : 300;
    last_line = 0;
    const absl::Status ids = tally::data::ReadTokenIdsFile(
        path, options, vocab,
        [&](absl::Span<const uint32_t> tokens, const tally::data::DocumentSource& where) {
          if (tokens.empty()) Fail("an empty pre-tokenized document");
          for (uint32_t t : tokens) {
            if (t >= vocab) Fail(absl::StrCat("token id ", t, " past the vocabulary ", vocab));
          }
          if (where.first_line <= last_line || where.first_line > num_lines) {
            Fail(absl::StrCat("pre-tokenized document at line ", where.first_line));
          }
          last_line = where.first_line;
          return absl::OkStatus();
        });
    if (!ids.ok() && (ids.code() != absl::StatusCode::kInvalidArgument || ids.message().empty())) {
      Fail("bad pre-tokenized input is not INVALID_ARGUMENT with a message: " + ids.ToString());
    }
  }
  return 0;
}
