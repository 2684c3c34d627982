// Path confinement: what a job spec (or tallyd) names on this worker's disk
// must resolve inside the folders the operator allowed.
//
// - Data roots (--data_root): every file a dataset open touches
//   (PREFIX.json, PREFIX.idx, PREFIX.bin) must resolve inside one root.
// - Checkpoints (--checkpoint_dir): a job's folder is one path component
//   under the root ("jobs/7" -> "job-7"), and a checkpoint to resume from
//   must resolve inside that job's folder.
//
// "Resolve" means as the OS would open it: a relative path is taken relative
// to a base directory (the worker's working directory), symlinks are followed
// through every part of the path that exists (std::filesystem::
// weakly_canonical), and "." and ".." are applied. A part that does not exist
// yet is kept as written; a dangling symlink is refused, since it could be
// made to point anywhere later. Containment compares whole path components,
// so /data2/x is not inside /data.
//
// These checks guard against what a spec or a controller names, not against
// someone who can write inside a root and swap a symlink between the check
// and the open.
//
// All functions are thread-safe; DataRoots is immutable once made.
#ifndef TALLY_WORKER_AGENT_PATH_CONFINEMENT_H_
#define TALLY_WORKER_AGENT_PATH_CONFINEMENT_H_

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally::worker {

// `path` resolved as described above; a relative one against `base` (an
// absolute directory). InvalidArgument for an empty path or one holding a
// NUL byte, a dangling symlink, a symlink loop, or any other failure to
// resolve, with the reason.
absl::StatusOr<std::filesystem::path> ResolvePath(const std::string& path,
                                                  const std::filesystem::path& base);

// Whether `path` is `dir` or below it, comparing whole components of the
// two lexically normalised paths (both absolute, already resolved).
bool IsWithin(const std::filesystem::path& path, const std::filesystem::path& dir);

// The files Dataset::Open reads for a dataset prefix, in the order it reads
// them: PREFIX.json, PREFIX.idx, PREFIX.bin.
std::vector<std::string> DatasetFiles(const std::string& prefix);

class DataRoots {
 public:
  // No roots: nothing is confined.
  DataRoots() = default;

  // Each root resolved against `base` (the worker's working directory, also
  // used for relative dataset paths). InvalidArgument naming --data_root and
  // the root when one does not exist or is not a directory. A root named
  // twice (or two spellings of one folder) is kept once.
  static absl::StatusOr<DataRoots> Make(const std::vector<std::string>& roots,
                                        const std::filesystem::path& base);

  bool confining() const { return !roots_.empty(); }
  const std::vector<std::filesystem::path>& roots() const { return roots_; }
  // "/data, /mnt/corpora".
  std::string Describe() const;

  // OK when nothing is confined, or when every file of the dataset at
  // `prefix` resolves inside a root. PermissionDenied otherwise, naming
  // `field` (e.g. "spec.data.train_path"), the path as given, what it
  // resolved to and the roots, and saying how to fix it; InvalidArgument
  // naming `field` when the path cannot be resolved. Opens no file.
  absl::Status CheckDataset(absl::string_view field, const std::string& prefix) const;

 private:
  std::vector<std::filesystem::path> roots_;
  std::filesystem::path base_;
};

// The folder, under the checkpoint root, that a job's checkpoints go in:
// "jobs/7" -> "job-7" (every "s/" becomes "-", as before this check
// existed). InvalidArgument naming the job unless the result is a single
// path component: not empty, not "." or "..", no "/" or NUL byte, at most
// 255 bytes.
absl::StatusOr<std::string> CheckpointFolderName(const std::string& job);

// The job's checkpoint folder, `checkpoint_root`/CheckpointFolderName(job),
// as a path to write under (not resolved: what was given, so recorded
// checkpoint paths keep the root's spelling). InvalidArgument for a job name
// CheckpointFolderName refuses; PermissionDenied when the folder resolves
// outside the root (it is a symlink out of it).
absl::StatusOr<std::string> JobCheckpointDir(const std::string& checkpoint_root,
                                             const std::string& job,
                                             const std::filesystem::path& base);

// OK when `resume_path` resolves strictly inside `job_dir` (as returned by
// JobCheckpointDir). PermissionDenied otherwise, naming
// resume_from.path, what it resolved to, the job's folder and the
// checkpoint root; InvalidArgument when it cannot be resolved.
absl::Status CheckResumePath(const std::string& resume_path, const std::string& job_dir,
                             const std::string& checkpoint_root,
                             const std::filesystem::path& base);

}  // namespace tally::worker

#endif  // TALLY_WORKER_AGENT_PATH_CONFINEMENT_H_
