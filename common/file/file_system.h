// FileSystem: the one seam between Tally's file formats and the disk, as
// LevelDB's Env is for its tables. Writers of files that must never be seen
// half written (checkpoints, their SHA-256 sidecars, safetensors exports,
// datasets) go through NewAtomicFile; readers of files that must stay small
// (job specs, token files, a dataset's metadata) through FileSize and
// ReadAtMost. Tests substitute a FileSystem that fails on demand
// (tests/support/file/fault_injection_file_system.h).
//
// No LibTorch, no protobuf: the trainer-only build links it.
//
// Thread-safety: Posix() is thread-safe; an AtomicFile is used by one thread.
#ifndef TALLY_COMMON_FILE_FILE_SYSTEM_H_
#define TALLY_COMMON_FILE_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <istream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally::file {

// A file written in place of `path`, all or nothing: its bytes go to
// PATH.tmp; Commit() fsyncs it, renames it over PATH (replacing whatever
// entry PATH is, never writing through a link there) and fsyncs the folder,
// so a crash leaves either the old file or the new one. Destroyed without a
// successful Commit(), it removes PATH.tmp.
//
// A writer that learns a header's contents only at the end (a count) appends
// a placeholder, overwrites it with WriteAt, and may read the file back with
// ReadAt (to hash it) before Commit, so that it never holds the file in
// memory. Errors name PATH.tmp; once Commit has succeeded, every call is
// FailedPrecondition.
class AtomicFile {
 public:
  virtual ~AtomicFile() = default;
  virtual absl::Status Append(absl::string_view bytes) = 0;
  // Overwrites bytes already appended, from `offset`; the file does not
  // grow: OutOfRange when offset + bytes.size() passes what was appended.
  virtual absl::Status WriteAt(uint64_t offset, absl::string_view bytes) = 0;
  // Up to `n` bytes of what was written, from `offset`: fewer at the end,
  // none past it.
  virtual absl::StatusOr<std::string> ReadAt(uint64_t offset, size_t n) = 0;
  virtual absl::Status Commit() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Starts an AtomicFile for `path`. PATH.tmp is created exclusively and
  // never by following a link: a stale one (a crash's, or a link planted
  // there) is removed first. Internal naming the file and the OS's reason
  // when it cannot be.
  virtual absl::StatusOr<std::unique_ptr<AtomicFile>> NewAtomicFile(const std::string& path) = 0;

  // The file's first max_bytes + 1 bytes at most: a result longer than
  // max_bytes says the file is too long, without reading an endless one
  // (/dev/zero) to its end. Never waits for another process: the file is
  // opened and read without blocking, and a FIFO or socket is refused
  // (FailedPrecondition "PATH: not a regular file"), never read. NotFound
  // when there is no such file; Internal naming the file and the OS's reason
  // when it cannot be opened or read.
  virtual absl::StatusOr<std::string> ReadAtMost(const std::string& path, size_t max_bytes) = 0;

  // The size in bytes of the regular file at `path` (links followed), asked
  // without opening it for reading, so a reader can refuse a file by its
  // size or type before reading it. NotFound when there is no such file;
  // FailedPrecondition "PATH: not a regular file" for a folder, FIFO,
  // device or socket (their sizes say nothing of what a read returns);
  // Internal naming the file and the OS's reason otherwise.
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path) = 0;
};

// The operating system's.
FileSystem* Posix();

// ReadAtMost for a stream already open (standard input); Internal when a
// read fails.
absl::StatusOr<std::string> ReadAtMost(std::istream& in, size_t max_bytes);

}  // namespace tally::file

#endif  // TALLY_COMMON_FILE_FILE_SYSTEM_H_
