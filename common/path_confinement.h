// Path confinement: a dataset a job spec names must resolve inside folders
// the operator allowed (tally-worker --data_root before it opens anything,
// tallyd --data_roots before it queues a spec).
//
// A dataset path is a prefix: its files are PREFIX.json, PREFIX.idx and
// PREFIX.bin. The prefix and each of those files must resolve inside one
// root. "Resolve" means as the OS would open it: a relative path is taken
// relative to a base directory (the process's working directory), symlinks
// are followed through every part of the path that exists
// (std::filesystem::weakly_canonical), and "." and ".." are applied. A part
// that does not exist yet is kept as written; a dangling symlink is refused,
// since it could be made to point anywhere later. Containment compares whole
// path components, so /data2/x is not inside /data.
//
// These checks guard against what a spec or a controller names, not against
// someone who can write inside a root and swap a symlink between the check
// and the open.
//
// All functions are thread-safe; DataRoots is immutable once made.
#ifndef TALLY_COMMON_PATH_CONFINEMENT_H_
#define TALLY_COMMON_PATH_CONFINEMENT_H_

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tally {

// `path` resolved as described above; a relative one against `base` (an
// absolute directory). InvalidArgument for an empty path or one holding a
// NUL byte, a dangling symlink, a symlink loop, or any other failure to
// resolve, with the reason.
absl::StatusOr<std::filesystem::path> ResolvePath(const std::string& path,
                                                  const std::filesystem::path& base);

// Whether `path` is `dir` or below it, comparing whole components of the
// two lexically normalised paths (both absolute, already resolved).
bool IsWithin(const std::filesystem::path& path, const std::filesystem::path& dir);

// PREFIX.json, PREFIX.idx, PREFIX.bin.
std::vector<std::string> DatasetFiles(const std::string& prefix);

class DataRoots {
 public:
  // How refusals read, for the process that checks.
  struct Wording {
    std::string flag;       // "--data_root"
    std::string roots;      // "the worker's data roots"
    std::string fix;        // "put the dataset under a data root or add one with --data_root"
    absl::StatusCode code;  // of a path outside every root
    // Whether refusals say what a path resolved to and list the roots as
    // resolved. false (tallyd, whose refusals go to remote callers): a
    // refusal names only what the caller sent and the roots as configured,
    // never a path of the checking host.
    bool echo_resolved = true;
  };

  // No roots: nothing is confined.
  DataRoots() = default;

  // Each root resolved against `base` (also used for relative dataset
  // paths). InvalidArgument naming the flag and the root when one is empty,
  // does not exist or is not a directory. A root named twice (or two
  // spellings of one folder) is kept once.
  static absl::StatusOr<DataRoots> Make(const std::vector<std::string>& roots,
                                        const std::filesystem::path& base, Wording wording);

  bool confining() const { return !roots_.empty(); }
  const std::vector<std::filesystem::path>& roots() const { return roots_; }
  // "/data, /mnt/corpora".
  std::string Describe() const;
  // The roots as they were given to Make ("data, /mnt/corpora"), one per
  // distinct folder.
  std::string DescribeConfigured() const;

  // OK when nothing is confined, or when the prefix and every file of the
  // dataset resolve inside a root (an empty prefix does not resolve). Otherwise wording.code, naming `field` (e.g.
  // "spec.data.train_path"), the path as given, what it resolved to and the
  // roots (with wording.echo_resolved false: neither, only the roots as
  // configured), and saying how to fix it; InvalidArgument naming `field` when the
  // path cannot be resolved. Opens no file.
  absl::Status CheckDataset(absl::string_view field, const std::string& prefix) const;

  // The same check for a path and the files read through it: `path`
  // itself and each of `files` (e.g. a model folder and its config.json and
  // model.safetensors; a checkpoint file alone).
  absl::Status CheckFiles(absl::string_view field, const std::string& path,
                          const std::vector<std::string>& files) const;

  // CheckFiles for a JobSpec's model.init_from (hf: the folder, its
  // config.json and model.safetensors; checkpoint: the file), naming
  // `field_prefix` + "model.init_from.hf" or ".checkpoint". OK when unset.
  absl::Status CheckInitFrom(absl::string_view field_prefix, const std::string& hf,
                             const std::string& checkpoint) const;
  // The same for any weights named so (training.distill.teacher): `field`
  // + ".hf" or ".checkpoint".
  absl::Status CheckWeights(absl::string_view field, const std::string& hf,
                            const std::string& checkpoint) const;

 private:
  std::vector<std::filesystem::path> roots_;
  std::vector<std::string> configured_;  // roots_[i] as given
  std::filesystem::path base_;
  Wording wording_;
};

}  // namespace tally

#endif  // TALLY_COMMON_PATH_CONFINEMENT_H_
