// An indexed token dataset: PREFIX.bin holds every document's tokens back to
// back (little-endian, 2 or 4 bytes each); PREFIX.idx holds a header and the
// token offset of each document (num_docs + 1 uint64 values); PREFIX.json
// holds metadata (tokenizer, vocabulary, counts, a length histogram, the
// SHA-256 of .bin and .idx, sources). tally-prep writes it with
// DatasetWriter; the trainer reads it memory-mapped with Dataset.
//
// Files go through file::FileSystem (common/file/file_system.h): the writer's
// three files are AtomicFiles, the .json is read with FileSize and
// ReadAtMost. Only the .bin and .idx maps are made outside it: a zero-copy
// mmap is not a file format's read, and the seam has no maps to offer.
//
// .idx layout: "TALLYIDX" (8 bytes), uint32 version (1 or 2), uint32 bytes
// per token (2; version 2 also 4), uint64 num_docs, uint64 offsets[num_docs +
// 1].
//
// Format version 2 (what tally-prep writes) records the tokenizer and grows
// the token width to 4 bytes when the vocabulary does not fit in 2; version 1
// (byte tokenizer, 2-byte tokens) still opens. .json members read back by
// Dataset::Open (others are informational):
//   "format": "tally-indexed-dataset", "version": 1 or 2,
//   "tokenizer": "byte" | "sentencepiece" | "pretokenized" (v1: "byte"),
//   "tokenizer_model": {"path", "sha256"} (sentencepiece: the model file),
//   "vocab_size", "bos", "eos" (-1: none; v2 only),
//   "token_bytes": 2 or 4 (absent in older datasets: 2),
//   "text_bytes", "text_tokens": bytes of text and tokens other than BOS/EOS
//   (v2; absent or 0 when there was no text, as with pre-tokenized input),
//   "num_docs", "num_tokens", "max_doc_tokens",
//   "content_sha256": {"bin": HEX, "idx": HEX, "check": HEX} (absent in older
//   datasets; bin and idx are the digests `sha256sum PREFIX.bin PREFIX.idx`
//   prints, check the SHA-256 of "BIN IDX", those two and a space, so that a
//   damaged record is told apart from a changed file; older records lack
//   check).
#ifndef TALLY_WORKER_DATA_DATASET_H_
#define TALLY_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/file/file_system.h"

namespace tally::data {

// Largest PREFIX.json that Dataset::Open reads (tally-prep writes a few KiB).
inline constexpr int64_t kMaxMetadataBytes = 8 << 20;

// What PREFIX.json says about its dataset, validated on its own (not yet
// against the files).
// What a dataset was tokenized with: recorded in PREFIX.json and carried
// into checkpoints, so that a resume or an export with another tokenizer is
// refused.
struct TokenizerRecord {
  std::string kind = "byte";  // "byte", "sentencepiece" or "pretokenized"
  int64_t vocab_size = 258;
  int64_t bos = 256, eos = 257;  // -1: none
  std::string model_path;        // sentencepiece: the model file tally-prep read
  std::string model_sha256;      // and its SHA-256
};

// Tokens wider than 2 bytes once the vocabulary has more than this many ids.
inline constexpr int64_t kMaxTwoByteVocab = 65536;
// The largest vocabulary a dataset may have.
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;

struct DatasetMetadata {
  std::string tokenizer;  // "byte", "sentencepiece" or "pretokenized"
  int64_t vocab_size = 0;
  int64_t bos = -1;  // -1: none
  int64_t eos = -1;
  std::string tokenizer_model_path;    // sentencepiece
  std::string tokenizer_model_sha256;  // sentencepiece
  int64_t version = 0;
  int64_t token_bytes = 0;
  // Bytes of text and the tokens other than BOS/EOS they became (0 when
  // unknown): bits per byte = bits per such token * text_tokens / text_bytes.
  int64_t text_bytes = 0;
  int64_t text_tokens = 0;
  int64_t num_docs = 0;
  int64_t num_tokens = 0;
  int64_t max_doc_tokens = 0;
  // Lower-case hex SHA-256 of PREFIX.bin and PREFIX.idx; empty for datasets
  // prepared before tally-prep recorded them.
  std::string bin_sha256;
  std::string idx_sha256;
  // The SHA-256 of "BIN IDX" (the two above); empty in older records.
  std::string content_check;
};

// The digest "content_sha256"."check" records for these two digests.
std::string ContentCheck(const std::string& bin_sha256, const std::string& idx_sha256);

// Parses and validates the text of a PREFIX.json; `path` only names it in
// errors. Never throws, and memory stays proportional to the input (nesting
// deeper than a few levels is refused, not built). DataLoss for text that is
// not a tally dataset's metadata (bad JSON, wrong format or version, a missing
// or mistyped field, inconsistent counts), InvalidArgument for a well-formed
// file this build cannot read (an unknown tokenizer, wider tokens).
absl::StatusOr<DatasetMetadata> ParseDatasetMetadata(absl::string_view json,
                                                     const std::string& path);

class Sha256Hasher;   // defined in dataset.cc
class BlockAppender;  // defined in dataset.cc

// Streams documents to disk: memory use does not grow with the corpus (only
// the length histogram and a block of each file not yet appended are kept).
// The three files are AtomicFiles of `fs`, written as PREFIX.*.tmp and
// committed by Finish() in the order .bin, .idx, .json, so that a reader
// that sees the .json sees complete data. The .idx header, whose document
// count is known only at the end, is written as zeros and overwritten by
// Finish() (AtomicFile::WriteAt), which then reads the .idx back to hash it
// (AtomicFile::ReadAt); the SHA-256 of .bin is computed as it is written.
// A failed write ends the writer: Add and Finish then fail
// (FailedPrecondition), and it leaves no PREFIX.*.tmp and no new file in
// place (but a .json commit that fails after the .bin and .idx commits
// leaves those two beside the old .json, whose counts Dataset::Open checks
// against them). Not thread-safe.
class DatasetWriter {
 public:
  // `tokenizer` decides the token width (2 bytes while vocab_size fits) and
  // is recorded in the .json. `fs` must outlive the writer.
  static absl::StatusOr<std::unique_ptr<DatasetWriter>> Create(
      std::string prefix, TokenizerRecord tokenizer = TokenizerRecord(),
      file::FileSystem* fs = file::Posix());
  ~DatasetWriter();

  // A document of the byte tokenizer (its text bytes are its non-special
  // tokens).
  absl::Status Add(absl::Span<const uint16_t> tokens);
  // A document of any tokenizer: ids below vocab_size, `text_bytes` the
  // length of the text it came from (0: none, as for pre-tokenized input).
  absl::Status Add(absl::Span<const uint32_t> tokens, int64_t text_bytes);
  // `extra_json` is a JSON object whose members are recorded under "extra".
  absl::Status Finish(const std::string& extra_json);

  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  DatasetWriter(std::string prefix, TokenizerRecord tokenizer, file::FileSystem* fs);
  // Ends the writer after a failed write: its files are removed.
  absl::Status Abandon(absl::Status failure);
  std::string prefix_;
  TokenizerRecord tokenizer_;
  file::FileSystem* fs_;
  int token_bytes_ = 2;
  int64_t text_bytes_ = 0;
  int64_t text_tokens_ = 0;
  std::vector<uint16_t> narrow_;  // scratch for 2-byte tokens
  // Null after Finish or a failed write (failed_).
  std::unique_ptr<BlockAppender> bin_, idx_;
  bool failed_ = false;
  std::unique_ptr<Sha256Hasher> bin_sha_;
  int64_t num_docs_ = 0;
  int64_t num_tokens_ = 0;
  int64_t max_len_ = 0;
  std::map<int, int64_t> length_log2_histogram_;  // floor(log2(len)) -> docs
};

// A read-only, memory-mapped dataset. Thread-safe after Open(). The files
// must not be truncated while it is open (reading a mapping past the end of
// its file faults); tally-prep replaces datasets by rename, which is safe.
class Dataset {
 public:
  // Opens PREFIX.{json,idx,bin} and checks, without hashing the content:
  //  - PREFIX.json parses and validates (ParseDatasetMetadata);
  //  - the vocabulary fits the model: vocab_size <= `model_vocab_size`
  //    (0: no model to fit, e.g. tally-prep verify);
  //  - .idx: magic, version, token width and document count agree with the
  //    .json; its size is exactly header + 8 * (num_docs + 1); the first
  //    offset is 0, offsets strictly increase (no empty document), the last
  //    is num_tokens; the longest document is max_doc_tokens;
  //  - .bin is exactly num_tokens * token_bytes long;
  //  - every token id is below vocab_size (a vectorised max over the mapped
  //    tokens; see MaxTokenId).
  // Regular files only: a FIFO or device is refused, never read. Errors name
  // the file: NotFound when a file is missing; DataLoss when the files are
  // damaged or disagree; InvalidArgument when the dataset does not fit the
  // model or this build; Internal for I/O failures. PREFIX.json is read
  // through `fs`; .idx and .bin are mapped directly (see the top of this
  // file).
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const std::string& prefix,
                                                       int64_t model_vocab_size = 0,
                                                       file::FileSystem* fs = file::Posix());
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  // Recomputes the SHA-256 of PREFIX.bin and PREFIX.idx and compares them
  // with those recorded in PREFIX.json. DataLoss naming the file that is
  // wrong: PREFIX.json when its record fails its own check (a damaged or
  // edited digest; the message says which digest and what the files hash
  // to), else the .bin or .idx whose content changed (for a record without
  // a check, the message says the record may be the one that changed);
  // FailedPrecondition when the .json records none (a dataset prepared
  // before tally-prep recorded them). Reads every byte: seconds per
  // gigabyte, so training does not call it; tally-prep verify does.
  absl::Status VerifyContentHash() const;

  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return offsets_[num_docs_]; }
  int64_t doc_length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }
  // Token `j` of document `i`.
  uint32_t token(int64_t i, int64_t j) const {
    const uint64_t at = offsets_[i] + static_cast<uint64_t>(j);
    return tokens32_ != nullptr ? tokens32_[at] : tokens16_[at];
  }
  // Whether `t` is this dataset's BOS or EOS (not text).
  bool IsSpecial(uint32_t t) const {
    return static_cast<int64_t>(t) == meta_.bos || static_cast<int64_t>(t) == meta_.eos;
  }
  // Bytes of text per token that is not BOS/EOS (1 for the byte tokenizer);
  // 0 when the dataset does not know (pre-tokenized input).
  double bytes_per_text_token() const;
  // The mapped .bin: num_tokens() tokens of metadata().token_bytes each.
  const void* token_data() const { return bin_map_; }
  std::vector<int64_t> DocLengths() const;
  const std::string& prefix() const { return prefix_; }
  const DatasetMetadata& metadata() const { return meta_; }
  int64_t bin_bytes() const { return static_cast<int64_t>(bin_size_); }
  int64_t idx_bytes() const { return static_cast<int64_t>(idx_size_); }

 private:
  Dataset() = default;
  absl::Status CheckIndex();
  absl::Status CheckTokenRange() const;
  std::string prefix_;
  DatasetMetadata meta_;
  void* bin_map_ = nullptr;
  size_t bin_size_ = 0;
  void* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  const uint16_t* tokens16_ = nullptr;  // 2-byte tokens
  const uint32_t* tokens32_ = nullptr;  // 4-byte tokens
  const uint64_t* offsets_ = nullptr;
  int64_t num_docs_ = 0;
};

// The largest of `n` token ids (0 when n is 0). A branch-free max-reduction
// over fixed-size blocks, which the compiler turns into SIMD max instructions;
// this is the range check Dataset::Open runs over the whole .bin.
uint16_t MaxTokenId(const uint16_t* tokens, size_t n);
uint32_t MaxTokenId(const uint32_t* tokens, size_t n);

// Lower-case hex SHA-256 of `n` bytes.
std::string Sha256Hex(const void* data, size_t n);

// The held-out split that tally-prep writes beside a train prefix:
// "dir/train" -> "dir/val".
std::string ValidationPrefixFor(const std::string& train_prefix);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_DATASET_H_
