// The manager on a real scheduler and store: variants become labelled jobs,
// the reference's final loss reaches the other variants as a target in
// force, a failed commit acts on nothing, and a restart carries on.
#include "server/experiments/manager.h"

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/sched/scheduler_test_util.h"
#include "tests/support/store/fault_injection_job_store.h"
#include "server/store/memory_job_store.h"

namespace tally::experiments {
namespace {

using ::testing::HasSubstr;
using tally::v1::Experiment;

class ManagerTest : public ::testing::Test {
 protected:
  ManagerTest() : store_(&base_) {
    options_.prices.usd_per_gpu_hour["cpu"] = 3.6;  // $0.001 per GPU-second
    Restart();
  }
  void Restart() {
    registries_.push_back(std::make_unique<metrics::Registry>());
    manager_.reset();
    sched_ = std::make_unique<sched::Scheduler>(&store_, &channel_, &clock_,
                                                registries_.back().get(), options_);
    ASSERT_TRUE(sched_->Recover().ok());
    manager_ = std::make_unique<ExperimentManager>(&store_, sched_.get(), &clock_,
                                                   registries_.back().get());
    ASSERT_TRUE(manager_->Recover().ok());
  }
  // Without a timing calibration unless `calibrate`: these fake workers
  // answer the variants' jobs only, unless a test answers the calibration.
  static tally::v1::ExperimentSpec Spec(int variants = 3, bool calibrate = false) {
    tally::v1::ExperimentSpec s;
    s.mutable_timing()->set_calibrate(calibrate);
    s.set_display_name("ab");
    *s.mutable_base() = sched::TinySpec();
    const char* names[] = {"naive", "packed", "moe", "d"};
    for (int i = 0; i < variants; ++i) s.add_variants()->set_name(names[i]);
    s.mutable_target()->set_from_variant("naive");
    return s;
  }
  void Hello(const std::string& w, int slots) {
    tally::v1::Hello h;
    h.set_worker_id(w);
    h.set_gpu_type("cpu");
    h.set_slots(slots);
    ASSERT_TRUE(sched_->OnHello(h).ok());
  }
  tally::v1::Job Job(const std::string& name) {
    return base_.GetJob(std::stoll(name.substr(5)))->job();
  }
  absl::Status Eval(const std::string& w, const std::string& job, int64_t step, double loss) {
    tally::v1::WorkerMessage m;
    m.mutable_eval()->set_job(job);
    m.mutable_eval()->set_attempt(Job(job).attempt());
    m.mutable_eval()->set_step(step);
    m.mutable_eval()->set_tokens(step * 100);
    m.mutable_eval()->set_val_loss(loss);
    return sched_->OnMessage(w, m);
  }
  absl::Status Exit(const std::string& w, const std::string& job,
                    tally::v1::AttemptOutcome outcome) {
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job(job);
    m.mutable_exit()->set_attempt(Job(job).attempt());
    m.mutable_exit()->set_outcome(outcome);
    return sched_->OnMessage(w, m);
  }
  // A calibration job's successful exit with `seconds[i]` for its i-th
  // spec.
  absl::Status CalibrationExit(const std::string& w, const std::string& job,
                               const std::vector<double>& seconds) {
    const tally::v1::Job j = Job(job);
    tally::v1::WorkerMessage m;
    m.mutable_exit()->set_job(job);
    m.mutable_exit()->set_attempt(j.attempt());
    m.mutable_exit()->set_outcome(tally::v1::ATTEMPT_OUTCOME_SUCCEEDED);
    for (int i = 0; i < j.spec().calibration().variants_size(); ++i) {
      tally::v1::CalibratedStepTime* t = m.mutable_exit()->add_calibration();
      t->set_name(j.spec().calibration().variants(i).name());
      t->set_median_seconds(seconds.at(i));
      t->set_p10_seconds(seconds.at(i) * 0.9);
      t->set_p90_seconds(seconds.at(i) * 1.1);
      t->set_samples(15);
    }
    return sched_->OnMessage(w, m);
  }
  absl::Status Progress(const std::string& w, const std::string& job, int64_t step,
                        double seconds) {
    tally::v1::WorkerMessage m;
    m.mutable_progress()->set_job(job);
    m.mutable_progress()->set_attempt(Job(job).attempt());
    m.mutable_progress()->set_step(step);
    m.mutable_progress()->set_tokens(step * 100);
    m.mutable_progress()->set_trained(true);
    m.mutable_progress()->set_step_seconds(seconds);
    return sched_->OnMessage(w, m);
  }
  std::vector<store::JobRecord> AllJobs() {
    store::JobQuery q;
    q.limit = 100;
    return *base_.ListJobs(q);
  }

  FakeClock clock_;
  store::InMemoryJobStore base_;
  store::FaultInjectionJobStore store_;
  sched::RecordingChannel channel_;
  sched::SchedulerOptions options_;
  std::vector<std::unique_ptr<metrics::Registry>> registries_;
  std::unique_ptr<sched::Scheduler> sched_;
  std::unique_ptr<ExperimentManager> manager_;
};

TEST_F(ManagerTest, CreateSubmitsLabelledJobsAndIsIdempotent) {
  absl::StatusOr<Experiment> e = manager_->Create(Spec(), "req-1");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->name(), "experiments/1");
  EXPECT_EQ(e->reference_variant(), "naive");
  ASSERT_EQ(e->variants_size(), 3);
  for (const auto& v : e->variants()) {
    ASSERT_FALSE(v.job().empty()) << v.name();
    const tally::v1::Job job = Job(v.job());
    EXPECT_EQ(job.spec().labels().at("experiment"), "experiments/1");
    EXPECT_EQ(job.spec().labels().at("variant"), v.name());
    EXPECT_EQ(job.spec().display_name(), "ab/" + v.name());
    EXPECT_EQ(v.state(), tally::v1::JOB_STATE_QUEUED);
  }
  absl::StatusOr<Experiment> again = manager_->Create(Spec(), "req-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->name(), "experiments/1");
  EXPECT_EQ(AllJobs().size(), 3u) << "a retried create submits nothing more";
  auto other = Spec();
  other.set_display_name("changed");
  EXPECT_TRUE(absl::IsAlreadyExists(manager_->Create(other, "req-1").status()));
}

TEST_F(ManagerTest, InvalidVariantsNameTheVariantAndField) {
  auto spec = Spec();
  spec.mutable_target()->set_from_variant("nope");
  auto e = manager_->Create(spec, "");
  EXPECT_TRUE(absl::IsInvalidArgument(e.status()));
  EXPECT_THAT(e.status().message(), HasSubstr("target.from_variant"));
  spec = Spec();
  (*spec.mutable_base()->mutable_labels())["experiment"] = "mine";
  for (int i = 0; i < 64; ++i) {
    (*spec.mutable_base()->mutable_labels())["l" + std::to_string(i)] = "x";
  }
  e = manager_->Create(spec, "");
  EXPECT_TRUE(absl::IsInvalidArgument(e.status()));
  EXPECT_THAT(e.status().message(), HasSubstr("variants[0] (naive): spec.labels"));
  EXPECT_TRUE(AllJobs().empty());
}

TEST_F(ManagerTest, TheReferencesFinalLossBecomesTheOthersTargetAndTheyStopAtIt) {
  auto e = manager_->Create(Spec(2), "");
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string naive = e->variants(0).job(), packed = e->variants(1).job();
  Hello("w", 2);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(naive).state(), tally::v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Job(packed).state(), tally::v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(Eval("w", packed, 100, 3.0).ok());
  ASSERT_TRUE(Eval("w", packed, 200, 2.0).ok());
  ASSERT_TRUE(Eval("w", naive, 100, 3.5).ok());
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(Eval("w", naive, 1000, 2.5).ok());
  ASSERT_TRUE(Exit("w", naive, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  // packed already went below 2.5: it stops now, keeping its state.
  const tally::v1::Job p = Job(packed);
  EXPECT_DOUBLE_EQ(p.target_val_loss(), 2.5);
  EXPECT_TRUE(p.has_target_reached());
  EXPECT_EQ(p.pending_stop().state(), tally::v1::JOB_STATE_SUCCEEDED);
  auto got = manager_->Get(1);
  ASSERT_TRUE(got.ok());
  EXPECT_DOUBLE_EQ(got->target_val_loss(), 2.5);
  EXPECT_TRUE(got->variants(1).reached_target());
  EXPECT_GT(got->variants(1).ratio_to_reference(), 0);
  EXPECT_LT(got->variants(1).ratio_to_reference(), 1);

  ASSERT_TRUE(Exit("w", packed, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  got = manager_->Get(1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(got->state_reason(), HasSubstr("cheapest to the target val_loss 2.5000: packed"));
  const auto stored = base_.GetExperiment(1);
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->experiment().state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  auto events = base_.ListExperimentEvents(1, 0, 100);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> types;
  for (const auto& ev : *events) types.push_back(ev.type());
  EXPECT_THAT(types, ::testing::Contains("target"));
  EXPECT_EQ(types.back(), "succeeded");
}

TEST_F(ManagerTest, AFailedCommitActsOnNothingAndTheNextPassDoes) {
  auto e = manager_->Create(Spec(2), "");
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string naive = e->variants(0).job(), packed = e->variants(1).job();
  Hello("w", 2);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Eval("w", naive, 1000, 2.5).ok());
  ASSERT_TRUE(Exit("w", naive, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  store_.FailCommits(true);
  EXPECT_FALSE(manager_->Reconcile().ok());
  EXPECT_EQ(Job(packed).target_val_loss(), 0) << "acted before the commit";
  EXPECT_EQ(base_.GetExperiment(1)->experiment().target_val_loss(), 0);
  store_.FailCommits(false);
  ASSERT_TRUE(manager_->Reconcile().ok());
  EXPECT_DOUBLE_EQ(Job(packed).target_val_loss(), 2.5);
}

TEST_F(ManagerTest, ARestartCarriesOnWithoutDoublingJobs) {
  // A store that refuses the experiment's commits after its creation: the
  // variants' jobs exist but the record does not name them (a crash between
  // the submit and the record).
  store_.FailCommits(true);
  auto e = manager_->Create(Spec(3), "");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(AllJobs().size(), 3u);
  EXPECT_TRUE(base_.GetExperiment(1)->experiment().variants(0).job().empty());
  store_.FailCommits(false);
  Restart();
  ASSERT_TRUE(manager_->Reconcile().ok());
  EXPECT_EQ(AllJobs().size(), 3u) << "resubmits found the same jobs";
  const auto stored = base_.GetExperiment(1);
  for (const auto& v : stored->experiment().variants()) EXPECT_FALSE(v.job().empty());
}

TEST_F(ManagerTest, CancelEndsTheExperimentAndItsJobs) {
  auto e = manager_->Create(Spec(2), "");
  ASSERT_TRUE(e.ok());
  auto c = manager_->Cancel(1, "changed my mind");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), tally::v1::EXPERIMENT_STATE_CANCELLED);
  for (const auto& v : c->variants()) {
    EXPECT_EQ(Job(v.job()).state(), tally::v1::JOB_STATE_CANCELLED);
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(manager_->Cancel(1, "").status()));
  EXPECT_TRUE(absl::IsNotFound(manager_->Cancel(9, "").status()));
}

TEST_F(ManagerTest, CancelCommittedBeforeACrashStillCancelsTheJobsAfterRestart) {
  auto e = manager_->Create(Spec(2), "");
  ASSERT_TRUE(e.ok());
  // The cancel commits, then the process dies before the jobs are told.
  store::ExperimentRecord rec = *base_.GetExperiment(1);
  std::vector<std::optional<tally::v1::Job>> jobs;
  for (const auto& v : rec.experiment().variants()) jobs.push_back(Job(v.job()));
  Plan p = DecideCancel(rec, jobs, "crash test", clock_.Now());
  ASSERT_TRUE(base_.CommitExperiment({p.rec, p.events}).ok());
  Restart();
  ASSERT_TRUE(manager_->Reconcile().ok());
  for (const auto& v : rec.experiment().variants()) {
    EXPECT_EQ(Job(v.job()).state(), tally::v1::JOB_STATE_CANCELLED) << v.name();
  }
}

TEST_F(ManagerTest, MetricsShowEachVariantsDollarsToTarget) {
  auto e = manager_->Create(Spec(2), "");
  ASSERT_TRUE(e.ok());
  const std::string naive = e->variants(0).job(), packed = e->variants(1).job();
  Hello("w", 2);
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Seconds(100));
  ASSERT_TRUE(Eval("w", packed, 100, 2.0).ok());
  ASSERT_TRUE(Eval("w", naive, 1000, 2.5).ok());
  ASSERT_TRUE(Exit("w", naive, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  bool cost_to_target = false, reached = false;
  for (const auto& f : registries_.back()->Collect()) {
    for (const auto& m : f.metric) {
      if (m.labels.count("variant") == 0 || m.labels.at("variant") != "packed") continue;
      if (f.name == "tally_experiment_variant_cost_to_target_dollars") {
        cost_to_target = true;
        EXPECT_NEAR(m.value, 0.1, 1e-6);  // 100 GPU-seconds at $0.001
      }
      if (f.name == "tally_experiment_variant_reached_target") {
        reached = true;
        EXPECT_EQ(m.value, 1);
      }
    }
  }
  EXPECT_TRUE(cost_to_target);
  EXPECT_TRUE(reached);
}

// Two variants whose own step times differ 4x only because of when they
// ran: the calibration times both alike, and the recipe ratio is then the
// ratio of their steps to the target.
TEST_F(ManagerTest, TheTimingCalibrationPricesEveryVariantAlike) {
  auto e = manager_->Create(Spec(2, /*calibrate=*/true), "");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->calibration().enabled());
  const std::string naive = e->variants(0).job(), packed = e->variants(1).job();
  const std::string cal = e->calibration().job();
  ASSERT_FALSE(cal.empty());
  EXPECT_EQ(AllJobs().size(), 3u);
  const tally::v1::Job cj = Job(cal);
  EXPECT_EQ(cj.spec().labels().at("experiment"), "experiments/1");
  EXPECT_EQ(cj.spec().labels().at("calibration"), "timing");
  EXPECT_EQ(cj.spec().display_name(), "ab/timing");
  ASSERT_EQ(cj.spec().calibration().variants_size(), 2);
  EXPECT_EQ(cj.spec().calibration().variants(1).name(), "packed");
  EXPECT_EQ(cj.spec().calibration().rounds(), 3);
  EXPECT_EQ(cj.spec().calibration().steps(), 5);
  EXPECT_FALSE(cj.spec().calibration().variants(0).spec().training().eval_interval_steps());
  EXPECT_EQ(cj.spec().training().max_steps(), 2 * 3 * 6);

  Hello("w", 3);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_EQ(Job(cal).state(), tally::v1::JOB_STATE_RUNNING);
  for (int step = 10; step <= 100; step += 10) {
    ASSERT_TRUE(Progress("w", naive, step, 0.1).ok());
    ASSERT_TRUE(Progress("w", packed, step, 0.4).ok());  // it ran beside a busy loop
  }
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(Eval("w", packed, 50, 2.0).ok());
  ASSERT_TRUE(Eval("w", naive, 100, 2.5).ok());
  ASSERT_TRUE(Exit("w", naive, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  ASSERT_TRUE(Exit("w", packed, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  auto got = manager_->Get(1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), tally::v1::EXPERIMENT_STATE_RUNNING)
      << "it waits for its calibration";
  // Meanwhile each is priced at its own step times.
  EXPECT_FALSE(got->variants(1).timing_calibrated());
  EXPECT_NEAR(got->variants(1).step_seconds(), 0.4, 1e-9);

  ASSERT_TRUE(CalibrationExit("w", cal, {0.2, 0.2}).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  got = manager_->Get(1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED) << got->state_reason();
  EXPECT_EQ(got->calibration().state(), tally::v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(got->calibration().times_size(), 2);
  for (const auto& v : got->variants()) {
    EXPECT_TRUE(v.timing_calibrated()) << v.name();
    EXPECT_NEAR(v.step_seconds(), 0.2, 1e-9) << v.name();
  }
  EXPECT_NEAR(got->variants(1).own_step_seconds(), 0.4, 1e-9);
  // packed reached 2.5 at step 50 (its first evaluation is already below:
  // the crossing is that step), naive at 100: half the steps at the same
  // step time.
  EXPECT_NEAR(got->variants(1).recipe_ratio_to_reference(),
              got->variants(1).steps_to_target() / got->variants(0).steps_to_target(), 1e-9);
  EXPECT_NEAR(got->cost_usd(),
              got->variants(0).cost_usd() + got->variants(1).cost_usd() +
                  got->calibration().cost_usd(),
              1e-12);
  EXPECT_GT(got->calibration().cost_usd(), 0) << "the calibration is billed to the experiment";
  EXPECT_THAT(got->state_reason(), HasSubstr("timing calibrated by " + cal));
  auto events = base_.ListExperimentEvents(1, 0, 100);
  ASSERT_TRUE(events.ok());
  std::vector<std::string> types;
  for (const auto& ev : *events) types.push_back(ev.type());
  EXPECT_THAT(types, ::testing::Contains("calibration_submitted"));
  EXPECT_THAT(types, ::testing::Contains("calibration_ended"));
}

TEST_F(ManagerTest, WithoutCalibrationTheVerdictSaysSo) {
  auto e = manager_->Create(Spec(2), "");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FALSE(e->calibration().enabled());
  EXPECT_TRUE(e->calibration().job().empty());
  const std::string naive = e->variants(0).job(), packed = e->variants(1).job();
  Hello("w", 2);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Eval("w", naive, 100, 2.5).ok());
  ASSERT_TRUE(Exit("w", naive, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(Exit("w", packed, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  auto got = manager_->Get(1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(got->state_reason(), HasSubstr("timing not calibrated (timing.calibrate: false)"));
}

TEST_F(ManagerTest, AFailedCalibrationLeavesOwnStepTimesAndEndsTheExperiment) {
  auto e = manager_->Create(Spec(2, /*calibrate=*/true), "");
  ASSERT_TRUE(e.ok()) << e.status();
  const std::string naive = e->variants(0).job(), packed = e->variants(1).job();
  const std::string cal = e->calibration().job();
  Hello("w", 3);
  ASSERT_TRUE(sched_->Tick().ok());
  ASSERT_TRUE(Exit("w", cal, tally::v1::ATTEMPT_OUTCOME_FAILED).ok());  // not retryable
  ASSERT_EQ(Job(cal).state(), tally::v1::JOB_STATE_FAILED);
  ASSERT_TRUE(Eval("w", naive, 100, 2.5).ok());
  ASSERT_TRUE(Exit("w", naive, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(Exit("w", packed, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  auto got = manager_->Get(1);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED);
  EXPECT_THAT(got->state_reason(),
              HasSubstr("timing not calibrated: the calibration " + cal + " ended FAILED"));
  EXPECT_FALSE(got->variants(0).timing_calibrated());
}

TEST_F(ManagerTest, CancellingCancelsTheCalibrationToo) {
  auto e = manager_->Create(Spec(2, /*calibrate=*/true), "");
  ASSERT_TRUE(e.ok()) << e.status();
  auto c = manager_->Cancel(1, "enough");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Job(e->calibration().job()).state(), tally::v1::JOB_STATE_CANCELLED);
}

TEST_F(ManagerTest, VariantsOneWorkerCannotRunAreTimedByTheirOwnSteps) {
  tally::v1::ExperimentSpec spec = Spec(3, /*calibrate=*/true);
  auto* o = spec.mutable_variants(2)->mutable_overrides()->mutable_fields();
  (*o)["resources"].mutable_struct_value()->mutable_fields()->operator[]("gpu_count")
      .set_number_value(2);
  auto e = manager_->Create(spec, "");
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->calibration().enabled());
  EXPECT_THAT(e->calibration().note(), HasSubstr("moe (2 GPUs)"));
  EXPECT_EQ(Job(e->calibration().job()).spec().calibration().variants_size(), 2);

  tally::v1::ExperimentSpec alone = Spec(2, /*calibrate=*/true);
  (*alone.mutable_variants(1)->mutable_overrides()->mutable_fields())["resources"]
      .mutable_struct_value()->mutable_fields()->operator[]("gpu_count").set_number_value(2);
  auto f = manager_->Create(alone, "");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_FALSE(f->calibration().enabled());
  EXPECT_THAT(f->calibration().note(), HasSubstr("no timing calibration"));
  EXPECT_TRUE(f->calibration().job().empty());
}

// Every experiment's series (the ended ones' too) as "name,label=value,...".
std::map<std::string, double> ExperimentSeries(const metrics::Registry& registry) {
  std::map<std::string, double> out;
  for (const auto& f : registry.Collect()) {
    if (f.name.rfind("tally_experiment_", 0) != 0) continue;
    for (const auto& m : f.metric) {
      std::string key = f.name;
      for (const auto& [k, v] : m.labels) key += "," + k + "=" + v;
      out[key] = m.value;
    }
  }
  return out;
}

TEST_F(ManagerTest, ExperimentSeriesSurviveARestart) {
  auto ended = manager_->Create(Spec(2), "");
  ASSERT_TRUE(ended.ok());
  const std::string naive = ended->variants(0).job(), packed = ended->variants(1).job();
  Hello("w", 2);
  ASSERT_TRUE(sched_->Tick().ok());
  clock_.Advance(absl::Seconds(100));
  ASSERT_TRUE(Eval("w", packed, 100, 2.0).ok());
  ASSERT_TRUE(Eval("w", naive, 1000, 2.5).ok());
  ASSERT_TRUE(Exit("w", naive, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  ASSERT_TRUE(manager_->Cancel(1, "done").ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  auto running = manager_->Create(Spec(2), "");
  ASSERT_TRUE(running.ok());
  ASSERT_TRUE(manager_->Reconcile().ok());
  const auto before = ExperimentSeries(*registries_.back());
  ASSERT_EQ(before.count("tally_experiment_variant_cost_to_target_dollars,experiment="
                         "experiments/1,variant=packed"),
            1u);
  ASSERT_EQ(before.count("tally_experiment_cost_dollars,experiment=experiments/2"), 1u);

  Restart();  // before any pass of the new manager
  EXPECT_EQ(ExperimentSeries(*registries_.back()), before);
}

// Successive halving with fewer workers than variants, on the real
// scheduler: simulated workers train each running attempt 10 steps a pass
// (an evaluation every 50), obey preemption and stop orders, and a
// variant's loss depends on its learning rate only. Every variant reaches
// every rung (those at the mark are held while others wait for a slot), the
// rungs are judged on all of them, and the worst learning rate goes first.
class HalvingTest : public ManagerTest {
 protected:
  // Variant i's loss at `step`: the higher i, the worse (a smaller lr).
  static double Loss(int variant, int64_t step) {
    return 2.0 + 0.5 * variant + 3.0 * std::exp(-static_cast<double>(step) / 200.0);
  }

  struct Outcome {
    Experiment e;
    std::map<std::string, int64_t> steps_at_end;
    std::vector<std::string> event_types;
    int holds = 0;
  };

  Outcome Run(int variants, int workers) {
    tally::v1::ExperimentSpec spec;
    spec.set_display_name("halving");
    *spec.mutable_base() = sched::TinySpec();
    for (int i = 0; i < variants; ++i) spec.add_variants()->set_name("v" + std::to_string(i));
    spec.mutable_target()->set_val_loss(0.5);  // out of reach: every variant runs
    spec.set_strategy(tally::v1::EXPERIMENT_STRATEGY_SUCCESSIVE_HALVING);
    for (int w = 0; w < workers; ++w) Hello("w" + std::to_string(w), 1);
    // The timing calibration takes a slot too, queued after the variants.
    absl::StatusOr<Experiment> created = manager_->Create(spec, "");
    EXPECT_TRUE(created.ok()) << created.status();
    const std::string name = created->name();
    Outcome out;
    for (int pass = 0; pass < 2000; ++pass) {
      clock_.Advance(absl::Seconds(1));
      EXPECT_TRUE(sched_->Tick().ok());
      EXPECT_TRUE(manager_->Reconcile().ok());
      Experiment e = *manager_->Get(std::stoll(name.substr(12)));
      if (e.state() != tally::v1::EXPERIMENT_STATE_RUNNING) {
        out.e = e;
        break;
      }
      if (const std::string& cal = e.calibration().job(); !cal.empty()) {
        const tally::v1::Job j = Job(cal);
        if (j.state() == tally::v1::JOB_STATE_RUNNING && j.worker_ids_size() > 0) {
          EXPECT_TRUE(CalibrationExit(j.worker_ids(0), cal,
                                      std::vector<double>(variants, 0.1)).ok());
        }
      }
      for (int i = 0; i < e.variants_size(); ++i) {
        const std::string& job_name = e.variants(i).job();
        if (job_name.empty()) continue;
        const tally::v1::Job j = Job(job_name);
        if (j.state() != tally::v1::JOB_STATE_RUNNING || j.worker_ids_size() == 0) continue;
        const std::string w = j.worker_ids(0);
        if (!j.preemption().pending_for().empty()) {
          EXPECT_TRUE(Exit(w, job_name, tally::v1::ATTEMPT_OUTCOME_PREEMPTED).ok());
          continue;
        }
        if (j.has_pending_stop()) {
          EXPECT_TRUE(Exit(w, job_name, tally::v1::ATTEMPT_OUTCOME_STOPPED).ok());
          continue;
        }
        const int64_t step = j.step() + 10;
        tally::v1::WorkerMessage m;
        m.mutable_progress()->set_job(job_name);
        m.mutable_progress()->set_attempt(j.attempt());
        m.mutable_progress()->set_step(step);
        m.mutable_progress()->set_tokens(step * 100);
        m.mutable_progress()->set_trained(true);
        m.mutable_progress()->set_step_seconds(0.1);
        EXPECT_TRUE(sched_->OnMessage(w, m).ok());
        if (step % 50 == 0) EXPECT_TRUE(Eval(w, job_name, step, Loss(i, step)).ok());
        if (step >= 1000) EXPECT_TRUE(Exit(w, job_name, tally::v1::ATTEMPT_OUTCOME_SUCCEEDED).ok());
      }
    }
    EXPECT_NE(out.e.state(), tally::v1::EXPERIMENT_STATE_RUNNING) << "the experiment ended";
    EXPECT_EQ(out.e.calibration().times_size(), variants) << "the calibration ran too";
    for (const auto& v : out.e.variants()) out.steps_at_end[v.name()] = Job(v.job()).step();
    const auto events = base_.ListExperimentEvents(1, 0, 1000);
    EXPECT_TRUE(events.ok());
    for (const auto& ev : *events) {
      out.event_types.push_back(ev.type());
      out.holds += ev.type() == "held";
      if (ev.type() == "halving") {
        EXPECT_THAT(ev.detail(), HasSubstr("ranked by its forecast final val_loss"));
        EXPECT_THAT(ev.reason(), HasSubstr("val_loss"));
      }
    }
    return out;
  }
};

TEST_F(HalvingTest, FourVariantsOnTwoWorkersReachEveryRungAndTheWorseHalfStops) {
  const Outcome o = Run(4, 2);
  ASSERT_EQ(o.e.state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED) << o.e.state_reason();
  EXPECT_EQ(o.e.rung(), 2);
  std::map<std::string, bool> halted;
  for (const auto& v : o.e.variants()) halted[v.name()] = v.halted();
  // v0 is the reference (the first variant of a val_loss target): it is
  // never halved and trains to the end, so that every ratio has its
  // denominator. The race is v1-v3, over two rungs: v3 (the smallest
  // learning rate) stops at the first, v2 at the second; v1 trains to the
  // end.
  EXPECT_TRUE(halted["v3"]);
  EXPECT_TRUE(halted["v2"]);
  EXPECT_FALSE(halted["v1"]);
  EXPECT_FALSE(halted["v0"]);
  EXPECT_EQ(o.steps_at_end.at("v0"), 1000);
  EXPECT_EQ(o.steps_at_end.at("v1"), 1000);
  // The halted ones stopped near their rung's mark (250 steps for the
  // first, 500 for the second), not at the end of their runs.
  EXPECT_LT(o.steps_at_end.at("v3"), 300);
  EXPECT_GE(o.steps_at_end.at("v3"), 250) << "it reached the rung before being judged";
  EXPECT_GE(o.steps_at_end.at("v2"), 500);
  EXPECT_LT(o.steps_at_end.at("v2"), 550);
  EXPECT_GT(o.holds, 0) << "two slots for four variants: some waited at the mark";
  EXPECT_TRUE(Job(o.e.variants(0).job()).hold().empty());
}

TEST_F(HalvingTest, EightVariantsOnOneWorker) {
  const Outcome o = Run(8, 1);
  ASSERT_EQ(o.e.state(), tally::v1::EXPERIMENT_STATE_SUCCEEDED) << o.e.state_reason();
  EXPECT_EQ(o.e.rung(), 3);
  int halted = 0;
  for (const auto& v : o.e.variants()) halted += v.halted();
  // v0, the reference, never races: 3, 2 and 1 of the other seven stop.
  EXPECT_EQ(halted, 6);
  EXPECT_FALSE(o.e.variants(0).halted()) << "the reference runs to its end";
  EXPECT_FALSE(o.e.variants(1).halted()) << "the best learning rate of the race wins";
  EXPECT_TRUE(o.e.variants(7).halted());
  // The first rung (125 steps) was reached by every variant before any
  // stopped: the worst one trained to it.
  EXPECT_GE(o.steps_at_end.at("v7"), 125);
  EXPECT_LT(o.steps_at_end.at("v7"), 200);
}

}  // namespace
}  // namespace tally::experiments
