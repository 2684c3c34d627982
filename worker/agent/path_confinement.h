// Path confinement on a worker: what a job spec (or tallyd) names on this
// worker's disk must resolve inside the folders the operator allowed.
//
// - Data roots (--data_root): every file a dataset open touches must resolve
//   inside one root (common/path_confinement.h says how paths resolve).
// - Checkpoints (--checkpoint_dir): a job's folder is one path component
//   under the root ("jobs/7" -> "job-7") and a real folder, not a symlink;
//   a checkpoint to resume from must resolve inside that job's folder.
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
#include "common/path_confinement.h"

namespace tally::worker {

// The worker's --data_root (common/path_confinement.h): a path outside
// every root is PERMISSION_DENIED, naming the worker's data roots and
// --data_root.
class DataRoots : public tally::DataRoots {
 public:
  DataRoots() = default;
  static absl::StatusOr<DataRoots> Make(const std::vector<std::string>& roots,
                                        const std::filesystem::path& base);

 private:
  explicit DataRoots(tally::DataRoots roots) : tally::DataRoots(std::move(roots)) {}
};

// The folder, under the checkpoint root, that a job's checkpoints go in:
// "jobs/7" -> "job-7" (every "s/" becomes "-", as before this check
// existed). InvalidArgument naming the job unless the result is a single
// path component: not empty, not "." or "..", no "/" or NUL byte, at most
// 255 bytes.
absl::StatusOr<std::string> CheckpointFolderName(const std::string& job);

// The job's checkpoint folder, `checkpoint_root`/CheckpointFolderName(job),
// as a path to write under (not resolved: the trainer resolves each
// checkpoint's path once written, train::TrainConfig::checkpoint_root).
// InvalidArgument for a job name CheckpointFolderName refuses;
// PermissionDenied when the folder resolves outside the root (a symlink out
// of it) or is a symlink at all (it could lead into another job's folder).
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
