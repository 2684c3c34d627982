// tallyd's --data_roots: a pre-check, when a job or experiment is submitted,
// that the datasets its specs name lie inside folders the operator allowed.
// Workers check again before opening anything (tally-worker --data_root,
// worker/agent/path_confinement.h); this check refuses a bad spec before it
// is queued, with INVALID_ARGUMENT, instead of failing an attempt later.
//
// A dataset path is a prefix: the files are PREFIX.json, PREFIX.idx and
// PREFIX.bin. The prefix and each of those files (hence the prefix's
// folder) must resolve inside one root. "Resolve" means as the OS would open
// it: a relative path is taken relative to tallyd's working directory
// (tallyd and the workers should see datasets at the same paths), symlinks
// are followed through every part of the path that exists
// (std::filesystem::weakly_canonical), and "." and ".." are applied. Parts
// that do not exist yet are kept as written (the files need not exist at
// submit); a dangling symlink is refused, since it could be made to point
// anywhere later. Containment compares whole path components, so /data2/x
// is not inside /data.
//
// This reads only file metadata on tallyd's machine; it guards against what
// a spec names, not against someone who can change the folders between the
// check and a worker's open (the worker's own check covers that).
//
// Immutable once made; all methods are thread-safe.
#ifndef TALLY_SERVER_API_DATA_ROOTS_H_
#define TALLY_SERVER_API_DATA_ROOTS_H_

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/path_confinement.h"
#include "tally/v1/experiments.pb.h"
#include "tally/v1/spec.pb.h"

namespace tally::api {

// tallyd's --data_roots (common/path_confinement.h): a path outside every
// root is INVALID_ARGUMENT naming the field, the path as the caller sent it
// and the roots as configured. It never says what a path resolved to on
// tallyd's host (a caller could otherwise map tallyd's filesystem, e.g.
// /proc/self/cwd), nor where a symlink points.
class DataRoots : public tally::DataRoots {
 public:
  // No roots: nothing is checked.
  DataRoots() = default;

  // Roots against `base` (tallyd's working directory, also used for
  // relative dataset paths); InvalidArgument naming --data_roots and the
  // root when one is empty, missing or not a directory.
  static absl::StatusOr<DataRoots> Make(const std::vector<std::string>& roots,
                                        const std::filesystem::path& base);

  bool checking() const { return confining(); }

  // CheckDataset for spec.data.train_path and spec.data.val_path, each
  // error prefixed with `context` (e.g. "variants[1] (packed): ").
  absl::Status CheckJobSpec(const tally::v1::JobSpec& spec, absl::string_view context = "") const;

  // CheckJobSpec for each variant's resolved spec (ResolveVariant), the
  // error naming the variant: "variants[1] (packed): spec.data.train_path
  // ...". A variant that does not resolve is skipped: validation reports it.
  absl::Status CheckExperimentSpec(const tally::v1::ExperimentSpec& spec) const;

 private:
  explicit DataRoots(tally::DataRoots roots) : tally::DataRoots(std::move(roots)) {}
};

}  // namespace tally::api

#endif  // TALLY_SERVER_API_DATA_ROOTS_H_
