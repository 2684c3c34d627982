// Corpus readers for tally-prep: they stream documents out of text and JSONL
// files without holding a corpus in memory. Memory is bounded by the options'
// line and document limits, whatever the input: a longer line or document is
// an error, not an allocation. Every error names the file and, where it has
// one, the line.
#ifndef TALLY_WORKER_DATA_CORPUS_H_
#define TALLY_WORKER_DATA_CORPUS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tally::data {

enum class CorpusFormat {
  kTextFile,       // each file is one document
  kTextSeparator,  // documents end at a line equal to `separator` (e.g. "%")
  kTextBlankLine,  // documents end at one or more blank lines
  kJsonl,          // one JSON object a line; the document is `field`
};

struct CorpusOptions {
  CorpusFormat format = CorpusFormat::kTextSeparator;
  std::string separator = "%";
  std::string field = "text";
  // Longest line, in bytes (a JSONL line holds a whole document).
  int64_t max_line_bytes = int64_t{64} << 20;
  // Longest document, in bytes of text.
  int64_t max_doc_bytes = int64_t{64} << 20;
};

struct DocumentSource {
  const std::string* file;
  int64_t first_line;  // 1-based line where the document starts
};

using DocumentSink =
    std::function<absl::Status(absl::string_view text, const DocumentSource& where)>;

// Pre-tokenized documents: the ids of a JSONL line's `field`.
using TokenIdsSink =
    std::function<absl::Status(absl::Span<const uint32_t> ids, const DocumentSource& where)>;

// Reads one file and calls `sink` for each non-empty document (surrounding
// blank lines trimmed). Stops at the first error, from the file or the sink.
// InvalidArgument for bad input (undecodable UTF-8, bad JSON, a missing or
// non-string field, a line longer than max_line_bytes or a document longer
// than max_doc_bytes, a file that is not a regular file), NotFound for a
// missing file. Never throws.
absl::Status ReadCorpusFile(const std::string& path, const CorpusOptions& options,
                            const DocumentSink& sink);

// ReadCorpusFile over bytes in memory; `name` stands for the file in errors.
absl::Status ReadCorpusBytes(absl::string_view bytes, const std::string& name,
                             const CorpusOptions& options, const DocumentSink& sink);

// Reads a JSONL file of pre-tokenized documents (options.format kJsonl):
// each line's `field` is an array of integer ids, each in [0, vocab_size);
// an empty array is skipped. InvalidArgument naming the file, the line and
// (for a bad id) its position in the array and the fix: a field missing or
// not an array of integers, an id out of range, or what ReadCorpusFile
// refuses in a line.
absl::Status ReadTokenIdsFile(const std::string& path, const CorpusOptions& options,
                              int64_t vocab_size, const TokenIdsSink& sink);

// ReadTokenIdsFile over bytes in memory.
absl::Status ReadTokenIdsBytes(absl::string_view bytes, const std::string& name,
                               const CorpusOptions& options, int64_t vocab_size,
                               const TokenIdsSink& sink);

// The offset of the first byte that is not part of valid UTF-8, or npos.
size_t FindInvalidUtf8(absl::string_view s);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_CORPUS_H_
