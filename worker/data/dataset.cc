#include "worker/data/dataset.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/data/json_limits.h"
#include "worker/data/tokenizer.h"

namespace tally::data {
namespace {

constexpr char kMagic[8] = {'T', 'A', 'L', 'L', 'Y', 'I', 'D', 'X'};
constexpr uint32_t kVersion = 2;  // written; 1 is read too
constexpr size_t kHeaderSize = 8 + 4 + 4 + 8;
constexpr char kFormat[] = "tally-indexed-dataset";
constexpr int kMaxMetadataDepth = 8;
constexpr char kRerun[] = "re-run tally-prep to rebuild the dataset";

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// Opens a regular file for mapping. O_NONBLOCK so that a FIFO named like a
// dataset file cannot block the open; it is then refused as not regular.
absl::StatusOr<int> OpenRegular(const std::string& path, struct stat* st) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(
          absl::StrCat(path, ": no such file (write the dataset with tally-prep)"));
    }
    return Errno("opening " + path);
  }
  if (::fstat(fd, st) != 0) {
    absl::Status s = Errno("stat " + path);
    ::close(fd);
    return s;
  }
  if (!S_ISREG(st->st_mode)) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
  }
  return fd;
}

absl::StatusOr<std::pair<void*, size_t>> MapFile(const std::string& path) {
  struct stat st;
  absl::StatusOr<int> fd = OpenRegular(path, &st);
  if (!fd.ok()) return fd.status();
  const size_t size = static_cast<size_t>(st.st_size);
  void* map = nullptr;
  if (size > 0) {
    map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, *fd, 0);
    if (map == MAP_FAILED) {
      absl::Status s = Errno("mmap " + path);
      ::close(*fd);
      return s;
    }
  }
  ::close(*fd);
  return std::make_pair(map, size);
}

std::string Hex(const unsigned char* digest, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[digest[i] >> 4];
    out[2 * i + 1] = kDigits[digest[i] & 15];
  }
  return out;
}

bool IsSha256Hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace

// Incremental SHA-256 (OpenSSL's, which uses the CPU's SHA instructions).
class Sha256Hasher {
 public:
  Sha256Hasher() : ctx_(EVP_MD_CTX_new()) { EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr); }
  ~Sha256Hasher() { EVP_MD_CTX_free(ctx_); }
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;
  void Update(const void* data, size_t n) { EVP_DigestUpdate(ctx_, data, n); }
  std::string HexDigest() {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx_, digest, &n);
    return Hex(digest, n);
  }

 private:
  EVP_MD_CTX* ctx_;
};

std::string Sha256Hex(const void* data, size_t n) {
  Sha256Hasher sha;
  sha.Update(data, n);
  return sha.HexDigest();
}

std::string ContentCheck(const std::string& bin_sha256, const std::string& idx_sha256) {
  const std::string record = absl::StrCat(bin_sha256, " ", idx_sha256);
  return Sha256Hex(record.data(), record.size());
}

namespace {
template <typename T>
T MaxOf(const T* tokens, size_t n) {
  // The inner loop has a constant trip count and no branch, so GCC and Clang
  // vectorise it at -O2 (pmaxuw/pmaxud / umax) without a scalar epilogue.
  constexpr size_t kBlock = 4096;
  T max_id = 0;
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const T* block = tokens + i;
    T m = 0;
    for (size_t j = 0; j < kBlock; ++j) m = block[j] > m ? block[j] : m;
    max_id = std::max(max_id, m);
  }
  for (; i < n; ++i) max_id = std::max(max_id, tokens[i]);
  return max_id;
}
}  // namespace

uint16_t MaxTokenId(const uint16_t* tokens, size_t n) { return MaxOf(tokens, n); }
uint32_t MaxTokenId(const uint32_t* tokens, size_t n) { return MaxOf(tokens, n); }

std::string ValidationPrefixFor(const std::string& train_prefix) {
  const size_t slash = train_prefix.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "" : train_prefix.substr(0, slash + 1);
  return dir + "val";
}

namespace {

absl::Status Damaged(const std::string& path, const std::string& what) {
  return absl::DataLossError(absl::StrCat(path, ": ", what, "; ", kRerun));
}

absl::Status MetadataTooLarge(const std::string& path, uint64_t bytes) {
  return Damaged(path, absl::StrCat(bytes, " bytes, more than the ", kMaxMetadataBytes,
                                    " a dataset's metadata may have"));
}

// PREFIX.json through the seam, its size and type asked first so that a
// huge file or a FIFO is refused unread. A file that grows past the limit
// after being sized is read one byte past it, and ParseDatasetMetadata
// refuses it.
absl::StatusOr<std::string> ReadMetadata(file::FileSystem* fs, const std::string& path) {
  absl::StatusOr<uint64_t> size = fs->FileSize(path);
  if (size.ok() && *size > static_cast<uint64_t>(kMaxMetadataBytes)) {
    return MetadataTooLarge(path, *size);
  }
  absl::StatusOr<std::string> text =
      size.ok() ? fs->ReadAtMost(path, kMaxMetadataBytes) : size.status();
  switch (text.status().code()) {
    case absl::StatusCode::kNotFound:
      return absl::NotFoundError(
          absl::StrCat(path, ": no such file (write the dataset with tally-prep)"));
    case absl::StatusCode::kFailedPrecondition:
      return absl::DataLossError(absl::StrCat(path, ": not a regular file"));
    default:
      return text;
  }
}

// The fields' agreement with one another and with what this build reads
// (the tokenizer, its vocabulary and ids, the token width, the counts), and
// a SentencePiece tokenizer's model file.
absl::Status CheckMetadataFields(const nlohmann::json& j, const std::string& path,
                                 DatasetMetadata& m) {
  auto damaged = [&](const std::string& what) { return Damaged(path, what); };
  const int64_t version = m.version;
  const bool byte = m.tokenizer == ByteTokenizer::kName;
  if (!byte &&
      (version == 1 || (m.tokenizer != "sentencepiece" && m.tokenizer != "pretokenized"))) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tokenizer \"", m.tokenizer.substr(0, 64),
                     "\" is not supported (this build reads byte, sentencepiece and pretokenized); "
                     "prepare the data with tally-prep"));
  }
  if (byte && (m.vocab_size != ByteTokenizer::kVocabSize || m.bos != ByteTokenizer::kBos ||
               m.eos != ByteTokenizer::kEos)) {
    return damaged(absl::StrCat("\"vocab_size\" ", m.vocab_size, ", \"bos\" ", m.bos,
                                ", \"eos\" ", m.eos, " do not match the ", ByteTokenizer::kName,
                                " tokenizer's ", ByteTokenizer::kVocabSize, ", ",
                                ByteTokenizer::kBos, ", ", ByteTokenizer::kEos));
  }
  if (m.vocab_size < 1 || m.vocab_size > kMaxVocab) {
    return damaged(
        absl::StrCat("\"vocab_size\" ", m.vocab_size, " is not between 1 and ", kMaxVocab));
  }
  if (m.token_bytes != 2 && !(version >= 2 && m.token_bytes == 4)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": \"token_bytes\" ", m.token_bytes,
                                                   " is not supported (this build reads 2",
                                                   version >= 2 ? " and 4" : " in version 1", ")"));
  }
  if (m.token_bytes == 2 && m.vocab_size > kMaxTwoByteVocab) {
    return damaged(
        absl::StrCat("\"vocab_size\" ", m.vocab_size, " does not fit \"token_bytes\" 2"));
  }
  if (m.tokenizer == "sentencepiece") {
    auto it = j.find("tokenizer_model");
    if (it == j.end() || !it->is_object() || !it->contains("path") || !(*it)["path"].is_string() ||
        !it->contains("sha256") || !(*it)["sha256"].is_string() ||
        !IsSha256Hex((*it)["sha256"].get<std::string>())) {
      return damaged("\"tokenizer_model\" must name the SentencePiece model's path and sha256");
    }
    m.tokenizer_model_path = (*it)["path"].get<std::string>();
    m.tokenizer_model_sha256 = (*it)["sha256"].get<std::string>();
  }
  if (m.num_docs < 1) return damaged("\"num_docs\" is 0: the dataset has no documents");
  if (m.num_tokens < m.num_docs) {
    return damaged(absl::StrCat("\"num_tokens\" ", m.num_tokens, " is less than \"num_docs\" ",
                                m.num_docs, " (every document has a token)"));
  }
  if (m.max_doc_tokens < 1 || m.max_doc_tokens > m.num_tokens) {
    return damaged(absl::StrCat("\"max_doc_tokens\" ", m.max_doc_tokens,
                                " is not between 1 and \"num_tokens\" ", m.num_tokens));
  }
  return absl::OkStatus();
}

// The optional "content_sha256": the .bin and .idx files' hashes, and the
// hash of the sampled check.
absl::Status ReadContentHashes(const nlohmann::json& j, const std::string& path,
                               DatasetMetadata& m) {
  auto damaged = [&](const std::string& what) { return Damaged(path, what); };
  if (auto it = j.find("content_sha256"); it != j.end()) {
    if (!it->is_object()) return damaged("\"content_sha256\" is not an object");
    for (auto [key, out] : {std::pair{"bin", &m.bin_sha256}, std::pair{"idx", &m.idx_sha256}}) {
      auto h = it->find(key);
      if (h == it->end() || !h->is_string() || !IsSha256Hex(h->get<std::string>())) {
        return damaged(absl::StrCat("\"content_sha256\".\"", key,
                                    "\" is missing or not 64 lower-case hex digits"));
      }
      *out = h->get<std::string>();
    }
    if (auto h = it->find("check"); h != it->end()) {
      if (!h->is_string() || !IsSha256Hex(h->get<std::string>())) {
        return damaged("\"content_sha256\".\"check\" is not 64 lower-case hex digits");
      }
      m.content_check = h->get<std::string>();
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DatasetMetadata> ParseDatasetMetadata(absl::string_view json,
                                                     const std::string& path) {
  auto damaged = [&](const std::string& what) { return Damaged(path, what); };
  if (json.size() > static_cast<size_t>(kMaxMetadataBytes)) {
    return MetadataTooLarge(path, json.size());
  }
  if (JsonNestsDeeperThan(json, kMaxMetadataDepth)) {
    return damaged(absl::StrCat("JSON nested deeper than ", kMaxMetadataDepth,
                                " levels is not a dataset's metadata"));
  }
  const nlohmann::json j =
      nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return damaged("not valid JSON");
  if (!j.is_object()) return damaged(absl::StrCat("expected a JSON object, got ", j.type_name()));

  auto string_field = [&](const char* key, std::string* out) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string()) {
      return damaged(absl::StrCat("\"", key, "\" is missing or not a string"));
    }
    *out = it->get<std::string>();
    return absl::OkStatus();
  };
  // `fallback` < 0: required.
  auto int_field = [&](const char* key, int64_t* out, int64_t fallback = -1) -> absl::Status {
    auto it = j.find(key);
    if (it == j.end() && fallback >= 0) {
      *out = fallback;
      return absl::OkStatus();
    }
    if (it == j.end() || !it->is_number_integer()) {
      return damaged(absl::StrCat("\"", key, "\" is missing or not an integer"));
    }
    if (it->is_number_unsigned()) {
      const uint64_t v = it->get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return damaged(absl::StrCat("\"", key, "\" is ", v, ", out of range"));
      }
      *out = static_cast<int64_t>(v);
    } else {
      *out = it->get<int64_t>();
    }
    if (*out < 0) return damaged(absl::StrCat("\"", key, "\" is negative (", *out, ")"));
    return absl::OkStatus();
  };

  std::string format;
  if (auto s = string_field("format", &format); !s.ok()) return s;
  if (format != kFormat) {
    return damaged(absl::StrCat("\"format\" is \"", format, "\", not \"", kFormat, "\""));
  }
  int64_t version = 0;
  if (auto s = int_field("version", &version); !s.ok()) return s;
  if (version != 1 && version != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"version\" ", version,
                     " is not supported (this build reads versions 1 and 2); use a newer tally"));
  }
  DatasetMetadata m;
  m.version = version;
  if (auto s = string_field("tokenizer", &m.tokenizer); !s.ok()) return s;
  for (auto [key, out] :
       {std::pair{"vocab_size", &m.vocab_size}, std::pair{"num_docs", &m.num_docs},
        std::pair{"num_tokens", &m.num_tokens}, std::pair{"max_doc_tokens", &m.max_doc_tokens}}) {
    if (auto s = int_field(key, out); !s.ok()) return s;
  }
  if (auto s = int_field("token_bytes", &m.token_bytes, /*fallback=*/2); !s.ok()) return s;
  // BOS and EOS: ids, or -1 for none (version 2).
  for (auto [key, out] : {std::pair{"bos", &m.bos}, std::pair{"eos", &m.eos}}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer()) {
      return damaged(absl::StrCat("\"", key, "\" is missing or not an integer"));
    }
    *out = it->is_number_unsigned() && it->get<uint64_t>() > uint64_t{1} << 40 ? int64_t{1} << 40
                                                                               : it->get<int64_t>();
    if (*out < -1 || (version == 1 && *out < 0) || *out >= m.vocab_size) {
      return damaged(absl::StrCat("\"", key, "\" is ", *out, ", not an id below \"vocab_size\" ",
                                  m.vocab_size, version == 1 ? "" : " or -1 (none)"));
    }
  }
  if (version >= 2) {
    for (auto [key, out] :
         {std::pair{"text_bytes", &m.text_bytes}, std::pair{"text_tokens", &m.text_tokens}}) {
      if (auto s = int_field(key, out, /*fallback=*/0); !s.ok()) return s;
    }
  }

  if (auto s = CheckMetadataFields(j, path, m); !s.ok()) return s;
  if (auto s = ReadContentHashes(j, path, m); !s.ok()) return s;
  return m;
}

// An AtomicFile appended a block at a time, as stdio would buffer it, so that
// a document costs no system call of its own; memory stays one block.
class BlockAppender {
 public:
  static constexpr size_t kBlockBytes = 1 << 20;

  explicit BlockAppender(std::unique_ptr<file::AtomicFile> file) : file_(std::move(file)) {}

  absl::Status Append(const void* data, size_t n) {
    const char* bytes = static_cast<const char*>(data);
    if (pending_.size() + n >= kBlockBytes) {
      if (auto s = Flush(); !s.ok()) return s;
      // A document of a block or more is not copied again.
      if (n >= kBlockBytes) return file_->Append(absl::string_view(bytes, n));
    }
    pending_.append(bytes, n);
    return absl::OkStatus();
  }

  // Appends what is pending; then the file holds everything.
  absl::Status Flush() {
    absl::Status s = file_->Append(pending_);
    pending_.clear();
    return s;
  }

  file::AtomicFile& file() { return *file_; }

 private:
  std::unique_ptr<file::AtomicFile> file_;
  std::string pending_;
};

namespace {

// The SHA-256 of everything written to `f`, read back a block at a time.
absl::StatusOr<std::string> HashWritten(file::AtomicFile& f) {
  Sha256Hasher sha;
  for (uint64_t at = 0;;) {
    absl::StatusOr<std::string> block = f.ReadAt(at, BlockAppender::kBlockBytes);
    if (!block.ok()) return block.status();
    if (block->empty()) return sha.HexDigest();
    sha.Update(block->data(), block->size());
    at += block->size();
  }
}

}  // namespace

DatasetWriter::DatasetWriter(std::string prefix, TokenizerRecord tokenizer, file::FileSystem* fs)
    : prefix_(std::move(prefix)),
      tokenizer_(std::move(tokenizer)),
      fs_(fs),
      token_bytes_(tokenizer_.vocab_size > kMaxTwoByteVocab ? 4 : 2),
      bin_sha_(std::make_unique<Sha256Hasher>()) {}

absl::StatusOr<std::unique_ptr<DatasetWriter>> DatasetWriter::Create(std::string prefix,
                                                                     TokenizerRecord tokenizer,
                                                                     file::FileSystem* fs) {
  if (tokenizer.vocab_size < 1 || tokenizer.vocab_size > kMaxVocab || tokenizer.bos < -1 ||
      tokenizer.bos >= tokenizer.vocab_size || tokenizer.eos < -1 ||
      tokenizer.eos >= tokenizer.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer: vocab_size ", tokenizer.vocab_size, " must be 1..", kMaxVocab,
                     " and bos/eos (", tokenizer.bos, ", ", tokenizer.eos, ") ids below it or -1"));
  }
  std::unique_ptr<DatasetWriter> w(new DatasetWriter(std::move(prefix), std::move(tokenizer), fs));
  for (auto [ext, out] : {std::pair{".bin", &w->bin_}, std::pair{".idx", &w->idx_}}) {
    auto f = fs->NewAtomicFile(w->prefix_ + ext);
    if (!f.ok()) return f.status();
    *out = std::make_unique<BlockAppender>(*std::move(f));
  }
  // The header is overwritten with the document count by Finish().
  char header[kHeaderSize] = {};
  uint64_t zero = 0;
  if (auto s = w->idx_->Append(header, kHeaderSize); !s.ok()) return s;
  if (auto s = w->idx_->Append(&zero, sizeof(zero)); !s.ok()) return s;
  return w;
}

DatasetWriter::~DatasetWriter() = default;

absl::Status DatasetWriter::Abandon(absl::Status failure) {
  failed_ = true;
  bin_.reset();
  idx_.reset();
  return failure;
}

absl::Status DatasetWriter::Add(absl::Span<const uint16_t> tokens) {
  std::vector<uint32_t> wide(tokens.begin(), tokens.end());
  int64_t text = 0;
  for (uint16_t t : tokens) text += ByteTokenizer::IsSpecial(t) ? 0 : 1;
  return Add(wide, text);
}

absl::Status DatasetWriter::Add(absl::Span<const uint32_t> tokens, int64_t text_bytes) {
  if (tokens.empty()) return absl::InvalidArgumentError("empty document");
  if (failed_) return absl::FailedPreconditionError(prefix_ + ": Add after a failed write");
  if (!bin_) return absl::FailedPreconditionError(prefix_ + ": Add after Finish");
  int64_t text_tokens = 0;
  for (uint32_t t : tokens) {
    if (static_cast<int64_t>(t) >= tokenizer_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", t, " is outside the ",
                                                     tokenizer_.vocab_size, "-token vocabulary"));
    }
    text_tokens +=
        static_cast<int64_t>(t) != tokenizer_.bos && static_cast<int64_t>(t) != tokenizer_.eos;
  }
  const void* bytes = tokens.data();
  if (token_bytes_ == 2) {
    narrow_.assign(tokens.begin(), tokens.end());
    bytes = narrow_.data();
  }
  const size_t n = tokens.size() * static_cast<size_t>(token_bytes_);
  if (auto s = bin_->Append(bytes, n); !s.ok()) return Abandon(s);
  bin_sha_->Update(bytes, n);
  text_bytes_ += text_bytes;
  text_tokens_ += text_tokens;
  num_tokens_ += static_cast<int64_t>(tokens.size());
  const uint64_t offset = static_cast<uint64_t>(num_tokens_);
  if (auto s = idx_->Append(&offset, sizeof(offset)); !s.ok()) return Abandon(s);
  ++num_docs_;
  const int64_t len = static_cast<int64_t>(tokens.size());
  max_len_ = std::max(max_len_, len);
  int bucket = 0;
  while ((int64_t{2} << bucket) <= len) ++bucket;
  ++length_log2_histogram_[bucket];
  return absl::OkStatus();
}

absl::Status DatasetWriter::Finish(const std::string& extra_json) {
  if (failed_) return absl::FailedPreconditionError(prefix_ + ": Finish after a failed write");
  if (!bin_) return absl::FailedPreconditionError(prefix_ + ": Finish called twice");
  nlohmann::ordered_json extra;
  if (!extra_json.empty()) {
    extra = nlohmann::ordered_json::parse(extra_json, nullptr, /*allow_exceptions=*/false);
    if (!extra.is_object()) {
      return absl::InvalidArgumentError("DatasetWriter::Finish: extra_json is not a JSON object");
    }
  }
  // From here a failure ends the writer: its files go with it, and a second
  // Finish is refused.
  std::unique_ptr<BlockAppender> bin = std::move(bin_), idx = std::move(idx_);
  char header[kHeaderSize];
  std::memcpy(header, kMagic, 8);
  const uint32_t token_bytes = static_cast<uint32_t>(token_bytes_);
  const uint64_t num_docs = static_cast<uint64_t>(num_docs_);
  std::memcpy(header + 8, &kVersion, 4);
  std::memcpy(header + 12, &token_bytes, 4);
  std::memcpy(header + 16, &num_docs, 8);
  for (BlockAppender* f : {bin.get(), idx.get()}) {
    if (auto s = f->Flush(); !s.ok()) return s;
  }
  if (auto s = idx->file().WriteAt(0, absl::string_view(header, kHeaderSize)); !s.ok()) {
    return s;
  }
  // The header went in last, so .idx is hashed from what was written.
  absl::StatusOr<std::string> idx_hex = HashWritten(idx->file());
  if (!idx_hex.ok()) return idx_hex.status();
  nlohmann::ordered_json hist = nlohmann::ordered_json::object();
  for (const auto& [bucket, n] : length_log2_histogram_) {
    hist[std::to_string(int64_t{1} << bucket)] = n;
  }
  const std::string bin_hex = bin_sha_->HexDigest();
  nlohmann::ordered_json meta = {
      {"format", kFormat},
      {"version", kVersion},
      {"tokenizer", tokenizer_.kind},
  };
  if (!tokenizer_.model_path.empty()) {
    meta["tokenizer_model"] = {{"path", tokenizer_.model_path},
                               {"sha256", tokenizer_.model_sha256}};
  }
  meta.update(nlohmann::ordered_json{
      {"vocab_size", tokenizer_.vocab_size},
      {"bos", tokenizer_.bos},
      {"eos", tokenizer_.eos},
      {"token_bytes", token_bytes},
      {"text_bytes", text_bytes_},
      {"text_tokens", text_tokens_},
      {"num_docs", num_docs_},
      {"num_tokens", num_tokens_},
      {"max_doc_tokens", max_len_},
      {"doc_tokens_histogram_log2", hist},
      {"content_sha256",
       {{"bin", bin_hex}, {"idx", *idx_hex}, {"check", ContentCheck(bin_hex, *idx_hex)}}},
  });
  if (!extra.is_null()) meta["extra"] = extra;
  const std::string json = meta.dump(2) + "\n";
  auto json_file = fs_->NewAtomicFile(prefix_ + ".json");
  if (!json_file.ok()) return json_file.status();
  if (auto s = (*json_file)->Append(json); !s.ok()) return s;
  // .json last: a reader that finds it finds the data it describes.
  for (file::AtomicFile* f : {&bin->file(), &idx->file(), json_file->get()}) {
    if (auto s = f->Commit(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const std::string& prefix,
                                                       int64_t model_vocab_size,
                                                       file::FileSystem* fs) {
  std::unique_ptr<Dataset> d(new Dataset());
  d->prefix_ = prefix;
  const std::string json_path = prefix + ".json";
  absl::StatusOr<std::string> json = ReadMetadata(fs, json_path);
  if (!json.ok()) return json.status();
  absl::StatusOr<DatasetMetadata> meta = ParseDatasetMetadata(*json, json_path);
  if (!meta.ok()) return meta.status();
  d->meta_ = *std::move(meta);
  if (model_vocab_size > 0 && d->meta_.vocab_size != model_vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, ": the dataset's vocabulary has ", d->meta_.vocab_size, " tokens (tokenizer ",
        d->meta_.tokenizer, "), the model's vocab_size of ", model_vocab_size,
        " differs: set model.vocab_size to ", d->meta_.vocab_size,
        " (or 0 to take it from the dataset), or tokenize the data with the model's tokenizer"));
  }
  auto idx = MapFile(prefix + ".idx");
  if (!idx.ok()) return idx.status();
  d->idx_map_ = idx->first;
  d->idx_size_ = idx->second;
  auto bin = MapFile(prefix + ".bin");
  if (!bin.ok()) return bin.status();
  d->bin_map_ = bin->first;
  d->bin_size_ = bin->second;
  if (auto s = d->CheckIndex(); !s.ok()) return s;
  if (auto s = d->CheckTokenRange(); !s.ok()) return s;
  return d;
}

absl::Status Dataset::CheckIndex() {
  const std::string idx_path = prefix_ + ".idx";
  auto damaged = [&](const std::string& path, const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what, "; ", kRerun));
  };
  const auto* h = static_cast<const char*>(idx_map_);
  if (idx_size_ < kHeaderSize || std::memcmp(h, kMagic, 8) != 0) {
    return damaged(idx_path, "not a tally dataset index (bad magic)");
  }
  uint32_t version, token_bytes;
  uint64_t num_docs;
  std::memcpy(&version, h + 8, 4);
  std::memcpy(&token_bytes, h + 12, 4);
  std::memcpy(&num_docs, h + 16, 8);
  if (version != 1 && version != 2) {
    return damaged(idx_path, absl::StrCat("index version ", version,
                                          " is not supported (this build reads 1 and 2)"));
  }
  if (token_bytes != static_cast<uint64_t>(meta_.token_bytes)) {
    return damaged(idx_path, absl::StrCat("header says ", token_bytes, "-byte tokens, ",
                                          prefix_, ".json says ", meta_.token_bytes));
  }
  if (num_docs != static_cast<uint64_t>(meta_.num_docs)) {
    return damaged(idx_path, absl::StrCat("header says ", num_docs, " documents, ", prefix_,
                                          ".json says ", meta_.num_docs));
  }
  // num_docs + 1 cannot overflow: the .json bounded it by int64's range.
  const size_t body = idx_size_ - kHeaderSize;
  if (body % 8 != 0 || body / 8 != num_docs + 1) {
    return damaged(idx_path, absl::StrCat(idx_size_, " bytes, but ", num_docs,
                                          " documents need ", kHeaderSize, " + 8 * ",
                                          num_docs + 1, " (truncated or padded?)"));
  }
  // Before the offsets are scanned: the .json bounds num_docs by num_tokens,
  // so the scan costs at most what the .bin holds.
  const uint64_t num_tokens = static_cast<uint64_t>(meta_.num_tokens);
  const uint64_t width = static_cast<uint64_t>(meta_.token_bytes);
  if (bin_size_ % width != 0 || bin_size_ / width != num_tokens) {
    return damaged(prefix_ + ".bin",
                   absl::StrCat(bin_size_, " bytes, but ", prefix_, ".json describes ", num_tokens,
                                " ", width, "-byte tokens"));
  }
  offsets_ = reinterpret_cast<const uint64_t*>(h + kHeaderSize);
  num_docs_ = static_cast<int64_t>(num_docs);
  if (width == 4) {
    tokens32_ = static_cast<const uint32_t*>(bin_map_);
  } else {
    tokens16_ = static_cast<const uint16_t*>(bin_map_);
  }
  if (offsets_[0] != 0) {
    return damaged(idx_path, absl::StrCat("the first offset is ", offsets_[0], ", not 0"));
  }
  // One branch-free pass; the first bad document is looked for only on failure.
  bool out_of_order = false;
  uint64_t longest = 0;
  for (uint64_t i = 0; i < num_docs; ++i) {
    const uint64_t a = offsets_[i], b = offsets_[i + 1];
    out_of_order |= b <= a;
    longest = std::max(longest, b - a);
  }
  if (out_of_order) {
    uint64_t i = 0;
    while (offsets_[i + 1] > offsets_[i]) ++i;
    return damaged(idx_path, absl::StrCat("document ", i, " is empty or out of order (offsets ",
                                          offsets_[i], " then ", offsets_[i + 1], ")"));
  }
  if (offsets_[num_docs] != num_tokens) {
    return damaged(idx_path, absl::StrCat("the offsets end at ", offsets_[num_docs],
                                          " tokens, ", prefix_, ".json says ", num_tokens));
  }
  if (longest != static_cast<uint64_t>(meta_.max_doc_tokens)) {
    return damaged(idx_path, absl::StrCat("the longest document has ", longest, " tokens, ",
                                          prefix_, ".json says ", meta_.max_doc_tokens));
  }
  return absl::OkStatus();
}

absl::Status Dataset::CheckTokenRange() const {
  const size_t n = static_cast<size_t>(meta_.num_tokens);
  if (n == 0) return absl::OkStatus();
  ::madvise(bin_map_, bin_size_, MADV_SEQUENTIAL);
  const int64_t max_id = tokens32_ != nullptr ? MaxTokenId(tokens32_, n) : MaxTokenId(tokens16_, n);
  ::madvise(bin_map_, bin_size_, MADV_NORMAL);
  if (max_id < meta_.vocab_size) return absl::OkStatus();
  uint64_t pos = 0;
  while (pos < n && (tokens32_ != nullptr ? tokens32_[pos] : tokens16_[pos]) < meta_.vocab_size) {
    ++pos;
  }
  const int64_t bad = tokens32_ != nullptr ? tokens32_[pos] : tokens16_[pos];
  const int64_t doc = std::upper_bound(offsets_, offsets_ + num_docs_ + 1, pos) - offsets_ - 1;
  return absl::DataLossError(absl::StrCat(prefix_, ".bin: token id ", bad, " at token ", pos,
                                          " (document ", doc, ") is outside the vocabulary of ",
                                          meta_.vocab_size, " (tokenizer ", meta_.tokenizer,
                                          "); the file is damaged: ", kRerun));
}

absl::Status Dataset::VerifyContentHash() const {
  if (meta_.bin_sha256.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix_, ".json records no content hash (the dataset was prepared by an older "
        "tally-prep), so its content cannot be verified; re-run tally-prep to record one"));
  }
  struct File {
    const char* ext;
    const char* key;
    std::string got;
    const std::string* want;
  };
  std::vector<File> files;
  for (const auto& [ext, key, map, size, want] :
       {std::tuple{".bin", "bin", bin_map_, bin_size_, &meta_.bin_sha256},
        std::tuple{".idx", "idx", idx_map_, idx_size_, &meta_.idx_sha256}}) {
    ::madvise(map, size, MADV_SEQUENTIAL);
    files.push_back({ext, key, Sha256Hex(map, size), want});
  }
  // The record checks itself: a digest damaged in the .json is the .json's
  // fault, not the file's it describes.
  const bool checked = !meta_.content_check.empty();
  if (checked && ContentCheck(meta_.bin_sha256, meta_.idx_sha256) != meta_.content_check) {
    std::vector<std::string> wrong;
    for (const File& f : files) {
      if (f.got != *f.want) {
        wrong.push_back(absl::StrCat("\"", f.key, "\" records ", *f.want, " but ", prefix_, f.ext,
                                     " hashes to ", f.got));
      }
    }
    return absl::DataLossError(absl::StrCat(
        prefix_, ".json: its \"content_sha256\" record is damaged (the record's own \"check\" "
        "does not match it): ",
        wrong.empty()
            ? "the \"check\" digest itself is wrong; .bin and .idx match their digests"
            : absl::StrCat(absl::StrJoin(wrong, "; "), "; the data files are not to blame"),
        "; ", kRerun, " (or restore ", prefix_, ".json)"));
  }
  for (const File& f : files) {
    if (f.got != *f.want) {
      return absl::DataLossError(absl::StrCat(
          prefix_, f.ext, ": SHA-256 ", f.got, " does not match ", *f.want, " recorded in ",
          prefix_, ".json: ",
          checked ? "the file changed after tally-prep wrote it (the record is intact)"
                  : "the file changed after tally-prep wrote it, or the record in the .json was "
                    "edited (this dataset's record has no check of its own to tell which)",
          "; ", kRerun));
    }
  }
  return absl::OkStatus();
}

Dataset::~Dataset() {
  if (bin_map_) ::munmap(bin_map_, bin_size_);
  if (idx_map_) ::munmap(idx_map_, idx_size_);
}

double Dataset::bytes_per_text_token() const {
  if (meta_.version < 2) return 1.0;  // byte tokenizer: one byte a token
  if (meta_.text_bytes <= 0 || meta_.text_tokens <= 0) return 0;
  return static_cast<double>(meta_.text_bytes) / static_cast<double>(meta_.text_tokens);
}

std::vector<int64_t> Dataset::DocLengths() const {
  std::vector<int64_t> lengths(num_docs_);
  for (int64_t i = 0; i < num_docs_; ++i) lengths[i] = doc_length(i);
  return lengths;
}

}  // namespace tally::data
