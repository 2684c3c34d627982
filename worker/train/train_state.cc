#include "worker/train/train_state.h"

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tally::train {

nlohmann::json CheckpointMetadata(const TrainState& state, int64_t optimizer_step,
                                  const data::DataCursor& cursor,
                                  const std::string& fingerprint) {
  return {{"step", state.step},
          {"tokens", state.tokens},
          {"padding_tokens", state.padding_tokens},
          {"optimizer_step", optimizer_step},
          {"cursor_epoch", cursor.epoch},
          {"cursor_row", cursor.row},
          {"fingerprint", fingerprint},
          // A resume that stops keeping its state need not evaluate this
          // step again.
          {"evaluated", state.evaluated_this_step()}};
}

absl::StatusOr<int64_t> MetadataInt(const nlohmann::json& meta, const std::string& key) {
  const auto it = meta.find(key);
  if (it == meta.end()) {
    return absl::InvalidArgumentError(absl::StrCat("metadata field ", key, " is missing"));
  }
  if (!it->is_number_integer() ||
      (it->is_number_unsigned() &&
       it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))) {
    return absl::InvalidArgumentError(absl::StrCat("metadata field ", key, " is ",
                                                   it->dump().substr(0, 40),
                                                   " (expected a 64-bit integer)"));
  }
  return it->get<int64_t>();
}

TrainState ResumedState(const nlohmann::json& meta) {
  TrainState s;
  s.step = meta["step"].get<int64_t>();
  s.tokens = meta["tokens"].get<int64_t>();
  s.padding_tokens = meta["padding_tokens"].get<int64_t>();
  s.last_checkpoint_step = s.step;
  if (meta.value("evaluated", false)) s.last_eval_step = s.step;
  return s;
}

data::DataCursor ResumedCursor(const nlohmann::json& meta) {
  return {meta["cursor_epoch"].get<int64_t>(), meta["cursor_row"].get<int64_t>()};
}

}  // namespace tally::train
