#include "cli/tallyctl/job_format.h"

#include <limits>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tally::cli {
namespace {

using ::tally::v1::CostEstimate;
using ::tally::v1::Job;
using ::tally::v1::JobEvent;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// 2025-01-31 12:00:00 UTC.
constexpr int64_t kNoon = 1738324800;

Job BaseJob() {
  Job j;
  j.set_name("jobs/7");
  j.set_step(40);
  j.set_attempt(2);
  auto* spec = j.mutable_spec();
  spec->mutable_resources()->set_gpu_type("h200");
  spec->mutable_resources()->set_gpu_count(4);
  spec->set_priority(5);
  spec->set_max_attempts(3);
  spec->mutable_training()->set_max_steps(100);
  return j;
}

CostEstimate OnDemandEstimate() {
  CostEstimate e;
  e.set_flops_per_token(6e6);
  e.set_tokens(1000000);
  e.set_flops_per_second_per_gpu(1e12);
  e.set_throughput_source("configured");
  e.set_seconds(6);
  e.set_gpu_hours(0.5);
  e.set_usd_per_gpu_hour(4);
  e.set_cost_usd(2);
  return e;
}

TEST(JobFormatTest, ResourcesAndProgressUnchangedWithoutPreemptionSettings) {
  Job j = BaseJob();
  EXPECT_EQ(ResourcesLine(j.spec()), "  resources: 4 x h200, priority 5\n");
  EXPECT_EQ(ProgressLine(j), "  progress:  step 40 / 100, attempt 2 of 3\n");
  // "any" is the default tallyd fills in: nothing to say.
  j.mutable_spec()->mutable_resources()->set_capacity("any");
  EXPECT_EQ(ResourcesLine(j.spec()), "  resources: 4 x h200, priority 5\n");
}

TEST(JobFormatTest, ResourcesShowCapacityAndProgressShowsMaxPreemptions) {
  Job j = BaseJob();
  j.mutable_spec()->mutable_resources()->set_capacity("spot");
  EXPECT_EQ(ResourcesLine(j.spec()), "  resources: 4 x h200, priority 5, spot capacity\n");
  j.mutable_spec()->mutable_resources()->set_capacity("on_demand");
  EXPECT_EQ(ResourcesLine(j.spec()), "  resources: 4 x h200, priority 5, on-demand capacity\n");
  // A value from a newer tallyd is shown, escaped.
  j.mutable_spec()->mutable_resources()->set_capacity("reserved\x1b[2J");
  EXPECT_THAT(ResourcesLine(j.spec()), HasSubstr(", capacity reserved"));
  EXPECT_THAT(ResourcesLine(j.spec()), Not(HasSubstr("\x1b")));

  j.mutable_spec()->set_max_preemptions(1);
  EXPECT_EQ(ProgressLine(j), "  progress:  step 40 / 100, attempt 2 of 3, at most 1 preemption\n");
  j.mutable_spec()->set_max_preemptions(5);
  EXPECT_EQ(ProgressLine(j),
            "  progress:  step 40 / 100, attempt 2 of 3, at most 5 preemptions\n");
  // Preempted attempts are not counted against max_attempts.
  j.set_attempt(4);
  j.mutable_preemption()->set_count(3);
  EXPECT_EQ(ProgressLine(j),
            "  progress:  step 40 / 100, attempt 4 (1 of 3 counted, 3 preempted), at most 5 "
            "preemptions\n");
}

TEST(JobFormatTest, SpotUsageOnlyWhenTheJobRanOnSpot) {
  Job j = BaseJob();
  EXPECT_THAT(SpotUsageLine(j), IsEmpty());
  j.mutable_cost()->set_spot_gpu_seconds(123.45);
  EXPECT_EQ(SpotUsageLine(j), "  spot:      123.5 spot GPU-seconds in all\n");
  j.mutable_cost()->set_spot_gpus(2);
  EXPECT_EQ(SpotUsageLine(j),
            "  spot:      2 of 4 GPUs on spot capacity now, 123.5 spot GPU-seconds in all\n");
  // gpu_count 0 means 1.
  j.mutable_spec()->mutable_resources()->set_gpu_count(0);
  j.mutable_cost()->set_spot_gpus(1);
  EXPECT_THAT(SpotUsageLine(j), HasSubstr("1 of 1 GPU on spot capacity now"));
  // A NaN from a broken record is not "ran on spot".
  Job nan = BaseJob();
  nan.mutable_cost()->set_spot_gpu_seconds(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(SpotUsageLine(nan), IsEmpty());
}

TEST(JobFormatTest, NoPreemptionLinesForAJobNeverPreempted) {
  Job j = BaseJob();
  EXPECT_THAT(PreemptionLines(j, absl::UTCTimeZone()), IsEmpty());
  EXPECT_THAT(RedoneLine(j), IsEmpty());
}

TEST(JobFormatTest, PreemptionCountsAndRedoneDollars) {
  Job j = BaseJob();
  auto* p = j.mutable_preemption();
  p->set_count(3);
  p->set_by_notice(2);
  p->set_by_priority(1);
  p->add_preempted_by("jobs/9");
  j.mutable_cost()->set_redone_usd(0.01234);
  EXPECT_EQ(PreemptionLines(j, absl::UTCTimeZone()),
            "  preemptions: 3 (notice 2, priority 1), redone $0.0123\n"
            "  preempted by: jobs/9\n");
  EXPECT_EQ(RedoneLine(j),
            "  redone after preemptions: $0.0123 (3 preemptions: notice 2, priority 1)\n");
  p->set_count(1);
  p->set_by_notice(1);
  p->set_by_priority(0);
  EXPECT_THAT(RedoneLine(j), HasSubstr("(1 preemption: notice 1, priority 0)"));
}

TEST(JobFormatTest, AHeldJobSaysSoAndCountsTheExperimentsHolds) {
  Job j = BaseJob();
  j.set_hold("experiment experiments/4: successive halving holds packed at rung 1");
  EXPECT_EQ(PreemptionLines(j, absl::UTCTimeZone()),
            "  held: experiment experiments/4: successive halving holds packed at rung 1 "
            "(not placed until released)\n");
  j.mutable_preemption()->set_count(1);
  j.mutable_preemption()->set_by_experiment(1);
  EXPECT_THAT(PreemptionLines(j, absl::UTCTimeZone()),
              HasSubstr("  preemptions: 1 (notice 0, priority 0, experiment 1), redone $0.0000\n"));
}

TEST(JobFormatTest, ManyPreemptersAreCut) {
  Job j = BaseJob();
  auto* p = j.mutable_preemption();
  p->set_count(8);
  p->set_by_priority(8);
  for (int i = 1; i <= 8; ++i) p->add_preempted_by("jobs/" + std::to_string(100 + i));
  EXPECT_THAT(PreemptionLines(j, absl::UTCTimeZone()),
              HasSubstr("  preempted by: jobs/101, jobs/102, jobs/103, jobs/104, jobs/105 and 3 "
                        "more\n"));
}

TEST(JobFormatTest, PendingPreemptionNamesTheJobReasonAndDeadline) {
  Job j = BaseJob();
  auto* p = j.mutable_preemption();
  p->set_pending_for("jobs/12");
  p->set_pending_reason("priority 50 > 5, needs 4 h200 slots");
  p->mutable_pending_deadline()->set_seconds(kNoon + 25);
  EXPECT_EQ(PreemptionLines(j, absl::UTCTimeZone()),
            "  preemptions: 0 (notice 0, priority 0), redone $0.0000\n"
            "  preempting for jobs/12: priority 50 > 5, needs 4 h200 slots (deadline "
            "2025-01-31 12:00:25; waiting for the workers' checkpoint)\n");
  // No reason, no deadline; hostile text escaped.
  p->clear_pending_reason();
  p->clear_pending_deadline();
  p->set_pending_for("jobs/12\n\x1b[31m");
  const std::string text = PreemptionLines(j, absl::UTCTimeZone());
  EXPECT_THAT(text, HasSubstr("  preempting for jobs/12"));
  EXPECT_THAT(text, HasSubstr(" (waiting for the workers' checkpoint)\n"));
  EXPECT_THAT(text, Not(HasSubstr("\x1b")));
  EXPECT_THAT(text, Not(HasSubstr("jobs/12\n")));
}

TEST(JobFormatTest, EstimateWithoutSpotPriceIsOneLine) {
  EXPECT_EQ(EstimateText(OnDemandEstimate()),
            "$2.0000: 6e+06 training FLOPs/token x 1000000 tokens at 1e+12 FLOP/s per GPU "
            "(configured) = 6.0 s, 0.5000 GPU-hours at $4.0000/GPU-hour\n");
}

TEST(JobFormatTest, EstimateShowsSpotAndItsSaving) {
  CostEstimate e = OnDemandEstimate();
  e.set_spot_usd_per_gpu_hour(1.5);
  e.set_preemptions_per_gpu_hour(0.8);
  e.set_preemption_rate_source("observed over 40 spot GPU-hours");
  e.set_spot_expected_preemptions(0.4);
  e.set_spot_redone_usd(0.1);
  e.set_spot_cost_usd(0.8);
  e.set_spot_savings_usd(1.2);
  const std::string text = EstimateText(e);
  EXPECT_THAT(text, HasSubstr("\nspot:      $0.8000 at $1.5000/GPU-hour, 0.40 preemptions "
                              "expected (0.8 per GPU-hour, observed over 40 spot GPU-hours) "
                              "redoing $0.1000\n"));
  EXPECT_THAT(text, HasSubstr("\n           spot saves $1.2000 (60%) over on-demand, net of "
                              "the redone work\n"));
  // In `tallyctl cost`, below "  estimate:  ".
  const std::string indented = EstimateText(e, "  ");
  EXPECT_THAT(indented, HasSubstr("\n  spot:      $0.8000"));
  EXPECT_THAT(indented, HasSubstr("\n             spot saves"));
}

TEST(JobFormatTest, EstimateSaysWhenSpotCostsMore) {
  CostEstimate e = OnDemandEstimate();
  e.set_spot_usd_per_gpu_hour(3.9);
  e.set_preemptions_per_gpu_hour(20);
  e.set_spot_expected_preemptions(10);
  e.set_spot_redone_usd(0.5);
  e.set_spot_cost_usd(2.45);
  e.set_spot_savings_usd(-0.45);
  const std::string text = EstimateText(e);
  EXPECT_THAT(text, HasSubstr("10.00 preemptions expected (20 per GPU-hour) redoing $0.5000\n"));
  EXPECT_THAT(text, HasSubstr("spot costs $0.4500 (22%) more than on-demand"));
  EXPECT_THAT(text, Not(HasSubstr("saves")));
  e.set_spot_savings_usd(0);
  EXPECT_THAT(EstimateText(e), HasSubstr("spot costs the same as on-demand"));
  e.set_spot_savings_usd(std::numeric_limits<double>::quiet_NaN());
  EXPECT_THAT(EstimateText(e), HasSubstr("spot's saving over on-demand is unknown"));
}

JobEvent Event(int64_t sequence, const std::string& type) {
  JobEvent e;
  e.set_job("jobs/7");
  e.set_sequence(sequence);
  e.set_type(type);
  e.mutable_time()->set_seconds(kNoon);
  e.set_state(tally::v1::JOB_STATE_RUNNING);
  e.set_patience_left(-1);
  return e;
}

TEST(JobFormatTest, EventLinesOfTheNewTypes) {
  JobEvent preempting = Event(10, "preempting");
  preempting.set_step(40);
  preempting.set_reason("for jobs/12 (priority 50)");
  EXPECT_EQ(EventLine(preempting, absl::UTCTimeZone(), 0),
            "#10   2025-01-31 12:00:00 preempting RUNNING   step 40      for jobs/12 (priority 50)");
  JobEvent notice = Event(11, "notice");
  notice.set_step(41);
  notice.set_reason("worker w-3: notice_file");
  EXPECT_EQ(EventLine(notice, absl::UTCTimeZone(), 0),
            "#11   2025-01-31 12:00:00 notice     RUNNING   step 41      worker w-3: notice_file");
  JobEvent preempted = Event(12, "preempted");
  preempted.set_state(tally::v1::JOB_STATE_QUEUED);
  preempted.set_step(41);
  preempted.set_cost_usd(0.25);
  preempted.set_reason(
      "attempt 2 preempted (notice_file): worker w-3 reclaimed; requeued, resuming from step 40");
  preempted.set_detail("$0.0020 redone: steps 41-41 after the checkpoint at step 40");
  EXPECT_EQ(EventLine(preempted, absl::UTCTimeZone(), 1),
            "#12   2025-01-31 12:00:00 preempted  QUEUED    step 41      $0.2500 preemptions 1 "
            "attempt 2 preempted (notice_file): worker w-3 reclaimed; requeued, resuming from "
            "step 40 ($0.0020 redone: steps 41-41 after the checkpoint at step 40)");
}

TEST(JobFormatTest, EventLinesWithoutPreemptionsAreUnchanged) {
  JobEvent progress = Event(5, "progress");
  progress.set_step(20);
  progress.set_train_loss(2.5);
  progress.set_cost_usd(0.01);
  progress.set_patience_left(3);
  progress.set_principal("alice");
  EXPECT_EQ(EventLine(progress, absl::UTCTimeZone(), 0),
            "#5    2025-01-31 12:00:00 progress   RUNNING   step 20      loss 2.5000 $0.0100 "
            "patience 3 by alice");
  EXPECT_EQ(EventLine(progress, absl::UTCTimeZone(), 2),
            "#5    2025-01-31 12:00:00 progress   RUNNING   step 20      loss 2.5000 $0.0100 "
            "patience 3 preemptions 2 by alice");
  // Only progress and preempted events carry the count.
  JobEvent eval = Event(6, "eval");
  eval.set_val_loss(2.25);
  EXPECT_THAT(EventLine(eval, absl::UTCTimeZone(), 2), Not(HasSubstr("preemptions")));
}

// The quantized loss follows val_loss only when the event has one, named
// by the job's format.
TEST(JobFormatTest, EventLinesShowTheQuantizedLossBesideValLoss) {
  JobEvent eval = Event(6, "eval");
  eval.set_step(50);
  eval.set_val_loss(2.31);
  eval.set_quantized_val_loss(2.38);
  EXPECT_EQ(EventLine(eval, absl::UTCTimeZone(), 0, "q4_0"),
            "#6    2025-01-31 12:00:00 eval       RUNNING   step 50      val_loss 2.3100 "
            "(q4_0: 2.3800)");
  EXPECT_THAT(EventLine(eval, absl::UTCTimeZone(), 0), HasSubstr("(quantized: 2.3800)"));
  eval.clear_quantized_val_loss();
  EXPECT_EQ(EventLine(eval, absl::UTCTimeZone(), 0, "q4_0"),
            "#6    2025-01-31 12:00:00 eval       RUNNING   step 50      val_loss 2.3100");
}

TEST(JobFormatTest, LossLinesNameTheMetricAndShowTheQuantizedLoss) {
  tally::v1::Job j;
  j.set_val_loss(2.31);
  j.mutable_early_stopping()->set_has_best(true);
  j.mutable_early_stopping()->set_best_val_loss(2.3);
  j.mutable_early_stopping()->set_best_step(40);
  EXPECT_EQ(LossLines(j), "  val loss:  latest 2.3100, best 2.3000 at step 40\n");
  j.mutable_spec()->mutable_training()->set_eval_quantized("q4_0");
  j.mutable_spec()->mutable_early_stopping()->set_metric("quantized_val_loss");
  j.mutable_spec()->mutable_early_stopping()->set_patience(3);
  j.mutable_early_stopping()->set_best_val_loss(2.35);
  j.mutable_early_stopping()->set_patience_left(2);
  j.set_quantized_val_loss(2.38);
  j.set_target_val_loss(2.45);
  auto* t = j.mutable_target_reached();
  t->set_step(60);
  t->set_val_loss(2.3);
  t->set_quantized_val_loss(2.44);
  t->set_cost_usd(0.5);
  EXPECT_EQ(LossLines(j),
            "  val loss:  latest 2.3100 (q4_0: 2.3800), best quantized_val_loss 2.3500 at step "
            "40, patience left 2 of 3\n"
            "  target:    quantized_val_loss 2.4500, reached at step 60 (val 2.3000 (q4_0: "
            "2.4400), $0.5000); to the target itself $0.0000, 0 tokens, 0.0 GPU-seconds\n");
  EXPECT_EQ(LossLines(tally::v1::Job()), "") << "nothing before an evaluation";
}

TEST(JobFormatTest, TheVariantTableShowsTheQuantizedLoss) {
  tally::v1::Experiment e;
  e.mutable_spec()->mutable_target()->set_metric("quantized_val_loss");
  auto* v = e.add_variants();
  v->set_name("qat");
  v->set_job("jobs/1");
  v->set_state(tally::v1::JOB_STATE_SUCCEEDED);
  v->set_val_loss(2.31);
  v->set_best_val_loss(2.2);
  v->set_quantized_val_loss(2.38);
  v->set_best_quantized_val_loss(2.36);
  const std::string t = VariantTable(e);
  EXPECT_THAT(t, HasSubstr("VAL_LOSS (QUANT)  BEST QUANT"));
  EXPECT_THAT(t, HasSubstr("2.3100 (2.3800)   2.3600"));
  EXPECT_THAT(t, Not(HasSubstr("2.2000"))) << "the best of the metric judged";
  e.mutable_spec()->mutable_target()->clear_metric();
  e.mutable_variants(0)->clear_quantized_val_loss();
  EXPECT_THAT(VariantTable(e), HasSubstr("VAL_LOSS BEST "));
}

TEST(JobFormatTest, ProgressBar) {
  JobEvent e = Event(5, "progress");
  e.set_step(50);
  e.set_train_loss(2.5);
  e.set_cost_usd(0.01);
  EXPECT_EQ(ProgressBar(e, 100, 0),
            "[###############...............] step 50/100  loss 2.5000  $0.0100");
  e.set_patience_left(3);
  EXPECT_EQ(ProgressBar(e, 100, 2),
            "[###############...............] step 50/100  loss 2.5000  $0.0100  patience 3  "
            "preemptions 2");
  // Hostile steps draw a bar, not a crash.
  e.set_step(-5);
  EXPECT_THAT(ProgressBar(e, 100, 0), HasSubstr("[..............................] step -5/100"));
  e.set_step(500);
  EXPECT_THAT(ProgressBar(e, 100, 0), HasSubstr("[##############################] step 500/100"));
  EXPECT_THAT(ProgressBar(e, 0, 0), HasSubstr("[..............................] step 500/0"));
}

TEST(JobFormatTest, TallyFromTheStartCountsEveryPreemptedEvent) {
  PreemptionTally t(/*known=*/2, /*known_through=*/30, /*after=*/0);
  EXPECT_EQ(t.count(), 0);
  t.Observe(Event(3, "progress"));
  t.Observe(Event(4, "preempted"));
  EXPECT_EQ(t.count(), 1);
  t.Observe(Event(9, "notice"));
  t.Observe(Event(10, "preempted"));
  EXPECT_EQ(t.count(), 2);
  t.Observe(Event(31, "preempted"));
  EXPECT_EQ(t.count(), 3);
}

TEST(JobFormatTest, TallyAfterASequenceStartsFromTheKnownCount) {
  PreemptionTally t(/*known=*/2, /*known_through=*/30, /*after=*/20);
  EXPECT_EQ(t.count(), 2);
  // Replayed events up to the job as read are in `known` already.
  t.Observe(Event(25, "preempted"));
  EXPECT_EQ(t.count(), 2);
  t.Observe(Event(31, "preempting"));
  EXPECT_EQ(t.count(), 2);
  t.Observe(Event(33, "preempted"));
  EXPECT_EQ(t.count(), 3);
}

TEST(JobFormatTest, FormatTimestamp) {
  google::protobuf::Timestamp t;
  EXPECT_EQ(FormatTimestamp(t, absl::UTCTimeZone()), "-");
  t.set_seconds(kNoon);
  EXPECT_EQ(FormatTimestamp(t, absl::UTCTimeZone()), "2025-01-31 12:00:00");
}

TEST(JobFormatTest, TheVariantTableShowsBothFiguresAndSaysWhy) {
  tally::v1::Experiment e;
  e.set_reference_variant("naive");
  auto* naive = e.add_variants();
  naive->set_name("naive");
  naive->set_job("jobs/1");
  naive->set_state(tally::v1::JOB_STATE_SUCCEEDED);
  naive->set_step(1000);
  naive->set_val_loss(2.1311);
  naive->set_best_val_loss(2.1311);
  naive->set_reached_target(true);
  naive->set_steps_to_target(1000);
  naive->set_tokens_to_target(1.08e6);
  naive->set_recipe_cost_to_target_usd(0.000572);
  naive->set_recipe_cost_low_usd(0.000549);
  naive->set_recipe_cost_high_usd(0.000594);
  naive->set_recipe_ratio_to_reference(1);
  naive->set_cost_to_target_usd(0.000803);
  naive->set_ratio_to_reference(1);
  naive->set_cost_usd(0.000803);
  naive->set_step_time_varied(true);
  naive->set_step_seconds_spread(1.04);
  auto* held = e.add_variants();
  held->set_name("packed");
  held->set_job("jobs/2");
  held->set_state(tally::v1::JOB_STATE_QUEUED);
  held->set_held_at_rung(1);
  auto* failed = e.add_variants();
  failed->set_name("broken");
  failed->set_job("jobs/3");
  failed->set_state(tally::v1::JOB_STATE_FAILED);
  failed->set_note("failed: data.train_path: no such file");
  const std::string t = VariantTable(e);
  EXPECT_THAT(t, HasSubstr("STEPS TO T TOKENS TO T RECIPE $ TO T (P10-P90)"));
  EXPECT_THAT(t, HasSubstr("1000.0     1.08M       $0.000572 (0.000549-0.000594) 1.00x   "
                           "$0.000803     1.00x"));
  EXPECT_THAT(t, HasSubstr("reference; step time varied 104% (p10-p90): recipe cost less "
                           "certain; billed 1.40x its recipe cost"));
  EXPECT_THAT(t, HasSubstr("held at rung 1"));
  EXPECT_THAT(t, HasSubstr("FAILED"));
  EXPECT_THAT(t, HasSubstr("failed: data.train_path: no such file"));
  EXPECT_THAT(t, HasSubstr("recipe $: steps to the target"));
}

TEST(JobFormatTest, WithReplicatesEachRunIsNamedAndEachVariantSummarised) {
  tally::v1::Experiment e;
  e.mutable_spec()->set_replicates(3);
  e.set_reference_variant("naive");
  for (int r = 1; r <= 3; ++r) {
    auto* v = e.add_variants();
    v->set_name("packed");
    v->set_replicate(r);
  }
  auto* naive = e.add_summaries();
  naive->set_name("naive");
  naive->set_replicates(3);
  naive->set_verdict("reference");
  auto* s = e.add_summaries();
  s->set_name("packed");
  s->set_replicates(3);
  s->set_reached_target(3);
  s->set_steps_to_target(61.5);
  s->set_steps_ci90_low(50.25);
  s->set_steps_ci90_high(72.75);
  s->set_tokens_to_target(1.2e6);
  s->set_tokens_ci90_low(1.0e6);
  s->set_tokens_ci90_high(1.4e6);
  s->set_recipe_cost_to_target_usd(0.0615);
  s->set_recipe_cost_ci90_low_usd(0.0502);
  s->set_recipe_cost_ci90_high_usd(0.0728);
  s->set_recipe_ratio_to_reference(0.61);
  s->set_recipe_ratio_ci90_low(0.55);
  s->set_recipe_ratio_ci90_high(0.68);
  s->set_ratio_pairs(3);
  s->set_verdict("cheaper");
  const std::string t = VariantTable(e);
  EXPECT_THAT(t, HasSubstr("packed#2"));
  EXPECT_THAT(t, HasSubstr("over 3 replicates (mean and 90% interval)"));
  EXPECT_THAT(t, HasSubstr("3/3     61.5 (50.2-72.8)"));
  EXPECT_THAT(t, HasSubstr("$0.0615 ($0.0502-$0.0728)"));
  EXPECT_THAT(t, HasSubstr("0.61x (0.55x-0.68x)"));
  EXPECT_THAT(t, HasSubstr("cheaper"));
  EXPECT_THAT(t, HasSubstr("reference"));
}

TEST(JobFormatTest, ModelOriginNamesTheUpcycledSourceAndTheTeacher) {
  tally::v1::JobSpec spec;
  EXPECT_THAT(ModelOriginLines(spec), IsEmpty());
  spec.mutable_model()->mutable_init_from()->set_checkpoint("/ckpt/dense.ckpt");
  EXPECT_EQ(ModelOriginLines(spec), "  from:      weights of /ckpt/dense.ckpt\n");
  spec.mutable_model()->mutable_init_from()->mutable_upcycle()->set_noise_std(0.01);
  EXPECT_EQ(ModelOriginLines(spec), "  from:      upcycled from /ckpt/dense.ckpt (noise_std 0.01)\n");
  auto* d = spec.mutable_training()->mutable_distill();
  d->mutable_teacher()->set_hf("/models/teacher\x1b[2J");
  d->set_alpha(0.5);
  d->set_temperature(2);
  EXPECT_THAT(ModelOriginLines(spec),
              HasSubstr("  teacher:   /models/teacher\\x1b[2J, alpha 0.5, temperature 2\n"));
}

}  // namespace
}  // namespace tally::cli

namespace tally::cli {
namespace {

TEST(TimingLineTest, SaysHowTheVariantsWereTimed) {
  tally::v1::Experiment e;
  EXPECT_NE(TimingLine(e).find("timing.calibrate: false"), std::string::npos) << TimingLine(e);
  e.mutable_calibration()->set_enabled(true);
  e.mutable_calibration()->set_job("jobs/9");
  e.mutable_calibration()->set_state(tally::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(TimingLine(e), "calibration jobs/9 RUNNING; until it ends, each variant's own step times");
  auto* t = e.mutable_calibration()->add_times();
  t->set_name("naive");
  t->set_median_seconds(0.0123);
  e.mutable_calibration()->set_cost_usd(0.5);
  e.mutable_calibration()->set_state(tally::v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(TimingLine(e), "calibrated by jobs/9 ($0.5000): naive 0.0123s a step");
  e.mutable_calibration()->clear_times();
  e.mutable_calibration()->set_state(tally::v1::JOB_STATE_FAILED);
  e.mutable_calibration()->set_state_reason("boom");
  EXPECT_EQ(TimingLine(e), "calibration jobs/9 FAILED (boom); each variant's own step times");
}

}  // namespace
}  // namespace tally::cli
