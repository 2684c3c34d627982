#include "worker/train/train_state.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::train {
namespace {

using ::testing::HasSubstr;

TEST(TrainStateTest, AdvancesAndRemembersEvaluationsAndCheckpointsByStep) {
  TrainState s;
  EXPECT_FALSE(s.evaluated_this_step());
  EXPECT_FALSE(s.checkpointed_this_step());
  s.last_eval_step = 0;
  EXPECT_TRUE(s.evaluated_this_step());
  s.AdvanceStep(1000, 24);
  s.AdvanceStep(990, 34);
  EXPECT_EQ(s.step, 2);
  EXPECT_EQ(s.tokens, 1990);
  EXPECT_EQ(s.padding_tokens, 58);
  EXPECT_FALSE(s.evaluated_this_step());
  s.last_checkpoint_step = 2;
  EXPECT_TRUE(s.checkpointed_this_step());
}

TEST(TrainStateTest, MetadataRoundTrips) {
  // Step 12, 12000 tokens, 300 of padding, evaluated at 12, checkpointed at 8.
  TrainState s{12, 12000, 300, 12, 8};
  const nlohmann::json meta = CheckpointMetadata(s, 11, {2, 345}, "layers=2 d_model=32");
  EXPECT_EQ(meta["optimizer_step"], 11);
  EXPECT_EQ(meta["fingerprint"], "layers=2 d_model=32");
  EXPECT_EQ(meta["evaluated"], true);
  // The bytes a checkpoint holds (keys sorted), which older checkpoints share.
  EXPECT_EQ(meta.dump(),
            "{\"cursor_epoch\":2,\"cursor_row\":345,\"evaluated\":true,"
            "\"fingerprint\":\"layers=2 d_model=32\",\"optimizer_step\":11,"
            "\"padding_tokens\":300,\"step\":12,\"tokens\":12000}");

  const TrainState back = ResumedState(meta);
  EXPECT_EQ(back.step, 12);
  EXPECT_EQ(back.tokens, 12000);
  EXPECT_EQ(back.padding_tokens, 300);
  EXPECT_EQ(back.last_checkpoint_step, 12);  // the checkpoint is of its step
  EXPECT_EQ(back.last_eval_step, 12);
  const data::DataCursor c = ResumedCursor(meta);
  EXPECT_EQ(c.epoch, 2);
  EXPECT_EQ(c.row, 345);

  s.last_eval_step = 8;  // a preemption skipped step 12's evaluation
  const TrainState unevaluated = ResumedState(CheckpointMetadata(s, 11, {2, 345}, "f"));
  EXPECT_EQ(unevaluated.last_eval_step, -1);
  EXPECT_FALSE(unevaluated.evaluated_this_step());
}

TEST(TrainStateTest, MetadataIntNamesTheFieldAndRejectsNonIntegers) {
  const nlohmann::json meta = nlohmann::json::parse(
      R"({"ok": 7, "neg": -3, "text": "7", "real": 7.5, "huge": 18446744073709551615})");
  EXPECT_EQ(*MetadataInt(meta, "ok"), 7);
  EXPECT_EQ(*MetadataInt(meta, "neg"), -3);
  for (const char* key : {"missing", "text", "real", "huge"}) {
    auto v = MetadataInt(meta, key);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(v.status().message(), HasSubstr(std::string("metadata field ") + key)) << key;
  }
  EXPECT_THAT(MetadataInt(meta, "huge").status().message(), HasSubstr("64-bit integer"));
}

}  // namespace
}  // namespace tally::train
