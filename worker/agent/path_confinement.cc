#include "worker/agent/path_confinement.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace tally::worker {

namespace fs = std::filesystem;

absl::StatusOr<DataRoots> DataRoots::Make(const std::vector<std::string>& roots,
                                          const fs::path& base) {
  absl::StatusOr<tally::DataRoots> made = tally::DataRoots::Make(
      roots, base,
      {"--data_root", "the worker's data roots",
       "put the dataset under a data root or add one with --data_root",
       absl::StatusCode::kPermissionDenied});
  if (!made.ok()) return made.status();
  return DataRoots(*std::move(made));
}

absl::StatusOr<std::string> CheckpointFolderName(const std::string& job) {
  const std::string folder = absl::StrReplaceAll(job, {{"s/", "-"}});
  auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job name \"", absl::StrReplaceAll(job, {{std::string(1, '\0'), "\\0"}}),
        "\" cannot name a checkpoint folder (", why,
        "); tallyd names jobs jobs/N, which become job-N"));
  };
  if (folder.empty()) return refuse("it is empty");
  if (folder == "." || folder == "..") return refuse("it would be . or ..");
  if (folder.find('/') != std::string::npos) return refuse("it would hold a /");
  if (folder.find('\0') != std::string::npos) return refuse("it holds a NUL byte");
  if (folder.size() > 255) return refuse("it would be longer than 255 bytes");
  return folder;
}

absl::StatusOr<std::string> JobCheckpointDir(const std::string& checkpoint_root,
                                             const std::string& job, const fs::path& base) {
  absl::StatusOr<std::string> folder = CheckpointFolderName(job);
  if (!folder.ok()) return folder.status();
  const std::string dir = absl::StrCat(checkpoint_root, "/", *folder);
  absl::StatusOr<fs::path> root = ResolvePath(checkpoint_root, base);
  if (!root.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint root ", checkpoint_root, " (--checkpoint_dir): ", root.status().message()));
  }
  absl::StatusOr<fs::path> resolved = ResolvePath(dir, base);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint folder ", dir, ": ", resolved.status().message()));
  }
  if (!IsWithin(*resolved, *root) || *resolved == *root) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint folder ", dir, " resolves to ", resolved->string(),
        ", outside the worker's checkpoint root ", root->string(),
        " (--checkpoint_dir); remove the symlink that leads out of it"));
  }
  // Inside the root is not enough: a link could still lead into another
  // job's folder, and checkpoints are never written through one.
  std::error_code ec;
  if (fs::is_symlink(fs::symlink_status(dir, ec))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "checkpoint folder ", dir, " is a symlink; a job's checkpoints are written only into "
        "a real folder under the checkpoint root (--checkpoint_dir): remove the link, and the "
        "worker creates the folder"));
  }
  return dir;
}

absl::Status CheckResumePath(const std::string& resume_path, const std::string& job_dir,
                             const std::string& checkpoint_root, const fs::path& base) {
  absl::StatusOr<fs::path> dir = ResolvePath(job_dir, base);
  if (!dir.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint folder ", job_dir, ": ", dir.status().message()));
  }
  absl::StatusOr<fs::path> resolved = ResolvePath(resume_path, base);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("resume_from.path \"", resume_path,
                                                   "\": ", resolved.status().message()));
  }
  if (!IsWithin(*resolved, *dir) || *resolved == *dir) {
    return absl::PermissionDeniedError(absl::StrCat(
        "resume_from.path \"", resume_path, "\" resolves to ", resolved->string(),
        ", outside this job's checkpoint folder ", dir->string(),
        " under the worker's checkpoint root ", checkpoint_root,
        " (--checkpoint_dir); the checkpoint tallyd recorded for this job was not written "
        "there (workers that resume each other's jobs must share --checkpoint_dir, mounted "
        "at the same path)"));
  }
  return absl::OkStatus();
}

}  // namespace tally::worker
