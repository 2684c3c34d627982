#include "worker/data/dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace tally::data {
namespace {

constexpr char kMagic[8] = {'T', 'A', 'L', 'L', 'Y', 'I', 'D', 'X'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 8 + 4 + 4 + 8;

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

absl::Status WriteAll(FILE* f, const void* data, size_t n, const std::string& path) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) return Errno("writing " + path);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<void*, size_t>> MapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(path, ": no such file (write the dataset with tally-prep)"));
    }
    return Errno("opening " + path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Errno("stat " + path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      ::close(fd);
      return Errno("mmap " + path);
    }
  }
  ::close(fd);
  return std::make_pair(map, size);
}

}  // namespace

std::string ValidationPrefixFor(const std::string& train_prefix) {
  const size_t slash = train_prefix.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "" : train_prefix.substr(0, slash + 1);
  return dir + "val";
}

absl::StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(
    std::string prefix) {
  std::unique_ptr<DatasetWriter> w(new DatasetWriter(std::move(prefix)));
  w->bin_ = std::fopen((w->prefix_ + ".bin.tmp").c_str(), "wb");
  if (!w->bin_) return Errno("creating " + w->prefix_ + ".bin.tmp");
  w->idx_ = std::fopen((w->prefix_ + ".idx.tmp").c_str(), "wb");
  if (!w->idx_) return Errno("creating " + w->prefix_ + ".idx.tmp");
  // The header is rewritten with the document count by Finish().
  char header[kHeaderSize] = {};
  uint64_t zero = 0;
  if (auto s = WriteAll(w->idx_, header, kHeaderSize, w->prefix_); !s.ok()) return s;
  if (auto s = WriteAll(w->idx_, &zero, sizeof(zero), w->prefix_); !s.ok()) return s;
  return w;
}

DatasetWriter::~DatasetWriter() {
  if (bin_) std::fclose(bin_);
  if (idx_) std::fclose(idx_);
}

absl::Status DatasetWriter::Add(absl::Span<const uint16_t> tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("empty document");
  if (auto s = WriteAll(bin_, tokens.data(), tokens.size() * 2, prefix_ + ".bin");
      !s.ok()) {
    return s;
  }
  num_tokens_ += static_cast<int64_t>(tokens.size());
  const uint64_t offset = static_cast<uint64_t>(num_tokens_);
  if (auto s = WriteAll(idx_, &offset, sizeof(offset), prefix_ + ".idx"); !s.ok()) {
    return s;
  }
  ++num_docs_;
  const int64_t len = static_cast<int64_t>(tokens.size());
  max_len_ = std::max(max_len_, len);
  int bucket = 0;
  while ((int64_t{2} << bucket) <= len) ++bucket;
  ++length_log2_histogram_[bucket];
  return absl::OkStatus();
}

absl::Status DatasetWriter::Finish(const std::string& extra_json) {
  char header[kHeaderSize];
  std::memcpy(header, kMagic, 8);
  const uint32_t token_bytes = 2;
  const uint64_t num_docs = static_cast<uint64_t>(num_docs_);
  std::memcpy(header + 8, &kVersion, 4);
  std::memcpy(header + 12, &token_bytes, 4);
  std::memcpy(header + 16, &num_docs, 8);
  if (std::fseek(idx_, 0, SEEK_SET) != 0) return Errno("seek " + prefix_ + ".idx");
  if (auto s = WriteAll(idx_, header, kHeaderSize, prefix_ + ".idx"); !s.ok()) return s;
  for (FILE** f : {&bin_, &idx_}) {
    if (std::fflush(*f) != 0 || ::fsync(fileno(*f)) != 0 || std::fclose(*f) != 0) {
      *f = nullptr;
      return Errno("closing " + prefix_);
    }
    *f = nullptr;
  }
  std::string hist = "{";
  for (const auto& [bucket, n] : length_log2_histogram_) {
    absl::StrAppend(&hist, hist.size() > 1 ? ", " : "", "\"", int64_t{1} << bucket,
                    "\": ", n);
  }
  hist += "}";
  std::string json = absl::StrCat(
      "{\n  \"format\": \"tally-indexed-dataset\",\n  \"version\": 1,\n",
      "  \"tokenizer\": \"byte\",\n  \"vocab_size\": 258,\n  \"bos\": 256,\n",
      "  \"eos\": 257,\n  \"num_docs\": ", num_docs_, ",\n  \"num_tokens\": ",
      num_tokens_, ",\n  \"max_doc_tokens\": ", max_len_,
      ",\n  \"doc_tokens_histogram_log2\": ", hist);
  if (!extra_json.empty()) absl::StrAppend(&json, ",\n  \"extra\": ", extra_json);
  json += "\n}\n";
  FILE* meta = std::fopen((prefix_ + ".json.tmp").c_str(), "wb");
  if (!meta) return Errno("creating " + prefix_ + ".json.tmp");
  const bool ok = std::fwrite(json.data(), 1, json.size(), meta) == json.size();
  if (std::fclose(meta) != 0 || !ok) return Errno("writing " + prefix_ + ".json");
  for (const char* ext : {".bin", ".idx", ".json"}) {
    const std::string to = prefix_ + ext;
    if (std::rename((to + ".tmp").c_str(), to.c_str()) != 0) {
      return Errno("renaming " + to);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const std::string& prefix) {
  std::unique_ptr<Dataset> d(new Dataset());
  d->prefix_ = prefix;
  auto idx = MapFile(prefix + ".idx");
  if (!idx.ok()) return idx.status();
  d->idx_map_ = idx->first;
  d->idx_size_ = idx->second;
  auto bin = MapFile(prefix + ".bin");
  if (!bin.ok()) return bin.status();
  d->bin_map_ = bin->first;
  d->bin_size_ = bin->second;

  const auto* h = static_cast<const char*>(d->idx_map_);
  if (d->idx_size_ < kHeaderSize || std::memcmp(h, kMagic, 8) != 0) {
    return absl::DataLossError(
        absl::StrCat(prefix, ".idx: not a tally dataset index (bad magic)"));
  }
  uint32_t version, token_bytes;
  uint64_t num_docs;
  std::memcpy(&version, h + 8, 4);
  std::memcpy(&token_bytes, h + 12, 4);
  std::memcpy(&num_docs, h + 16, 8);
  if (version != kVersion || token_bytes != 2) {
    return absl::DataLossError(absl::StrCat(prefix, ".idx: version ", version,
                                            " with ", token_bytes,
                                            "-byte tokens is not supported"));
  }
  if (d->idx_size_ != kHeaderSize + 8 * (num_docs + 1)) {
    return absl::DataLossError(absl::StrCat(prefix, ".idx: size ", d->idx_size_,
                                            " does not match ", num_docs,
                                            " documents (truncated?)"));
  }
  d->offsets_ = reinterpret_cast<const uint64_t*>(h + kHeaderSize);
  d->num_docs_ = static_cast<int64_t>(num_docs);
  d->tokens_ = static_cast<const uint16_t*>(d->bin_map_);
  if (d->offsets_[0] != 0 || d->offsets_[num_docs] * 2 != d->bin_size_) {
    return absl::DataLossError(absl::StrCat(
        prefix, ".bin: ", d->bin_size_, " bytes, but the index describes ",
        d->offsets_[num_docs], " tokens"));
  }
  for (uint64_t i = 0; i < num_docs; ++i) {
    if (d->offsets_[i + 1] <= d->offsets_[i]) {
      return absl::DataLossError(
          absl::StrCat(prefix, ".idx: document ", i, " is empty or out of order"));
    }
  }
  return d;
}

Dataset::~Dataset() {
  if (bin_map_) ::munmap(bin_map_, bin_size_);
  if (idx_map_) ::munmap(idx_map_, idx_size_);
}

std::vector<int64_t> Dataset::DocLengths() const {
  std::vector<int64_t> lengths(num_docs_);
  for (int64_t i = 0; i < num_docs_; ++i) lengths[i] = doc_length(i);
  return lengths;
}

}  // namespace tally::data
