// Checkpoint files: named tensors plus JSON metadata, with a SHA-256.
//
// Layout: "TALLYCKP" | uint32 version (1) | uint64 metadata length | metadata
// (JSON) | uint64 tensor count | per tensor: uint32 name length, name, int8
// dtype (c10::ScalarType), uint32 ndim, int64 sizes[ndim], uint64 byte count,
// bytes | then 32 bytes: the SHA-256 of everything before them (the trailer,
// checked on every read).
//
// The SHA-256 a checkpoint is known by (returned by WriteCheckpoint, recorded
// by tallyd, checked on resume) is that of the whole file, trailer included:
// what `sha256sum FILE` prints.
//
// WriteCheckpoint writes PATH.tmp, fsyncs it, renames it over PATH and fsyncs
// the directory, so a crash leaves either the old file or the new one.
#ifndef TALLY_WORKER_TRAIN_CHECKPOINT_H_
#define TALLY_WORKER_TRAIN_CHECKPOINT_H_

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tally::train {

struct CheckpointData {
  std::string metadata_json;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// Returns the SHA-256 (lowercase hex) of the whole file as written.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& path,
                                            const CheckpointData& data);

// Reads and verifies a checkpoint: DataLoss when the trailer checksum does
// not match the contents, when the layout is inconsistent (a tensor whose
// byte count does not match its shape, an unknown dtype, a repeated name,
// bytes left over), or when `expected_sha256` is given and is not the
// whole file's SHA-256 (records made before the whole-file hash, which hold
// the trailer's digest, are accepted too); NotFound when the file is
// missing. Only the layout is checked here: whether the contents fit a
// model is the trainer's to check. Tensors come back on the CPU.
absl::StatusOr<CheckpointData> ReadCheckpoint(const std::string& path,
                                              const std::string& expected_sha256);

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_CHECKPOINT_H_
