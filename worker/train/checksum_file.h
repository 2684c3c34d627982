// The SHA-256 sidecar beside a checkpoint: PATH.sha256 holds the whole
// file's SHA-256 (the one tallyd records, checkpoint.h) in sha256sum's
// format, "HEX  NAME\n" with NAME the checkpoint's file name, so that
// `sha256sum -c step-00000020.ckpt.sha256` checks it from its folder and
// tally-train --resume checks a checkpoint against it without tallyd.
//
// The trainer writes it after the checkpoint it describes is in place, so a
// crash between the two leaves a checkpoint with no sidecar (or the previous
// one's, which then does not match): a resume that finds a sidecar refuses a
// mismatch, one that finds none says it could check only the checkpoint's
// internal checksum. No LibTorch here: tally-train includes it.
//
// Thread-safety: the functions share no state.
#ifndef TALLY_WORKER_TRAIN_CHECKSUM_FILE_H_
#define TALLY_WORKER_TRAIN_CHECKSUM_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tally::train {

// PATH.sha256.
std::string ChecksumFilePath(const std::string& checkpoint_path);

// Writes ChecksumFilePath(checkpoint_path) atomically (a temporary file
// created without following symlinks, fsynced and renamed into place).
// InvalidArgument unless `sha256_hex` is 64 lower-case hex digits; Internal
// on an I/O error.
absl::Status WriteChecksumFile(const std::string& checkpoint_path, const std::string& sha256_hex);

// The SHA-256 recorded in ChecksumFilePath(checkpoint_path). NotFound when
// there is none; DataLoss naming the sidecar when it is not one line of 64
// hex digits, two spaces and the checkpoint's file name; Internal when it
// cannot be read.
absl::StatusOr<std::string> ReadChecksumFile(const std::string& checkpoint_path);

// Whether `s` is 64 lower-case hex digits.
bool IsSha256Hex(const std::string& s);

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_CHECKSUM_FILE_H_
