#include "worker/model/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/data/json_limits.h"

namespace tally::model {
namespace {

int64_t DtypeBytes(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  return 0;
}

// Dtypes of the format this build does not read (so the error can say so,
// rather than call the file malformed).
bool KnownUnreadDtype(const std::string& dtype) {
  for (const char* d : {"F64", "I64", "I32", "I16", "I8", "U8", "U16", "U32", "U64", "BOOL",
                        "F8_E4M3", "F8_E5M2"}) {
    if (dtype == d) return true;
  }
  return false;
}

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool ReadAll(int fd, void* data, size_t n, off_t at) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, at);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    at += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              at::ScalarType dtype,
                              const std::map<std::string, std::string>& metadata,
                              file::FileSystem* fs) {
  if (dtype != at::kFloat && dtype != at::kBFloat16) {
    return absl::InvalidArgumentError("safetensors: only FP32 and BF16 are written");
  }
  std::vector<at::Tensor> data;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    at::Tensor t = tensor.detach().to(at::kCPU).to(dtype).contiguous();
    const int64_t n = t.numel() * t.element_size();
    header[name] = {{"dtype", dtype == at::kFloat ? "F32" : "BF16"},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  // All or nothing, never through a link (file/file_system.h).
  auto out = (fs != nullptr ? fs : file::Posix())->NewAtomicFile(path);
  if (!out.ok()) return out.status();
  uint64_t n = text.size();
  char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<char>(n >> (8 * i));
  absl::Status s = (*out)->Append(absl::string_view(le, 8));
  if (s.ok()) s = (*out)->Append(text);
  for (const at::Tensor& t : data) {
    if (!s.ok()) break;
    s = (*out)->Append(absl::string_view(static_cast<const char*>(t.data_ptr()),
                                         static_cast<size_t>(t.numel() * t.element_size())));
  }
  if (!s.ok()) return s;
  return (*out)->Commit();
}

absl::StatusOr<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& json,
                                                                     int64_t data_bytes,
                                                                     const std::string& path) {
  auto bad = [&](auto&&... parts) {
    return absl::DataLossError(absl::StrCat(path, ": ", parts...));
  };
  if (data::JsonNestsDeeperThan(json, 4)) return bad("header nests deeper than a safetensors one");
  nlohmann::json h = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (h.is_discarded() || !h.is_object()) return bad("header is not a JSON object");
  std::vector<SafetensorsEntry> out;
  for (const auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return bad("__metadata__ is not an object");
      for (const auto& [k, m] : v.items()) {
        if (!m.is_string()) return bad("__metadata__.", k, " is not a string");
      }
      continue;
    }
    if (!v.is_object()) return bad("tensor ", name, ": not an object");
    const auto dt = v.find("dtype");
    const auto sh = v.find("shape");
    const auto of = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad("tensor ", name, ": dtype missing");
    if (sh == v.end() || !sh->is_array()) return bad("tensor ", name, ": shape missing");
    if (of == v.end() || !of->is_array() || of->size() != 2) {
      return bad("tensor ", name, ": data_offsets must be [begin, end]");
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dt->get<std::string>();
    const int64_t width = DtypeBytes(e.dtype);
    if (width == 0) {
      if (KnownUnreadDtype(e.dtype)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", name, " is ", e.dtype,
                         "; this build reads F32, BF16 and F16 weights only"));
      }
      return bad("tensor ", name, ": unknown dtype \"", e.dtype.substr(0, 32), "\"");
    }
    int64_t elements = 1;
    for (const auto& d : *sh) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return bad("tensor ", name, ": shape holds ", d.dump().substr(0, 32),
                   " (non-negative integers only)");
      }
      const int64_t n = d.get<int64_t>();
      if (n != 0 && elements > std::numeric_limits<int64_t>::max() / 8 / n) {
        return bad("tensor ", name, ": shape too large");
      }
      elements *= n;
      e.shape.push_back(n);
    }
    if (e.shape.size() > 8) return bad("tensor ", name, ": more than 8 dimensions");
    for (const auto& o : *of) {
      if (!o.is_number_unsigned()) return bad("tensor ", name, ": data_offsets not integers");
    }
    const uint64_t begin = (*of)[0].get<uint64_t>(), end = (*of)[1].get<uint64_t>();
    if (begin > end || end > static_cast<uint64_t>(data_bytes)) {
      return bad("tensor ", name, ": data_offsets [", begin, ", ", end, "] outside the data (",
                 data_bytes, " bytes)");
    }
    e.begin = static_cast<int64_t>(begin);
    e.end = static_cast<int64_t>(end);
    if (e.end - e.begin != elements * width) {
      return bad("tensor ", name, ": ", e.end - e.begin, " bytes for ", elements, " ", e.dtype,
                 " elements (", elements * width, " expected)");
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t at = 0;
  for (const SafetensorsEntry& e : out) {
    if (e.begin < at) return bad("tensor ", e.name, " overlaps the tensor before it");
    if (e.begin > at) return bad("bytes ", at, "..", e.begin, " belong to no tensor");
    at = e.end;
  }
  if (at != data_bytes) return bad("bytes ", at, "..", data_bytes, " belong to no tensor");
  return out;
}

absl::StatusOr<NamedTensors> ReadSafetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return Errno("opening " + path);
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) return Errno("stat " + path);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const int64_t size = st.st_size;
  unsigned char le[8];
  if (size < 8 || !ReadAll(fd, le, 8, 0)) {
    return absl::DataLossError(absl::StrCat(path, ": shorter than a safetensors header"));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(le[i]) << (8 * i);
  if (n > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes) ||
      n > static_cast<uint64_t>(size - 8)) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", n, " is beyond the file (",
                                            size, " bytes) or the ", kMaxSafetensorsHeaderBytes,
                                            "-byte limit"));
  }
  std::string json(n, '\0');
  if (!ReadAll(fd, json.data(), n, 8)) return Errno("reading " + path);
  const int64_t data_start = 8 + static_cast<int64_t>(n);
  auto entries = ParseSafetensorsHeader(json, size - data_start, path);
  if (!entries.ok()) return entries.status();
  NamedTensors out;
  for (const SafetensorsEntry& e : *entries) {
    const at::ScalarType t = e.dtype == "F32"    ? at::kFloat
                             : e.dtype == "BF16" ? at::kBFloat16
                                                 : at::kHalf;
    at::Tensor raw = at::empty(e.shape, at::TensorOptions().dtype(t));
    if (e.end > e.begin &&
        !ReadAll(fd, raw.data_ptr(), static_cast<size_t>(e.end - e.begin), data_start + e.begin)) {
      return Errno("reading " + path);
    }
    out.emplace_back(e.name, raw.to(at::kFloat));
  }
  return out;
}

}  // namespace tally::model
