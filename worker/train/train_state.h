// TrainState: where a training run is, the part of a checkpoint that is
// neither tensors nor optimizer moments, internal to the trainer library.
//
// The step, the tokens trained, and which step was last evaluated and last
// checkpointed. The rest of the position lives with its owner: the data
// cursor in data::RowStream, the optimizer's step count in AdamW. No random
// number is drawn after initialisation (the data order is a pure function
// of the seed and the epoch), so there is no RNG state to keep.
//
// Checkpoint metadata is a JSON object holding step, tokens,
// padding_tokens, optimizer_step, cursor_epoch, cursor_row, fingerprint and
// evaluated (whether the checkpoint's step was evaluated: a resume makes up
// an evaluation a preemption skipped).
#ifndef TALLY_WORKER_TRAIN_TRAIN_STATE_H_
#define TALLY_WORKER_TRAIN_TRAIN_STATE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/data/batch.h"

namespace tally::train {

struct TrainState {
  int64_t step = 0;            // optimizer steps applied
  int64_t tokens = 0;          // real (document) tokens trained on
  int64_t padding_tokens = 0;  // padding computed
  int64_t last_eval_step = -1;        // -1: none yet
  int64_t last_checkpoint_step = -1;  // -1: none yet

  // After a step that trained `real` tokens and computed `padding`.
  void AdvanceStep(int64_t real, int64_t padding) {
    ++step;
    tokens += real;
    padding_tokens += padding;
  }
  bool evaluated_this_step() const { return last_eval_step == step; }
  bool checkpointed_this_step() const { return last_checkpoint_step == step; }
};

// The metadata of a checkpoint of `state` (at its step).
nlohmann::json CheckpointMetadata(const TrainState& state, int64_t optimizer_step,
                                  const data::DataCursor& cursor,
                                  const std::string& fingerprint);

// Metadata field `key` as a 64-bit integer; InvalidArgument naming it when
// it is missing or anything else.
absl::StatusOr<int64_t> MetadataInt(const nlohmann::json& meta, const std::string& key);

// The state a run resumes in from metadata its caller has checked already
// (every field present and in range): the checkpoint is of its step, and
// that step counts as evaluated when the checkpoint says so.
TrainState ResumedState(const nlohmann::json& meta);
// Likewise, the data cursor it resumes at.
data::DataCursor ResumedCursor(const nlohmann::json& meta);

}  // namespace tally::train

#endif  // TALLY_WORKER_TRAIN_TRAIN_STATE_H_
