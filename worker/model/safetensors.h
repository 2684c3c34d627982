// The safetensors file format (the format Hugging Face models are stored
// in), written and read here without the safetensors library:
//
//   uint64 N (little-endian) | N bytes of JSON header | data
//
// The header maps each tensor's name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets into the data, which follows the header), plus an
// optional "__metadata__" object of string values. Tensors are stored
// row-major, little-endian, back to back, covering the data exactly.
#ifndef TALLY_WORKER_MODEL_SAFETENSORS_H_
#define TALLY_WORKER_MODEL_SAFETENSORS_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/file/file_system.h"

namespace tally::model {

// Largest header accepted (the format's own readers use 100 MB).
inline constexpr int64_t kMaxSafetensorsHeaderBytes = int64_t{100} << 20;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (FP32 or BF16 after conversion to `dtype`, which must be
// kFloat or kBFloat16) as one AtomicFile through `fs` (file/file_system.h;
// null: the operating system's): PATH.tmp, renamed over `path` once whole.
// The header is padded with spaces to a multiple of 8 bytes.
absl::Status WriteSafetensors(const std::string& path, const NamedTensors& tensors,
                              at::ScalarType dtype,
                              const std::map<std::string, std::string>& metadata = {},
                              file::FileSystem* fs = nullptr);

// Reads every tensor of a safetensors file into FP32 CPU tensors (F32, BF16
// and F16 accepted). DataLoss naming the file and, where it is at fault, the
// tensor, for anything malformed: a header longer than the file or than
// kMaxSafetensorsHeaderBytes, bad JSON, an entry that is not an object with
// a known dtype, a shape of non-negative integers and offsets matching the
// dtype and shape, overlapping tensors, or bytes no tensor covers.
// InvalidArgument for a well-formed file with a dtype this build does not
// read (e.g. I8). NotFound when the file is missing.
absl::StatusOr<NamedTensors> ReadSafetensors(const std::string& path);

// The same checks on a header already read (the fuzzer's entry point):
// `json` is the header text, `data_bytes` the bytes that follow it. Returns
// the entries sorted by offset.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16"
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;
};
absl::StatusOr<std::vector<SafetensorsEntry>> ParseSafetensorsHeader(const std::string& json,
                                                                     int64_t data_bytes,
                                                                     const std::string& path);

}  // namespace tally::model

#endif  // TALLY_WORKER_MODEL_SAFETENSORS_H_
