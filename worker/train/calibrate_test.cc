// Timing calibration: every config is timed over every round, the order
// rotates, nothing is saved, a bad config fails naming itself, and a stop
// ends it at the next burst.
#include "worker/train/calibrate.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/test_fortunes.h"

namespace tally::train {
namespace {

class CalibrateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    char dir[] = "/tmp/tally_calibrate_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    data::WriteFortunes(dir_ + "/train", {"fortunes.u8"});
    data::WriteFortunes(dir_ + "/val", {"people.u8"});
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static TrainConfig Tiny(int d_model) {
    TrainConfig c;
    c.model.num_layers = 1;
    c.model.d_model = d_model;
    c.model.num_heads = 2;
    c.data.train_path = dir_ + "/train";
    c.data.seq_len = 64;
    c.micro_batch_rows = 2;
    c.max_steps = 1000;  // a burst trains its own few
    c.optimizer.lr = 1e-3;
    c.optimizer.warmup_steps = 100;
    c.eval_interval_steps = 10;  // ignored: a burst evaluates nothing
    c.seed = 7;
    return c;
  }
  static std::string dir_;
};
std::string CalibrateTest::dir_;

TEST_F(CalibrateTest, TimesEveryConfigOverEveryRoundAndSavesNothing) {
  TrainConfig small = Tiny(16), large = Tiny(64);
  small.checkpoint_dir = dir_ + "/never";  // a burst writes no checkpoint
  std::vector<int64_t> done;
  const CalibrationResult r = Calibrate({{"small", small}, {"large", large}}, /*rounds=*/2,
                                        /*steps=*/3, nullptr,
                                        [&](int64_t d, int64_t total, double loss) {
                                          EXPECT_EQ(total, 16);
                                          EXPECT_GT(loss, 0);
                                          done.push_back(d);
                                        });
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(r.times.size(), 2u);
  EXPECT_EQ(r.times[0].name, "small");
  EXPECT_EQ(r.times[1].name, "large");
  for (const CalibratedTime& t : r.times) {
    EXPECT_EQ(t.samples, 6) << t.name;  // 2 rounds x 3 timed steps
    EXPECT_GT(t.median_seconds, 0) << t.name;
    EXPECT_LE(t.p10_seconds, t.median_seconds) << t.name;
    EXPECT_GE(t.p90_seconds, t.median_seconds) << t.name;
  }
  EXPECT_EQ(done, (std::vector<int64_t>{4, 8, 12, 16}));
  EXPECT_EQ(r.steps_done, CalibrationSteps(2, 2, 3));
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/never"));
}

TEST_F(CalibrateTest, AFailingConfigIsNamed) {
  TrainConfig bad = Tiny(16);
  bad.data.train_path = dir_ + "/missing";
  const CalibrationResult r = Calibrate({{"good", Tiny(16)}, {"bad", bad}}, 1, 1, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("calibration of bad (round 1 of 1)"), std::string::npos) << r.reason;
  EXPECT_TRUE(r.times.empty());
}

TEST_F(CalibrateTest, AStopEndsItWithNothingKept) {
  StopFlag stop;
  stop.Request(StopKind::kPreempt);
  const CalibrationResult r = Calibrate({{"a", Tiny(16)}}, 3, 2, &stop);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kPreempted);
  EXPECT_TRUE(r.retryable);
  EXPECT_EQ(r.steps_done, 0);
  EXPECT_TRUE(r.times.empty());
}

TEST(SummarizeTimesTest, MedianAndNearestRankPercentiles) {
  CalibratedTime t;
  SummarizeTimes({5, 1, 4, 2, 3, 10, 6, 7, 8, 9}, &t);
  EXPECT_EQ(t.samples, 10);
  EXPECT_DOUBLE_EQ(t.median_seconds, 5.5);
  EXPECT_DOUBLE_EQ(t.p10_seconds, 1);
  EXPECT_DOUBLE_EQ(t.p90_seconds, 9);
}

TEST(CalibrateArgsTest, NothingToTimeIsRefused) {
  const CalibrationResult r = Calibrate({}, 1, 1, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("at least one config"), std::string::npos);
}

}  // namespace
}  // namespace tally::train
