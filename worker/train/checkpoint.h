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
// the directory, so a crash leaves either the old file or the new one. It
// never writes through a symlink: a stale PATH.tmp (a crash's, or a link
// planted there) is removed and the new one created exclusively without
// following links, and the rename replaces whatever entry PATH is, never
// its target. The folder itself is followed as the OS resolves it;
// CheckCheckpointFolder is for a writer that must not.
//
// Beside each checkpoint the trainer keeps PATH.sha256 (checksum_file.h), so
// that a standalone resume can check the whole file as tallyd does.
#ifndef TALLY_WORKER_TRAIN_CHECKPOINT_H_
#define TALLY_WORKER_TRAIN_CHECKPOINT_H_

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/file/file_system.h"

namespace tally::train {

struct CheckpointData {
  // Set by ReadCheckpoint: the whole file's SHA-256, lower-case hex (what
  // WriteCheckpoint returned for it). Not written.
  std::string sha256;
  std::string metadata_json;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
};

// Returns the SHA-256 (lowercase hex) of the whole file as written. The
// file is written through `fs` (file/file_system.h; null: the operating
// system's), so a failure at any point leaves PATH as it was and no PATH.tmp.
absl::StatusOr<std::string> WriteCheckpoint(const std::string& path, const CheckpointData& data,
                                            file::FileSystem* fs = nullptr);

// Reads and verifies a checkpoint: DataLoss when the trailer checksum does
// not match the contents (a flipped byte, a cut), when the layout is
// inconsistent (a tensor whose byte count does not match its shape, an
// unknown dtype, a repeated name, bytes left over), or when
// `expected_sha256` is given and is not the whole file's SHA-256 (records
// made before the whole-file hash, which hold the trailer's digest, are
// accepted too); NotFound when the file is missing; PermissionDenied or
// Internal when it exists but cannot be opened (this process's trouble, not
// the file's). Only the layout is checked here: whether the contents fit a
// model is the trainer's to check. Tensors come back on the CPU.
absl::StatusOr<CheckpointData> ReadCheckpoint(const std::string& path,
                                              const std::string& expected_sha256);

// For a writer that must stay inside `dir` (tally-worker: a job's folder
// under its checkpoint root): OK when `dir` is a directory and not itself a
// symlink (folders above it may be) and, when `root` is given, resolves to a
// folder directly inside `root`'s resolved folder. FailedPrecondition naming
// it otherwise.
absl::Status CheckCheckpointFolder(const std::string& dir, const std::string& root = "");

// The path to report for checkpoint `name`, just written in `dir`: `dir`
// with every symlink, "." and ".." resolved, then `name`.
// FailedPrecondition when `dir` fails CheckCheckpointFolder(dir, root) or
// `name` is not a regular file directly in it (a symlink, or gone).
absl::StatusOr<std::string> ResolvedCheckpointPath(const std::string& dir,
                                                   const std::string& name,
                                                   const std::string& root = "");

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_CHECKPOINT_H_
