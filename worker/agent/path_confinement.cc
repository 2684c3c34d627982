#include "worker/agent/path_confinement.h"

#include <algorithm>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace tally::worker {

namespace fs = std::filesystem;

absl::StatusOr<fs::path> ResolvePath(const std::string& path, const fs::path& base) {
  if (path.empty()) return absl::InvalidArgumentError("the path is empty");
  if (path.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError("the path holds a NUL byte");
  }
  fs::path p(path);
  if (p.is_relative()) p = base / p;
  std::error_code ec;
  fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot resolve it: ", ec.message()));
  resolved = resolved.lexically_normal();
  // weakly_canonical resolved every part that exists, so a symlink still in
  // the result is one whose target does not exist (yet).
  fs::path prefix;
  for (const fs::path& part : resolved) {
    if (part.empty()) continue;
    prefix /= part;
    const fs::file_status st = fs::symlink_status(prefix, ec);
    if (ec) break;  // does not exist: nothing further can be a link either
    if (fs::is_symlink(st)) {
      std::error_code read_ec;
      const fs::path target = fs::read_symlink(prefix, read_ec);
      return absl::InvalidArgumentError(absl::StrCat(
          prefix.string(), " is a symlink to ", read_ec ? "?" : target.string(),
          ", which does not exist"));
    }
  }
  return resolved;
}

bool IsWithin(const fs::path& path, const fs::path& dir) {
  const fs::path p = path.lexically_normal();
  const fs::path d = dir.lexically_normal();
  auto pi = p.begin();
  for (auto di = d.begin(); di != d.end(); ++di) {
    if (di->empty()) continue;  // a trailing separator
    while (pi != p.end() && pi->empty()) ++pi;
    if (pi == p.end() || *pi != *di) return false;
    ++pi;
  }
  return true;
}

std::vector<std::string> DatasetFiles(const std::string& prefix) {
  return {prefix + ".json", prefix + ".idx", prefix + ".bin"};
}

absl::StatusOr<DataRoots> DataRoots::Make(const std::vector<std::string>& roots,
                                          const fs::path& base) {
  DataRoots out;
  out.base_ = base;
  for (const std::string& root : roots) {
    if (root.empty()) {
      return absl::InvalidArgumentError(
          "--data_root: an empty root (two commas in a row, or a trailing comma?)");
    }
    fs::path p(root);
    if (p.is_relative()) p = base / p;
    std::error_code ec;
    const fs::path canonical = fs::canonical(p, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--data_root: ", root, ": ", ec.message(),
                       " (each data root must be an existing directory)"));
    }
    if (!fs::is_directory(canonical, ec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--data_root: ", root, " is not a directory (it resolves to ", canonical.string(),
          ")"));
    }
    if (std::find(out.roots_.begin(), out.roots_.end(), canonical) == out.roots_.end()) {
      out.roots_.push_back(canonical);
    }
  }
  return out;
}

std::string DataRoots::Describe() const {
  return absl::StrJoin(roots_, ", ",
                       [](std::string* out, const fs::path& p) { out->append(p.string()); });
}

absl::Status DataRoots::CheckDataset(absl::string_view field, const std::string& prefix) const {
  if (!confining()) return absl::OkStatus();
  auto inside = [&](const fs::path& p) {
    return std::any_of(roots_.begin(), roots_.end(),
                       [&](const fs::path& root) { return IsWithin(p, root); });
  };
  auto refuse = [&](const std::string& what, const fs::path& resolved) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, " \"", prefix, "\"", what, " resolves to ", resolved.string(),
        ", outside the worker's data roots (", Describe(),
        "); put the dataset under a data root or add one with --data_root"));
  };
  absl::StatusOr<fs::path> resolved_prefix = ResolvePath(prefix, base_);
  if (!resolved_prefix.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " \"", prefix, "\": ",
                                                   resolved_prefix.status().message()));
  }
  // The prefix itself is never opened, but when it is already outside, say
  // so in the terms the spec used.
  if (!inside(*resolved_prefix)) return refuse("", *resolved_prefix);
  for (const std::string& file : DatasetFiles(prefix)) {
    absl::StatusOr<fs::path> resolved = ResolvePath(file, base_);
    if (!resolved.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", prefix, "\": ", resolved.status().message()));
    }
    if (!inside(*resolved)) {
      return refuse(absl::StrCat(" (its file ", file, ")"), *resolved);
    }
  }
  return absl::OkStatus();
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
