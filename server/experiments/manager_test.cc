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
  static tally::v1::ExperimentSpec Spec(int variants = 3) {
    tally::v1::ExperimentSpec s;
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
  EXPECT_THAT(got->state_reason(), HasSubstr("cheapest to the target 2.5000: packed"));
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
