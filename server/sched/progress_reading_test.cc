// ReadProgress on its own: what a report measures against the job, and the
// routing collapse it reads.
#include "server/sched/progress_reading.h"

#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/policy/step_times.h"

namespace tally::sched {
namespace {

tally::v1::Progress Report(int32_t attempt, int64_t step, bool trained = true) {
  tally::v1::Progress p;
  p.set_attempt(attempt);
  p.set_step(step);
  p.set_tokens(step * 100);
  p.set_trained(trained);
  p.set_train_loss(2.5);
  p.set_padding_tokens(7);
  p.set_step_seconds(0.25);
  return p;
}

ActiveJob Job(int32_t progress_attempt, int64_t progress_step, int reports) {
  ActiveJob job;
  job.rec.mutable_job()->mutable_spec()->mutable_model()->mutable_moe()->set_top_k(2);
  job.progress_attempt = progress_attempt;
  job.progress_step = progress_step;
  job.progress_reports = reports;
  return job;
}

TEST(ProgressReadingTest, AStepTimeCountsOnlyPastTheAttemptsStartUp) {
  struct Case {
    int32_t attempt;
    int64_t step;
    int reports;
    bool counted;
  };
  const int warm = policy::kStartupReports;
  const std::vector<Case> cases = {
      {1, 11, warm, true},       // a new step, past start-up
      {1, 11, warm - 1, false},  // still starting up
      {1, 10, warm, false},      // the same step again
      {2, 11, warm, false},      // another attempt: its own start-up
  };
  for (const Case& c : cases) {
    ActiveJob job = Job(1, 10, c.reports);
    ProgressReading r = ReadProgress(job, Report(c.attempt, c.step));
    EXPECT_EQ(r.step_seconds.has_value(), c.counted)
        << "attempt " << c.attempt << " step " << c.step << " reports " << c.reports;
    ApplyProgressReading(r, job);
    EXPECT_EQ(job.rec.job().step(), c.step);
    EXPECT_EQ(job.rec.job().step_times().seconds_size(), c.counted ? 1 : 0);
  }
}

TEST(ProgressReadingTest, AnUntrainedReportMovesOnlyStepAndTokens) {
  ActiveJob job = Job(1, 10, 5);
  ProgressReading r = ReadProgress(job, Report(1, 11, /*trained=*/false));
  EXPECT_FALSE(r.train_loss.has_value());
  EXPECT_FALSE(r.step_seconds.has_value());
  ApplyProgressReading(r, job);
  EXPECT_EQ(job.rec.job().tokens(), 1100);
  EXPECT_EQ(job.rec.job().train_loss(), 0);
}

TEST(ProgressReadingTest, RoutingCollapseIsReadFromTheLoadsAndClearedByHealthyOnes) {
  ActiveJob job = Job(1, 10, 5);
  tally::v1::Progress collapsed = Report(1, 11);
  tally::v1::MoeLayerLoad* l = collapsed.add_moe();
  l->set_layer(3);
  for (int64_t t : {1000, 0, 0, 0}) l->add_tokens_per_expert(t);  // top-2 of 4: all on one
  ProgressReading r = ReadProgress(job, collapsed);
  ASSERT_EQ(r.moe.size(), 1u);
  EXPECT_TRUE(r.routing_collapsed);
  EXPECT_TRUE(absl::StrContains(r.collapse_where, "layer 3")) << r.collapse_where;
  ApplyProgressReading(r, job);
  EXPECT_TRUE(job.routing_collapsed);

  // A report without loads leaves the reading as it was; a healthy one clears it.
  ApplyProgressReading(ReadProgress(job, Report(1, 12)), job);
  EXPECT_TRUE(job.routing_collapsed);
  tally::v1::Progress healthy = Report(1, 13);
  tally::v1::MoeLayerLoad* h = healthy.add_moe();
  h->set_layer(3);
  for (int64_t t : {250, 250, 250, 250}) h->add_tokens_per_expert(t);
  ApplyProgressReading(ReadProgress(job, healthy), job);
  EXPECT_FALSE(job.routing_collapsed);
  EXPECT_EQ(job.collapse_where, "");
}

tally::v1::TrainPoint Point(int64_t step, double loss, int32_t attempt = 1) {
  tally::v1::TrainPoint p;
  p.set_step(step);
  p.set_tokens(step * 100);
  p.set_train_loss(loss);
  p.set_attempt(attempt);
  return p;
}

std::vector<int64_t> Steps(const tally::v1::Job& job) {
  std::vector<int64_t> out;
  for (const auto& p : job.train_curve()) out.push_back(p.step());
  return out;
}

TEST(TrainCurveTest, ATrainedReportAddsItsStepAndLoss) {
  ActiveJob job = Job(1, -1, 0);
  ApplyProgressReading(ReadProgress(job, Report(1, 10)), job);
  ApplyProgressReading(ReadProgress(job, Report(1, 20, /*trained=*/false)), job);
  ASSERT_EQ(job.rec.job().train_curve_size(), 1);
  const tally::v1::TrainPoint& p = job.rec.job().train_curve(0);
  EXPECT_EQ(p.step(), 10);
  EXPECT_EQ(p.tokens(), 1000);
  EXPECT_EQ(p.train_loss(), 2.5);
  EXPECT_EQ(p.attempt(), 1);
}

TEST(TrainCurveTest, AResumedAttemptReplacesTheStepsItRedoes) {
  tally::v1::Job job;
  for (int64_t s : {1, 2, 3, 4, 5}) AddTrainPoint(Point(s, 3.0), job);
  AddTrainPoint(Point(3, 2.0, 2), job);  // resumed from step 2's checkpoint
  EXPECT_EQ(Steps(job), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(job.train_curve(2).attempt(), 2);
  EXPECT_EQ(job.train_curve(2).train_loss(), 2.0);
}

TEST(TrainCurveTest, AFullCurveKeepsAnEvenSampleWithinItsBound) {
  tally::v1::Job job;
  for (int64_t s = 1; s <= 9; ++s) AddTrainPoint(Point(s, 3.0), job, /*max_points=*/8);
  EXPECT_EQ(Steps(job), (std::vector<int64_t>{1, 3, 5, 7, 9}));
  EXPECT_EQ(job.train_curve_every(), 2);
  for (int64_t s = 10; s <= 1000; ++s) AddTrainPoint(Point(s, 3.0), job, 8);
  EXPECT_LE(job.train_curve_size(), 8);
  EXPECT_EQ(job.train_curve(0).step(), 1);
  EXPECT_GE(job.train_curve(job.train_curve_size() - 1).step(), 1000 - job.train_curve_every());
  const std::vector<int64_t> steps = Steps(job);
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_GE(steps[i] - steps[i - 1], job.train_curve_every() / 2) << i;
  }
}

}  // namespace
}  // namespace tally::sched
