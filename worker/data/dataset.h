// An indexed token dataset: PREFIX.bin holds every document's tokens back to
// back (uint16, little-endian); PREFIX.idx holds a header and the token offset
// of each document (num_docs + 1 uint64 values); PREFIX.json holds metadata
// (tokenizer, counts, a length histogram, sources). tally-prep writes it with
// DatasetWriter; the trainer reads it memory-mapped with Dataset.
//
// .idx layout: "TALLYIDX" (8 bytes), uint32 version (1), uint32 bytes per
// token (2), uint64 num_docs, uint64 offsets[num_docs + 1].
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
#include "absl/types/span.h"

namespace tally::data {

// Streams documents to disk: memory use does not grow with the corpus (only
// the length histogram is kept). Files are written as PREFIX.*.tmp and
// renamed by Finish(), so a reader never sees a half-written dataset. Not
// thread-safe.
class DatasetWriter {
 public:
  static absl::StatusOr<std::unique_ptr<DatasetWriter>> Create(std::string prefix);
  ~DatasetWriter();

  absl::Status Add(absl::Span<const uint16_t> tokens);
  // `extra_json` is a JSON object whose members are added to the metadata.
  absl::Status Finish(const std::string& extra_json);

  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  explicit DatasetWriter(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string prefix_;
  FILE* bin_ = nullptr;
  FILE* idx_ = nullptr;
  int64_t num_docs_ = 0;
  int64_t num_tokens_ = 0;
  int64_t max_len_ = 0;
  std::map<int, int64_t> length_log2_histogram_;  // floor(log2(len)) -> docs
};

// A read-only, memory-mapped dataset. Thread-safe after Open().
class Dataset {
 public:
  // NotFound when the files are missing; DataLoss when they are inconsistent.
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const std::string& prefix);
  ~Dataset();
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  int64_t num_docs() const { return num_docs_; }
  int64_t num_tokens() const { return offsets_[num_docs_]; }
  int64_t doc_length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }
  const uint16_t* doc(int64_t i) const { return tokens_ + offsets_[i]; }
  std::vector<int64_t> DocLengths() const;
  const std::string& prefix() const { return prefix_; }

 private:
  Dataset() = default;
  std::string prefix_;
  void* bin_map_ = nullptr;
  size_t bin_size_ = 0;
  void* idx_map_ = nullptr;
  size_t idx_size_ = 0;
  const uint16_t* tokens_ = nullptr;
  const uint64_t* offsets_ = nullptr;
  int64_t num_docs_ = 0;
};

// The held-out split that tally-prep writes beside a train prefix:
// "dir/train" -> "dir/val".
std::string ValidationPrefixFor(const std::string& train_prefix);

}  // namespace tally::data

#endif  // TALLY_WORKER_DATA_DATASET_H_
