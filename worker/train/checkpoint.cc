#include "worker/train/checkpoint.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace tally::train {
namespace {

constexpr char kMagic[8] = {'T', 'A', 'L', 'L', 'Y', 'C', 'K', 'P'};
constexpr uint32_t kVersion = 1;

class Sha256 {
 public:
  Sha256() : ctx_(EVP_MD_CTX_new(), EVP_MD_CTX_free) {
    EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr);
  }
  void Update(const void* data, size_t n) { EVP_DigestUpdate(ctx_.get(), data, n); }
  // A copy of the state so far, to go on from (the whole file's hash after
  // the payload's).
  Sha256 Fork() const {
    Sha256 out;
    EVP_MD_CTX_copy_ex(out.ctx_.get(), ctx_.get());
    return out;
  }
  std::string Final() {
    unsigned char md[32];
    unsigned int len = 0;
    EVP_DigestFinal_ex(ctx_.get(), md, &len);
    return std::string(reinterpret_cast<char*>(md), len);
  }

 private:
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx_;
};

// Writes through to `out`, hashing what it writes twice over: `payload`
// stops before the trailer (its digest is the trailer), `file` takes
// everything. The first failed write is kept in status().
class HashingWriter {
 public:
  explicit HashingWriter(file::AtomicFile* out) : out_(out) {}
  bool Write(const void* data, size_t n) {
    payload_.Update(data, n);
    return WriteTrailer(data, n);
  }
  // Bytes that the file's hash covers but the payload's does not.
  bool WriteTrailer(const void* data, size_t n) {
    if (!status_.ok()) return false;
    file_.Update(data, n);
    status_ = out_->Append(absl::string_view(static_cast<const char*>(data), n));
    return status_.ok();
  }
  template <typename T>
  bool Put(T v) { return Write(&v, sizeof(v)); }
  Sha256& payload() { return payload_; }
  Sha256& file() { return file_; }
  const absl::Status& status() const { return status_; }

 private:
  file::AtomicFile* out_;
  Sha256 payload_, file_;
  absl::Status status_;
};

// The dtypes a checkpoint may hold: anything else is not a tensor this
// trainer wrote (and an out-of-range ScalarType must never reach ATen).
bool KnownDtype(int8_t dtype) {
  switch (static_cast<at::ScalarType>(dtype)) {
    case at::kFloat:
    case at::kDouble:
    case at::kHalf:
    case at::kBFloat16:
    case at::kLong:
    case at::kInt:
    case at::kShort:
    case at::kChar:
    case at::kByte:
    case at::kBool:
      return true;
    default:
      return false;
  }
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<std::string> WriteCheckpoint(const std::string& path, const CheckpointData& data,
                                            file::FileSystem* fs) {
  // PATH.tmp, created exclusively and never through a link, renamed into
  // place once whole (file/file_system.h).
  auto out = (fs != nullptr ? fs : file::Posix())->NewAtomicFile(path);
  if (!out.ok()) return out.status();
  HashingWriter w(out->get());
  bool ok = w.Write(kMagic, 8) && w.Put(kVersion) &&
            w.Put(static_cast<uint64_t>(data.metadata_json.size())) &&
            w.Write(data.metadata_json.data(), data.metadata_json.size()) &&
            w.Put(static_cast<uint64_t>(data.tensors.size()));
  for (const auto& [name, tensor] : data.tensors) {
    if (!ok) break;
    const at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t nbytes = t.numel() * t.element_size();
    ok = w.Put(static_cast<uint32_t>(name.size())) && w.Write(name.data(), name.size()) &&
         w.Put(static_cast<int8_t>(t.scalar_type())) &&
         w.Put(static_cast<uint32_t>(t.dim()));
    for (int64_t d = 0; ok && d < t.dim(); ++d) ok = w.Put(static_cast<int64_t>(t.size(d)));
    ok = ok && w.Put(nbytes) && w.Write(t.data_ptr(), nbytes);
  }
  const std::string digest = w.payload().Final();
  ok = ok && w.WriteTrailer(digest.data(), digest.size());
  const std::string file_digest = w.file().Final();
  if (!ok) return w.status();  // the temporary file goes with `out`
  if (absl::Status s = (*out)->Commit(); !s.ok()) return s;
  return absl::BytesToHexString(file_digest);
}

absl::StatusOr<CheckpointData> ReadCheckpoint(const std::string& path,
                                              const std::string& expected_sha256) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == EACCES || errno == EPERM) {
      return absl::PermissionDeniedError(
          absl::StrCat("checkpoint ", path, " cannot be opened: ", std::strerror(errno)));
    }
    if (errno != ENOENT && errno != ENOTDIR && errno != 0) {
      return Errno(absl::StrCat("opening checkpoint ", path));
    }
    return absl::NotFoundError(absl::StrCat(
        "checkpoint ", path, " not found (workers that resume each other's jobs "
                             "must share --checkpoint_dir)"));
  }
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto corrupt = [&](const std::string& what) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path, ": ", what));
  };
  if (bytes.size() < 8 + 4 + 8 + 8 + 32 || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    return corrupt("not a tally checkpoint (bad magic or truncated)");
  }
  const size_t payload = bytes.size() - 32;
  Sha256 sha;
  sha.Update(bytes.data(), payload);
  // The whole file's hash: the payload's state, then the trailer.
  Sha256 whole = sha.Fork();
  whole.Update(bytes.data() + payload, bytes.size() - payload);
  const std::string hex = absl::BytesToHexString(whole.Final());
  const std::string digest = sha.Final();
  if (digest != bytes.substr(payload)) {
    return corrupt("checksum mismatch: the file is corrupt or was cut short");
  }
  if (!expected_sha256.empty()) {
    // Workers before the whole-file hash reported the trailer's digest, and
    // tallyd may still hold such records.
    if (hex != expected_sha256 && absl::BytesToHexString(digest) != expected_sha256) {
      return corrupt(absl::StrCat("SHA-256 is ", hex, " but the checkpoint was recorded with ",
                                  expected_sha256,
                                  " (overwritten by another run, or changed since it was "
                                  "written)"));
    }
  }
  size_t at = 8;
  auto get = [&](void* out, size_t n) {
    if (n > payload - at) return false;
    std::memcpy(out, bytes.data() + at, n);
    at += n;
    return true;
  };
  uint32_t version = 0;
  uint64_t meta_len = 0, count = 0;
  if (!get(&version, 4) || version != kVersion) return corrupt("unsupported version");
  if (!get(&meta_len, 8) || meta_len > payload - at) return corrupt("bad metadata length");
  CheckpointData data;
  data.sha256 = hex;
  data.metadata_json = bytes.substr(at, meta_len);
  at += meta_len;
  if (!get(&count, 8)) return corrupt("truncated");
  std::set<std::string> names;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t name_len = 0, ndim = 0;
    int8_t dtype = 0;
    uint64_t nbytes = 0;
    if (!get(&name_len, 4) || name_len > payload - at) return corrupt("truncated tensor name");
    std::string name = bytes.substr(at, name_len);
    at += name_len;
    if (!names.insert(name).second) return corrupt("tensor " + name + " appears twice");
    if (!get(&dtype, 1) || !KnownDtype(dtype)) {
      return corrupt(absl::StrCat("tensor ", name, " has unknown dtype ", int{dtype}));
    }
    if (!get(&ndim, 4) || ndim > 16) return corrupt("bad tensor header of " + name);
    std::vector<int64_t> sizes(ndim);
    uint64_t numel = 1;
    for (auto& s : sizes) {
      // Bounded by the file's size before anything is allocated.
      if (!get(&s, 8) || s < 0 || static_cast<uint64_t>(s) > payload ||
          __builtin_mul_overflow(numel, static_cast<uint64_t>(s), &numel)) {
        return corrupt("bad tensor shape of " + name);
      }
    }
    const uint64_t element_size = c10::elementSize(static_cast<at::ScalarType>(dtype));
    uint64_t want = 0;
    if (!get(&nbytes, 8) || __builtin_mul_overflow(numel, element_size, &want) ||
        want != nbytes) {
      return corrupt("tensor " + name + " size does not match its shape");
    }
    if (nbytes > payload - at) return corrupt("truncated tensor data of " + name);
    at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype)));
    // An empty tensor has no storage: its data_ptr() is null.
    if (nbytes > 0) std::memcpy(t.data_ptr(), bytes.data() + at, nbytes);
    at += nbytes;
    data.tensors.emplace_back(std::move(name), std::move(t));
  }
  if (at != payload) {
    return corrupt(absl::StrCat(payload - at, " bytes after the last tensor"));
  }
  return data;
}

absl::Status CheckCheckpointFolder(const std::string& dir, const std::string& root) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (ec || !fs::exists(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint folder ", dir, " does not exist"));
  }
  if (fs::is_symlink(st)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint folder ", dir,
        " is a symlink; checkpoints are not written through one (remove it: the worker "
        "creates the folder)"));
  }
  if (!fs::is_directory(st)) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint folder ", dir, " is not a folder"));
  }
  if (root.empty()) return absl::OkStatus();
  const fs::path folder = fs::canonical(dir, ec);
  std::error_code root_ec;
  const fs::path resolved_root = fs::canonical(root, root_ec);
  if (ec || root_ec || folder.parent_path() != resolved_root) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint folder ", dir, " resolves to ", ec ? "?" : folder.string(),
        ", not a folder directly in the checkpoint root ", root, " (",
        root_ec ? "unresolvable" : resolved_root.string(), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ResolvedCheckpointPath(const std::string& dir,
                                                   const std::string& name,
                                                   const std::string& root) {
  if (absl::Status s = CheckCheckpointFolder(dir, root); !s.ok()) return s;
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint file name \"", name, "\" is not one path component"));
  }
  std::error_code ec;
  const std::filesystem::path folder = std::filesystem::canonical(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint folder ", dir, " cannot be resolved: ", ec.message()));
  }
  const std::filesystem::path file = folder / name;
  const std::filesystem::file_status st = std::filesystem::symlink_status(file, ec);
  if (ec || !std::filesystem::is_regular_file(st)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", file.string(), " is not a regular file in its folder",
        std::filesystem::is_symlink(st) ? " (it is a symlink)" : ""));
  }
  return file.string();
}

}  // namespace tally::train
