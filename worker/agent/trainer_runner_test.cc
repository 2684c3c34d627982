// TrainerRunner end to end on a tiny model: how a stop order reaches the
// trainer and what the runner reports before the attempt's exit.
#include "worker/agent/trainer_runner.h"

#include <openssl/evp.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/spec_yaml.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/data/test_fortunes.h"
#include "worker/train/trainer.h"

namespace tally::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Records reports in order and asks for a stop once step `stop_at` is
// reported.
class RecordingReporter final : public Reporter {
 public:
  RecordingReporter(train::StopFlag* stop, int64_t stop_at, train::StopKind kind)
      : stop_(stop), stop_at_(stop_at), kind_(kind) {}
  void Progress(const tally::v1::Progress& p) override {
    Add(absl::StrCat("progress ", p.step()));
    {
      absl::MutexLock lock(&mu_);
      progress_.push_back(p);
    }
    if (p.step() == stop_at_) stop_->Request(kind_);
  }
  void Eval(const tally::v1::EvalResult& e) override { Add(absl::StrCat("eval ", e.step())); }
  void Checkpoint(const tally::v1::CheckpointRecord& c) override {
    Add(absl::StrCat("checkpoint ", c.step()));
    absl::MutexLock lock(&mu_);
    checkpoints_.push_back(c);
  }
  std::vector<std::string> log() {
    absl::MutexLock lock(&mu_);
    return log_;
  }
  // When each entry of log() was made.
  std::vector<absl::Time> times() {
    absl::MutexLock lock(&mu_);
    return times_;
  }
  std::vector<tally::v1::CheckpointRecord> checkpoints() {
    absl::MutexLock lock(&mu_);
    return checkpoints_;
  }
  std::vector<tally::v1::Progress> progress() {
    absl::MutexLock lock(&mu_);
    return progress_;
  }

 private:
  void Add(std::string s) {
    absl::MutexLock lock(&mu_);
    log_.push_back(std::move(s));
    times_.push_back(absl::Now());
  }
  train::StopFlag* stop_;
  const int64_t stop_at_;
  const train::StopKind kind_;
  absl::Mutex mu_;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> times_ ABSL_GUARDED_BY(mu_);
  std::vector<tally::v1::CheckpointRecord> checkpoints_ ABSL_GUARDED_BY(mu_);
  std::vector<tally::v1::Progress> progress_ ABSL_GUARDED_BY(mu_);
};

class TrainerRunnerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/tally_runner_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = new std::string(dir);
    data::WriteFortunes(*dir_ + "/train", {"science.u8"});
    data::WriteFortunes(*dir_ + "/val", {"people.u8"});
  }

  tally::v1::Assignment Assignment() {
    auto spec = ParseJobSpecYaml(absl::StrCat(R"(
model: {num_layers: 1, d_model: 32, num_heads: 2}
data: {train_path: )", *dir_, R"(/train, seq_len: 64}
training: {max_steps: 50, micro_batch_rows: 2, eval_interval_steps: 4, eval_tokens: 1024, seed: 1}
optimizer: {lr: 1e-3}
)"));
    EXPECT_TRUE(spec.ok()) << spec.status();
    tally::v1::Assignment a;
    a.set_job("jobs/1");
    a.set_attempt(1);
    *a.mutable_spec() = *spec;
    return a;
  }

  static std::string* dir_;
};

std::string* TrainerRunnerTest::dir_ = nullptr;

std::string FileSha256(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_sha256(), nullptr);
  return absl::BytesToHexString(std::string(reinterpret_cast<char*>(md), len));
}

TEST_F(TrainerRunnerTest, AStopThatKeepsTheStateReportsEvalThenCheckpointBeforeTheExit) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-keep";
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 5, train::StopKind::kKeepState);
  const tally::v1::AttemptExit exit = runner.Run(Assignment(), &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
  EXPECT_EQ(exit.step(), 5);
  const std::vector<std::string> log = reporter.log();
  ASSERT_GE(log.size(), 3u);
  EXPECT_THAT(std::vector<std::string>(log.end() - 3, log.end()),
              ::testing::ElementsAre("progress 5", "eval 5", "checkpoint 5"));
  const auto checkpoints = reporter.checkpoints();
  ASSERT_EQ(checkpoints.size(), 1u);
  // Resolved: the root's real folder.
  EXPECT_EQ(checkpoints[0].path(), std::filesystem::canonical(*dir_).string() +
                                       "/ckpt-keep/job-1/step-00000005.ckpt");
  // The recorded hash is what sha256sum prints for the file.
  EXPECT_EQ(checkpoints[0].sha256(), FileSha256(checkpoints[0].path()));

  // The next attempt resumes from it, checked against that hash.
  tally::v1::Assignment next = Assignment();
  next.set_attempt(2);
  next.mutable_resume_from()->set_path(checkpoints[0].path());
  next.mutable_resume_from()->set_sha256(checkpoints[0].sha256());
  train::StopFlag stop2;
  RecordingReporter reporter2(&stop2, 6, train::StopKind::kNow);
  const tally::v1::AttemptExit exit2 = runner.Run(next, &reporter2, &stop2);
  EXPECT_EQ(exit2.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit2.reason();
  EXPECT_EQ(exit2.step(), 6);
  EXPECT_THAT(reporter2.log(), ::testing::ElementsAre("progress 6"));
}

TEST_F(TrainerRunnerTest, APlainStopStopsAtOnce) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-now";
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 5, train::StopKind::kNow);
  const tally::v1::AttemptExit exit = runner.Run(Assignment(), &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
  EXPECT_EQ(exit.step(), 5);
  EXPECT_EQ(reporter.log().back(), "progress 5");
  EXPECT_TRUE(reporter.checkpoints().empty());
}

TEST_F(TrainerRunnerTest, APreemptionCheckpointsWithoutEvaluatingAndExitsPreempted) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-preempt";
  o.test_preempt_checkpoint_delay_seconds = 0.3;
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 8, train::StopKind::kPreempt);
  const tally::v1::AttemptExit exit = runner.Run(Assignment(), &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_PREEMPTED) << exit.reason();
  EXPECT_EQ(exit.step(), 8);
  EXPECT_TRUE(exit.retryable());
  EXPECT_THAT(exit.reason(), HasSubstr("preempted at step 8, state kept in its checkpoint"));
  EXPECT_EQ(exit.preemption_cause(), "");  // the agent knows the cause
  // Step 8 is on the evaluation schedule; a preemption skips it.
  const std::vector<std::string> log = reporter.log();
  ASSERT_GE(log.size(), 2u);
  EXPECT_THAT(std::vector<std::string>(log.end() - 2, log.end()),
              ::testing::ElementsAre("progress 8", "checkpoint 8"));
  const std::vector<absl::Time> times = reporter.times();
  EXPECT_GE(times.back() - times[times.size() - 2], absl::Milliseconds(300))
      << "--testonly_preempt_checkpoint_delay did not reach the trainer";
  const auto checkpoints = reporter.checkpoints();
  ASSERT_EQ(checkpoints.size(), 1u);
  EXPECT_EQ(checkpoints[0].sha256(), FileSha256(checkpoints[0].path()));
}

TEST_F(TrainerRunnerTest, Fp8ReportsCarryValuesCastAndOverflowsSinceTheAttemptStarted) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-fp8";
  o.test_fp8_overflow_fraction = 0.01;  // the test-only knob reaches the trainer
  o.test_fp8_grouped_off = "refused by the test";
  TrainerRunner runner(o);
  tally::v1::Assignment a = Assignment();
  a.mutable_spec()->mutable_precision()->set_compute(tally::v1::PRECISION_FP8);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 4, train::StopKind::kNow);
  const tally::v1::AttemptExit exit = runner.Run(a, &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
  const std::vector<tally::v1::Progress> p = reporter.progress();
  ASSERT_EQ(p.size(), 4u);
  for (size_t i = 0; i < p.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", p[i].step()));
    EXPECT_GT(p[i].fp8_overflows(), 0);
    EXPECT_LT(p[i].fp8_overflows(), p[i].fp8_values() / 100);
    EXPECT_EQ(p[i].fp8_grouped_off(), "refused by the test");
    if (i == 0) continue;
    // Cumulative: each report adds the step's counts to the previous one's.
    EXPECT_GT(p[i].fp8_values(), p[i - 1].fp8_values());
    EXPECT_GT(p[i].fp8_overflows(), p[i - 1].fp8_overflows());
  }
  // A step's values are the same each step (same shapes): cumulative, not
  // the latest step's.
  EXPECT_EQ(p[3].fp8_values(), 4 * p[0].fp8_values());
}

DataRoots RootsOf(const std::vector<std::string>& roots) {
  std::filesystem::create_directories(roots.front());
  absl::StatusOr<DataRoots> r = DataRoots::Make(roots, std::filesystem::current_path());
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : DataRoots();
}

TEST_F(TrainerRunnerTest, ADatasetOutsideTheDataRootsFailsTheAttemptForGoodBeforeTraining) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-confined";
  o.data_roots = RootsOf({*dir_ + "/roots/a"});
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 1, train::StopKind::kNow);
  tally::v1::Assignment a = Assignment();
  a.mutable_spec()->mutable_data()->set_train_path(*dir_ + "/roots/a/../../train");
  const tally::v1::AttemptExit exit = runner.Run(a, &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_FALSE(exit.retryable());
  EXPECT_THAT(exit.reason(),
              AllOf(HasSubstr("spec.data.train_path \"" + *dir_ + "/roots/a/../../train\""),
                    HasSubstr("resolves to " + std::filesystem::canonical(*dir_).string() +
                              "/train"),
                    HasSubstr("outside the worker's data roots (" +
                              std::filesystem::canonical(*dir_ + "/roots/a").string() + ")")));
  EXPECT_TRUE(reporter.log().empty());
}

TEST_F(TrainerRunnerTest, AValidationSplitOutsideTheDataRootsIsRefusedToo) {
  std::filesystem::create_directories(*dir_ + "/roots/b");
  for (const char* ext : {".json", ".idx", ".bin"}) {
    std::filesystem::copy_file(*dir_ + "/train" + ext, *dir_ + "/roots/b/train" + ext,
                               std::filesystem::copy_options::overwrite_existing);
  }
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-confined-val";
  o.data_roots = RootsOf({*dir_ + "/roots/b"});
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 1, train::StopKind::kNow);
  tally::v1::Assignment a = Assignment();
  a.mutable_spec()->mutable_data()->set_train_path(*dir_ + "/roots/b/train");
  // Beside train_path there is no val split inside the root, so name one
  // outside it.
  a.mutable_spec()->mutable_data()->set_val_path(*dir_ + "/val");
  tally::v1::AttemptExit exit = runner.Run(a, &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_FALSE(exit.retryable());
  EXPECT_THAT(exit.reason(), HasSubstr("spec.data.val_path \"" + *dir_ + "/val\""));
  // With the validation split inside the root too, it trains.
  for (const char* ext : {".json", ".idx", ".bin"}) {
    std::filesystem::copy_file(*dir_ + "/val" + ext, *dir_ + "/roots/b/val" + ext,
                               std::filesystem::copy_options::overwrite_existing);
  }
  a.mutable_spec()->mutable_data()->clear_val_path();
  exit = runner.Run(a, &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
  EXPECT_EQ(exit.step(), 1);
}

TEST_F(TrainerRunnerTest, AJobNameThatLeavesTheCheckpointRootFailsTheAttemptForGood) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-names";
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 1, train::StopKind::kNow);
  tally::v1::Assignment a = Assignment();
  a.set_job("jobs/../../escaped");
  const tally::v1::AttemptExit exit = runner.Run(a, &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_FALSE(exit.retryable());
  EXPECT_THAT(exit.reason(), HasSubstr("cannot name a checkpoint folder"));
  EXPECT_FALSE(std::filesystem::exists(*dir_ + "/escaped"));
}

TEST_F(TrainerRunnerTest, AResumePathOutsideTheJobsCheckpointFolderFailsTheAttemptForGood) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-resume";
  TrainerRunner runner(o);
  // A real checkpoint of another job, under the same root.
  tally::v1::Assignment other = Assignment();
  other.set_job("jobs/2");
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 3, train::StopKind::kKeepState);
  tally::v1::AttemptExit exit = runner.Run(other, &reporter, &stop);
  ASSERT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
  ASSERT_EQ(reporter.checkpoints().size(), 1u);
  const tally::v1::CheckpointRecord ckpt = reporter.checkpoints()[0];

  for (const std::string& forged :
       {ckpt.path(), o.checkpoint_dir + "/job-1/../job-2/step-00000003.ckpt"}) {
    SCOPED_TRACE(forged);
    tally::v1::Assignment a = Assignment();  // jobs/1
    a.mutable_resume_from()->set_path(forged);
    a.mutable_resume_from()->set_sha256(ckpt.sha256());
    train::StopFlag stop1;
    RecordingReporter reporter1(&stop1, 1, train::StopKind::kNow);
    exit = runner.Run(a, &reporter1, &stop1);
    EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
    EXPECT_FALSE(exit.retryable());
    EXPECT_THAT(exit.reason(),
                AllOf(HasSubstr("resume_from.path \"" + forged + "\""),
                      HasSubstr("outside this job's checkpoint folder"),
                      HasSubstr(o.checkpoint_dir + " (--checkpoint_dir)")));
    EXPECT_TRUE(reporter1.log().empty());
  }
  // Its own job resumes from it.
  other.set_attempt(2);
  other.mutable_resume_from()->set_path(ckpt.path());
  other.mutable_resume_from()->set_sha256(ckpt.sha256());
  train::StopFlag stop2;
  RecordingReporter reporter2(&stop2, 4, train::StopKind::kNow);
  exit = runner.Run(other, &reporter2, &stop2);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
  EXPECT_EQ(exit.step(), 4);
  ASSERT_FALSE(reporter2.log().empty());
  EXPECT_EQ(reporter2.log().front(), "progress 4");  // resumed after step 3
}

// What the next attempt gets when a checkpoint is damaged: tallyd passes
// resume_from as recorded.
tally::v1::AttemptExit ResumeFrom(TrainerRunner* runner, tally::v1::Assignment a,
                                  const tally::v1::CheckpointRecord& ckpt) {
  a.set_attempt(a.attempt() + 1);
  a.mutable_resume_from()->set_path(ckpt.path());
  a.mutable_resume_from()->set_sha256(ckpt.sha256());
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 5, train::StopKind::kNow);
  return runner->Run(a, &reporter, &stop);
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_F(TrainerRunnerTest, ADamagedResumeCheckpointIsNamedInTheExitAndNoOtherFailureIs) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-damaged";
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 3, train::StopKind::kKeepState);
  ASSERT_EQ(runner.Run(Assignment(), &reporter, &stop).outcome(),
            tally::v1::ATTEMPT_OUTCOME_STOPPED);
  ASSERT_EQ(reporter.checkpoints().size(), 1u);
  const tally::v1::CheckpointRecord ckpt = reporter.checkpoints()[0];
  const std::string original = ReadAll(ckpt.path());

  // A flipped byte.
  std::string flipped = original;
  flipped[flipped.size() / 3] ^= 0x10;
  WriteAll(ckpt.path(), flipped);
  tally::v1::AttemptExit exit = ResumeFrom(&runner, Assignment(), ckpt);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(exit.damaged_checkpoint(), ckpt.path());
  EXPECT_THAT(exit.reason(), AllOf(HasSubstr(ckpt.path()), HasSubstr("checksum mismatch")));

  // Deleted.
  std::filesystem::remove(ckpt.path());
  exit = ResumeFrom(&runner, Assignment(), ckpt);
  EXPECT_EQ(exit.damaged_checkpoint(), ckpt.path());
  EXPECT_THAT(exit.reason(), HasSubstr("not found"));

  // A symlink in its place, even to a good copy: not followed.
  const std::string copy = *dir_ + "/ckpt-damaged-copy.ckpt";
  WriteAll(copy, original);
  std::filesystem::create_symlink(copy, ckpt.path());
  exit = ResumeFrom(&runner, Assignment(), ckpt);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(exit.damaged_checkpoint(), ckpt.path());
  EXPECT_THAT(exit.reason(), HasSubstr("a symlink stands where the recorded checkpoint"));
  std::filesystem::remove(ckpt.path());

  // Intact but for another model: a failure, not damage.
  WriteAll(ckpt.path(), original);
  tally::v1::Assignment wider = Assignment();
  wider.mutable_spec()->mutable_model()->set_d_model(64);
  exit = ResumeFrom(&runner, wider, ckpt);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_EQ(exit.damaged_checkpoint(), "");
  EXPECT_THAT(exit.reason(), HasSubstr("different job"));

  // Intact: it resumes.
  exit = ResumeFrom(&runner, Assignment(), ckpt);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
  EXPECT_EQ(exit.damaged_checkpoint(), "");
}

TEST_F(TrainerRunnerTest, ReportedCheckpointPathsAreResolvedInsideTheJobsFolder) {
  const std::string real = std::filesystem::canonical(*dir_).string();
  std::filesystem::create_directories(*dir_ + "/ckpt-real");
  std::filesystem::create_directories(*dir_ + "/sub");
  std::filesystem::create_directory_symlink(*dir_ + "/ckpt-real", *dir_ + "/ckpt-link");
  for (const std::string& root : {*dir_ + "/sub/../ckpt-real", *dir_ + "/ckpt-link"}) {
    SCOPED_TRACE(root);
    TrainerRunnerOptions o;
    o.checkpoint_dir = root;
    TrainerRunner runner(o);
    train::StopFlag stop;
    RecordingReporter reporter(&stop, 2, train::StopKind::kKeepState);
    const tally::v1::AttemptExit exit = runner.Run(Assignment(), &reporter, &stop);
    ASSERT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << exit.reason();
    ASSERT_EQ(reporter.checkpoints().size(), 1u);
    EXPECT_EQ(reporter.checkpoints()[0].path(), real + "/ckpt-real/job-1/step-00000002.ckpt");
    // tallyd hands it back as recorded, and it resumes.
    const tally::v1::AttemptExit next =
        ResumeFrom(&runner, Assignment(), reporter.checkpoints()[0]);
    EXPECT_EQ(next.outcome(), tally::v1::ATTEMPT_OUTCOME_STOPPED) << next.reason();
    std::filesystem::remove_all(*dir_ + "/ckpt-real/job-1");
  }
}

TEST_F(TrainerRunnerTest, ASymlinkedJobFolderIsNeverWrittenThrough) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-linked";
  std::filesystem::create_directories(o.checkpoint_dir + "/job-2");
  // job-1's folder leads into job-2's, inside the root.
  std::filesystem::create_directory_symlink(o.checkpoint_dir + "/job-2",
                                            o.checkpoint_dir + "/job-1");
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, 2, train::StopKind::kKeepState);
  const tally::v1::AttemptExit exit = runner.Run(Assignment(), &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_FALSE(exit.retryable());
  EXPECT_THAT(exit.reason(), AllOf(HasSubstr(o.checkpoint_dir + "/job-1 is a symlink"),
                                   HasSubstr("--checkpoint_dir")));
  EXPECT_TRUE(reporter.log().empty());
  EXPECT_TRUE(std::filesystem::is_empty(o.checkpoint_dir + "/job-2"));
}

}  // namespace
}  // namespace tally::worker

namespace tally::worker {
namespace {

// A calibration of two specs: this fixture's spec and a wider one.
tally::v1::Assignment CalibrationAssignment(tally::v1::Assignment a) {
  tally::v1::JobSpec base = a.spec();
  a.mutable_spec()->mutable_training()->set_max_steps(2 * 2 * 3);
  auto* cal = a.mutable_spec()->mutable_calibration();
  cal->set_rounds(2);
  cal->set_steps(2);
  for (const char* name : {"narrow", "wide"}) {
    auto* v = cal->add_variants();
    v->set_name(name);
    *v->mutable_spec() = base;
  }
  cal->mutable_variants(1)->mutable_spec()->mutable_model()->set_d_model(64);
  return a;
}

TEST_F(TrainerRunnerTest, ACalibrationTimesEachSpecAndReportsItOnTheExit) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-calibration";
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, -1, train::StopKind::kNow);
  const tally::v1::AttemptExit exit =
      runner.Run(CalibrationAssignment(Assignment()), &reporter, &stop);
  ASSERT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_SUCCEEDED) << exit.reason();
  EXPECT_EQ(exit.step(), 12);
  ASSERT_EQ(exit.calibration_size(), 2);
  EXPECT_EQ(exit.calibration(0).name(), "narrow");
  EXPECT_EQ(exit.calibration(1).name(), "wide");
  for (const auto& t : exit.calibration()) {
    EXPECT_EQ(t.samples(), 4) << t.name();
    EXPECT_GT(t.median_seconds(), 0) << t.name();
  }
  // A progress report after each burst, and nothing evaluated or saved.
  EXPECT_EQ(reporter.log(), (std::vector<std::string>{"progress 3", "progress 6", "progress 9",
                                                      "progress 12"}));
  EXPECT_FALSE(std::filesystem::exists(*dir_ + "/ckpt-calibration/job-1"));
}

TEST_F(TrainerRunnerTest, ACalibrationSpecOutsideTheDataRootsFailsItBeforeAnythingRuns) {
  TrainerRunnerOptions o;
  o.checkpoint_dir = *dir_ + "/ckpt-calibration";
  std::filesystem::create_directories(*dir_ + "/roots/c");
  o.data_roots = RootsOf({*dir_ + "/roots/c"});
  TrainerRunner runner(o);
  train::StopFlag stop;
  RecordingReporter reporter(&stop, -1, train::StopKind::kNow);
  const tally::v1::AttemptExit exit =
      runner.Run(CalibrationAssignment(Assignment()), &reporter, &stop);
  EXPECT_EQ(exit.outcome(), tally::v1::ATTEMPT_OUTCOME_FAILED);
  EXPECT_FALSE(exit.retryable());
  EXPECT_THAT(exit.reason(),
              AllOf(HasSubstr("spec.calibration.variants[0].spec.data.train_path"),
                    HasSubstr("outside the worker's data roots")));
  EXPECT_TRUE(reporter.log().empty());
}

}  // namespace
}  // namespace tally::worker
