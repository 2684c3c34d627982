#include "server/api/data_roots.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/experiment_spec.h"
#include "common/text.h"

namespace tally::api {

absl::StatusOr<DataRoots> DataRoots::Make(const std::vector<std::string>& roots,
                                          const std::filesystem::path& base) {
  absl::StatusOr<tally::DataRoots> made = tally::DataRoots::Make(
      roots, base,
      {"--data_roots", "tallyd's --data_roots", "put the dataset under a data root",
       absl::StatusCode::kInvalidArgument, /*echo_resolved=*/false});
  if (!made.ok()) return made.status();
  return DataRoots(*std::move(made));
}

absl::Status DataRoots::CheckJobSpec(const tally::v1::JobSpec& spec,
                                     absl::string_view context) const {
  if (!confining()) return absl::OkStatus();
  for (const auto& [field, path] : {std::pair<const char*, const std::string*>{
                                        "spec.data.train_path", &spec.data().train_path()},
                                    std::pair<const char*, const std::string*>{
                                        "spec.data.val_path", &spec.data().val_path()}}) {
    if (path->empty()) continue;  // a required field is validation's business
    if (absl::Status s = CheckDataset(field, *path); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(context, s.message()));
    }
  }
  const auto& init = spec.model().init_from();
  if (absl::Status s = CheckInitFrom("spec.", init.hf(), init.checkpoint()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(context, s.message()));
  }
  const auto& teacher = spec.training().distill().teacher();
  if (absl::Status s =
          CheckWeights("spec.training.distill.teacher", teacher.hf(), teacher.checkpoint());
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(context, s.message()));
  }
  return absl::OkStatus();
}

absl::Status DataRoots::CheckExperimentSpec(const tally::v1::ExperimentSpec& spec) const {
  if (!confining()) return absl::OkStatus();
  for (int i = 0; i < spec.variants_size(); ++i) {
    absl::StatusOr<tally::v1::JobSpec> resolved = ResolveVariant(spec, i);
    if (!resolved.ok()) continue;
    absl::Status s = CheckJobSpec(
        *resolved,
        absl::StrCat("variants[", i, "] (", EscapeUnprintable(spec.variants(i).name()), "): "));
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tally::api
