// The trainer end to end on a real corpus (fortunes, installed by
// scripts/setup.sh): golden losses, exact resume, failures with reasons.
#include "worker/train/trainer.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"
#include "worker/dist/free_port.h"
#include "worker/dist/group.h"
#include "worker/train/checkpoint.h"
#include "worker/train/checksum_file.h"
#include "worker/data/test_fortunes.h"

namespace tally::train {
namespace {

std::string g_dir;

class Recorder : public TrainEvents {
 public:
  void OnStart(const RunInfo& i) override { info = i; }
  void OnStep(const StepMetrics& m) override {
    steps.push_back(m);
    log.push_back(absl::StrCat("step ", m.step));
    if (stop_after > 0 && m.step >= stop_after && stop) stop->Request(stop_kind);
  }
  void OnEval(const EvalMetrics& e) override {
    evals.push_back(e);
    log.push_back(absl::StrCat("eval ", e.step));
  }
  void OnCheckpoint(const CheckpointInfo& c) override {
    checkpoints.push_back(c);
    log.push_back(absl::StrCat("checkpoint ", c.step));
  }
  RunInfo info;
  std::vector<StepMetrics> steps;
  std::vector<EvalMetrics> evals;
  std::vector<CheckpointInfo> checkpoints;
  std::vector<std::string> log;  // "step N", "eval N", "checkpoint N", in order
  int64_t stop_after = 0;
  StopFlag* stop = nullptr;
  StopKind stop_kind = StopKind::kNow;
};

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);  // the golden file is for one thread
    char dir[] = "/tmp/tally_trainer_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    g_dir = dir;
    data::WriteFortunes(g_dir + "/train", {"fortunes.u8", "science.u8", "literature.u8"});
    data::WriteFortunes(g_dir + "/val", {"people.u8"});
  }

  static TrainConfig Tiny() {
    TrainConfig c;
    c.model.num_layers = 2;
    c.model.d_model = 32;
    c.model.num_heads = 2;
    c.data.train_path = g_dir + "/train";
    c.data.seq_len = 128;
    c.micro_batch_rows = 4;
    c.global_batch_tokens = 1024;  // two micro-batches a step
    c.max_steps = 30;
    c.optimizer.lr = 3e-3;
    c.optimizer.warmup_steps = 3;
    c.optimizer.grad_clip = 1.0;
    c.optimizer.weight_decay = 0.1;
    c.eval_interval_steps = 4;
    c.eval_tokens = 4096;
    c.seed = 1;
    return c;
  }

  static std::string NewDir(const std::string& name) {
    const std::string d = g_dir + "/" + name;
    ::mkdir(d.c_str(), 0755);
    return d;
  }
};

// Compares a run's per-step losses with a golden file (TALLY_UPDATE_GOLDEN=1
// rewrites it).
void ExpectGolden(const std::vector<StepMetrics>& steps, const std::string& name,
                  const std::string& what) {
  const std::string golden =
      std::string(TALLY_SOURCE_DIR) + "/worker/train/testdata/" + name;
  if (std::getenv("TALLY_UPDATE_GOLDEN")) {
    std::ofstream out(golden);
    out << "# step train_loss: " << what << "\n";
    for (const auto& s : steps) out << s.step << " " << std::setprecision(9) << s.train_loss << "\n";
    return;
  }
  std::ifstream in(golden);
  ASSERT_TRUE(in) << golden << " is missing (TALLY_UPDATE_GOLDEN=1 writes it)";
  std::string line;
  size_t i = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int64_t step;
    double loss;
    fields >> step >> loss;
    ASSERT_LT(i, steps.size());
    EXPECT_EQ(steps[i].step, step);
    EXPECT_NEAR(steps[i].train_loss, loss, 1e-4 * loss) << "step " << step;
    ++i;
  }
  EXPECT_EQ(i, steps.size());
}

TEST_F(TrainerTest, MatchesGoldenLosses) {
  Recorder r;
  TrainResult result = Train(Tiny(), &r, nullptr);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kSucceeded) << result.reason;
  ASSERT_EQ(r.steps.size(), 30u);
  ExpectGolden(r.steps, "golden_losses_tiny.txt",
               "TrainerTest.Tiny(), fortunes, one thread, FP32 CPU");
  // It learns: the byte-uniform start is ln(258) = 5.55.
  EXPECT_NEAR(r.steps.front().train_loss, std::log(258.0), 0.3);
  EXPECT_LT(r.steps.back().train_loss, r.steps.front().train_loss - 1.5);
  ASSERT_EQ(r.evals.size(), 9u);  // steps 0, 4, ..., 28 and the end, 30
  EXPECT_EQ(r.evals.front().step, 0);
  EXPECT_LT(r.evals.back().val_loss, r.evals.front().val_loss);
  // Bits per byte: EOS targets carry loss but are not bytes of text.
  const double bits_per_token = r.evals.back().val_loss / std::log(2.0);
  EXPECT_GT(r.evals.back().bits_per_byte, bits_per_token);
  EXPECT_LT(r.evals.back().bits_per_byte, 1.1 * bits_per_token);
  EXPECT_GT(r.info.flops_per_token, 0);
  EXPECT_EQ(r.info.micro_batches_per_step, 2);
  EXPECT_LT(r.steps.back().padding_fraction, 0.05);
}

TEST_F(TrainerTest, Fp8TrainsWithinOnePointFivePercentOfFp32) {
  TrainConfig fp32 = Tiny();
  fp32.max_steps = 60;
  fp32.eval_interval_steps = 60;
  TrainConfig fp8 = fp32;
  fp8.fp8 = true;
  Recorder a, b;
  ASSERT_EQ(Train(fp32, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  TrainResult r = Train(fp8, &b, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  const double v32 = a.evals.back().val_loss, v8 = b.evals.back().val_loss;
  std::cout << "val loss at step 60: fp32 " << v32 << ", fp8 (delayed) " << v8 << " ("
            << 100 * (v8 - v32) / v32 << "%)\n";
  EXPECT_LT(std::abs(v8 - v32) / v32, 0.015);
  EXPECT_NE(v8, v32) << "FP8 changes the numerics";
  // Every block product ran in FP8; the statistics are reported.
  EXPECT_DOUBLE_EQ(b.steps.back().fp8_product_fraction, 1.0);
  EXPECT_EQ(b.steps.back().fp8_amax.size(), 6u);  // {attention, ffn} x {input, weight, grad}
  EXPECT_EQ(a.steps.back().fp8_product_fraction, 0.0);
  ExpectGolden(std::vector<StepMetrics>(b.steps.begin(), b.steps.begin() + 30),
               "golden_losses_tiny_fp8.txt",
               "TrainerTest.Tiny() with fp8 (delayed, history 16), fortunes, one thread, CPU "
               "emulation");

  for (precision::Recipe recipe : {precision::Recipe::kCurrent, precision::Recipe::kRowwise}) {
    TrainConfig other = fp8;
    other.fp8_recipe.recipe = recipe;
    Recorder c;
    ASSERT_EQ(Train(other, &c, nullptr).outcome, TrainResult::Outcome::kSucceeded);
    EXPECT_LT(std::abs(c.evals.back().val_loss - v32) / v32, 0.015);
    EXPECT_DOUBLE_EQ(c.steps.back().fp8_product_fraction, 1.0);
  }
}

// The validation loss a run reports after `steps` steps, and the one a
// fresh run started from that step's checkpoint (model.init_from) reports
// at its step 0: the trainer's evaluation reads the model's current
// weights only if nothing (an autocast cast, an FP8 weight image) kept an
// older copy of them.
std::pair<double, double> LossAfterStepsAndOnReload(TrainConfig c, int64_t steps,
                                                    const std::string& dir) {
  c.max_steps = steps;
  c.eval_interval_steps = steps;
  c.checkpoint_dir = dir;
  c.checkpoint_interval_steps = 0;  // the end's
  Recorder a;
  TrainResult ra = Train(c, &a, nullptr);
  EXPECT_EQ(ra.outcome, TrainResult::Outcome::kSucceeded) << ra.reason;
  if (a.checkpoints.empty() || a.evals.empty()) return {-1, -2};
  TrainConfig reload = c;
  reload.checkpoint_dir.clear();
  reload.init_from_checkpoint = a.checkpoints.back().path;
  reload.max_steps = 1;
  reload.eval_interval_steps = 1;
  Recorder b;
  TrainResult rb = Train(reload, &b, nullptr);
  EXPECT_EQ(rb.outcome, TrainResult::Outcome::kSucceeded) << rb.reason;
  if (b.evals.empty()) return {a.evals.back().val_loss, -2};
  EXPECT_EQ(a.evals.back().step, steps);
  EXPECT_EQ(b.evals.front().step, 0);
  return {a.evals.back().val_loss, b.evals.front().val_loss};
}

// precision.compute BF16 on the CPU is CUDA's autocast path, scoped per step
// and per evaluation, so every step reads the weights the optimizer wrote;
// FP8 casts each weight once per step (per-tensor recipes with a scale from
// the tensor itself, so a fresh run computes the same scales). FP8 with
// delayed scaling is checked by its resume test (the scales live in the
// checkpoint, not in the weights).
TEST_F(TrainerTest, EvaluationsReadTheCurrentWeightsInEveryPrecision) {
  struct Case {
    const char* name;
    bool bf16, fp8;
    precision::Recipe recipe;
  };
  for (const Case& k : {Case{"fp32", false, false, precision::Recipe::kDelayed},
                        Case{"bf16", true, false, precision::Recipe::kDelayed},
                        Case{"fp8-current", false, true, precision::Recipe::kCurrent},
                        Case{"fp8-rowwise", false, true, precision::Recipe::kRowwise}}) {
    TrainConfig c = Tiny();
    c.bf16 = k.bf16;
    c.fp8 = k.fp8;
    c.fp8_recipe.recipe = k.recipe;
    for (int64_t steps : {1, 3}) {
      const auto [trained, reloaded] = LossAfterStepsAndOnReload(
          c, steps, NewDir(absl::StrCat("reload-", k.name, "-", steps)));
      EXPECT_EQ(trained, reloaded) << k.name << " after " << steps << " steps";
    }
  }
}

TEST_F(TrainerTest, Bf16OnTheCpuRoundsItsProducts) {
  // BF16 is not FP32: the products round.
  Recorder f32, b16;
  TrainConfig short_run = Tiny();
  short_run.max_steps = 2;
  ASSERT_EQ(Train(short_run, &f32, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  short_run.bf16 = true;
  ASSERT_EQ(Train(short_run, &b16, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  EXPECT_NE(f32.steps.back().train_loss, b16.steps.back().train_loss);
  EXPECT_NEAR(f32.steps.back().train_loss, b16.steps.back().train_loss,
              0.01 * f32.steps.back().train_loss);
}

TEST_F(TrainerTest, Bf16OnTheCpuTrainsWithinTwoPercentOfFp32) {
  TrainConfig fp32 = Tiny();
  fp32.max_steps = 40;
  fp32.eval_interval_steps = 40;
  TrainConfig bf16 = fp32;
  bf16.bf16 = true;
  Recorder a, b;
  ASSERT_EQ(Train(fp32, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  TrainResult r = Train(bf16, &b, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  const double v32 = a.evals.back().val_loss, v16 = b.evals.back().val_loss;
  std::cout << "val loss at step 40 on the same rows: fp32 " << v32 << ", bf16 autocast " << v16
            << " (" << 100 * (v16 - v32) / v32 << "%)\n";
  EXPECT_LT(std::abs(v16 - v32) / v32, 0.02);
  EXPECT_LT(v16, a.evals.front().val_loss - 1.0) << "it learns";
  // Both precisions at once is a configuration error naming the field.
  bf16.fp8 = true;
  EXPECT_NE(Train(bf16, nullptr, nullptr).reason.find("bf16"), std::string::npos);
}

// MFU two ways: the PaLM formula credits every token the whole seq_len of
// attention; executed FLOPs count each document's causal pairs, less when
// documents are shorter than a row (fortunes are).
TEST_F(TrainerTest, MfuIsReportedTwoWays) {
  TrainConfig c = Tiny();
  c.max_steps = 3;
  c.eval_interval_steps = 0;
  c.peak_flops = 1e12;
  Recorder r;
  ASSERT_EQ(Train(c, &r, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  for (const StepMetrics& m : r.steps) {
    EXPECT_GT(m.mfu, 0);
    EXPECT_GT(m.mfu_executed, 0);
    EXPECT_LT(m.mfu_executed, m.mfu);
    // The linear layers' share is the same in both: the difference is
    // attention alone, at most all of it.
    const double linear = 6.0 * (r.info.num_active_parameters - r.info.num_embedding_parameters);
    EXPECT_GT(m.mfu_executed, m.mfu * linear / r.info.flops_per_token);
  }
  c.peak_flops = 0;
  Recorder none;
  ASSERT_EQ(Train(c, &none, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  EXPECT_EQ(none.steps.back().mfu_executed, 0);
}

TEST_F(TrainerTest, Fp8ResumeRestoresTheScalingState) {
  TrainConfig full = Tiny();
  full.fp8 = true;
  full.max_steps = 16;
  full.checkpoint_dir = NewDir("fp8");
  full.checkpoint_interval_steps = 8;
  Recorder a;
  ASSERT_EQ(Train(full, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  TrainConfig resumed = full;
  resumed.checkpoint_dir = NewDir("fp8-resumed");
  resumed.resume_path = a.checkpoints[0].path;
  Recorder b;
  TrainResult r = Train(resumed, &b, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(b.steps.size(), 8u);
  for (size_t i = 0; i < b.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].train_loss, a.steps[8 + i].train_loss) << "step " << b.steps[i].step;
  }
  // A checkpoint without FP8 state cannot resume an FP8 job, and vice versa.
  TrainConfig fp32 = full;
  fp32.fp8 = false;
  fp32.resume_path = a.checkpoints[0].path;
  EXPECT_NE(Train(fp32, nullptr, nullptr).reason.find("different job"), std::string::npos);
}

TEST_F(TrainerTest, MoeTrainsBalancesAndResumesExactly) {
  TrainConfig c = Tiny();
  c.model.moe.num_experts = 4;
  c.model.moe.top_k = 2;
  c.optimizer.moe_aux_loss_coef = 0.01;
  c.optimizer.moe_z_loss_coef = 1e-3;
  c.optimizer.moe_bias_balancing = true;
  c.max_steps = 16;
  c.checkpoint_dir = NewDir("moe");
  c.checkpoint_interval_steps = 8;
  Recorder a;
  TrainResult r = Train(c, &a, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(a.steps.back().moe.size(), 2u);  // every layer
  int64_t assigned = 0;
  for (int64_t n : a.steps.back().moe[0].tokens_per_expert) assigned += n;
  EXPECT_EQ(assigned, 2 * a.steps.back().step_tokens);  // top-2 of every real token
  EXPECT_GE(a.steps.back().moe_max_over_mean_load, 1.0);
  EXPECT_GT(a.steps.back().moe_aux_loss, 0.9);  // ~1 when balanced
  EXPECT_GT(a.steps.back().moe[0].router_entropy, 0);
  EXPECT_LT(a.evals.back().val_loss, a.evals.front().val_loss - 0.5);
  EXPECT_GT(a.info.num_parameters, a.info.num_active_parameters);
  // Resume: weights, optimizer and the experts' selection biases come back.
  TrainConfig resumed = c;
  resumed.checkpoint_dir = NewDir("moe-resumed");
  resumed.resume_path = a.checkpoints[0].path;
  Recorder b;
  ASSERT_EQ(Train(resumed, &b, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(b.steps.size(), 8u);
  for (size_t i = 0; i < b.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].train_loss, a.steps[8 + i].train_loss) << "step " << b.steps[i].step;
    EXPECT_EQ(b.steps[i].moe[1].tokens_per_expert, a.steps[8 + i].moe[1].tokens_per_expert);
  }
  // And with FP8, expert products included.
  TrainConfig fp8 = c;
  fp8.fp8 = true;
  fp8.checkpoint_dir.clear();
  Recorder f;
  ASSERT_EQ(Train(fp8, &f, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  EXPECT_DOUBLE_EQ(f.steps.back().fp8_product_fraction, 1.0);
  EXPECT_LT(std::abs(f.evals.back().val_loss - a.evals.back().val_loss) / a.evals.back().val_loss,
            0.015);
}

TEST_F(TrainerTest, ResumeContinuesTheSameLossCurve) {
  TrainConfig full = Tiny();
  full.checkpoint_dir = NewDir("full");
  full.checkpoint_interval_steps = 5;
  Recorder a;
  ASSERT_EQ(Train(full, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(a.checkpoints.size(), 6u);  // 5, 10, ..., 30
  EXPECT_EQ(a.checkpoints[0].step, 5);
  EXPECT_EQ(a.checkpoints[5].step, 30);

  // Checkpointing does not perturb training.
  Recorder plain;
  ASSERT_EQ(Train(Tiny(), &plain, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].train_loss, plain.steps[i].train_loss);
  }

  TrainConfig resumed = Tiny();
  resumed.resume_path = a.checkpoints[0].path;
  resumed.resume_sha256 = a.checkpoints[0].sha256;
  Recorder b;
  TrainResult rb = Train(resumed, &b, nullptr);
  ASSERT_EQ(rb.outcome, TrainResult::Outcome::kSucceeded) << rb.reason;
  EXPECT_EQ(b.info.start_step, 5);
  ASSERT_EQ(b.steps.size(), 25u);
  for (size_t i = 0; i < b.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].step, a.steps[5 + i].step);
    EXPECT_EQ(b.steps[i].train_loss, a.steps[5 + i].train_loss) << "step " << b.steps[i].step;
    EXPECT_EQ(b.steps[i].lr, a.steps[5 + i].lr);
    EXPECT_EQ(b.steps[i].tokens, a.steps[5 + i].tokens);
  }
  ASSERT_EQ(b.evals.size(), 7u);  // 8, 12, ..., 28, 30: no second step-0 eval
  EXPECT_EQ(b.evals.back().val_loss, a.evals.back().val_loss);
}

TEST_F(TrainerTest, PaddedBaselinesComputeTheSameRowsWithPadding) {
  for (auto mode : {data::PackingMode::kPadToSeqLen, data::PackingMode::kPadToLongest}) {
    TrainConfig c = Tiny();
    c.data.packing = mode;
    c.max_steps = 3;
    c.eval_interval_steps = 0;
    Recorder r;
    ASSERT_EQ(Train(c, &r, nullptr).outcome, TrainResult::Outcome::kSucceeded);
    EXPECT_GT(r.steps.back().padding_fraction, mode == data::PackingMode::kPadToSeqLen ? 0.2 : 0.0)
        << data::PackingModeName(mode);
    EXPECT_LT(r.steps.back().tokens, 3 * 1024);
  }
}

TEST_F(TrainerTest, StopsWithinAStep) {
  StopFlag stop;
  Recorder r;
  r.stop_after = 3;
  r.stop = &stop;
  TrainResult result = Train(Tiny(), &r, &stop);
  EXPECT_EQ(result.outcome, TrainResult::Outcome::kStopped);
  EXPECT_EQ(result.step, 3);
  EXPECT_EQ(r.steps.size(), 3u);
}

// The golden file's losses by step.
std::map<int64_t, double> GoldenLosses(const std::string& name) {
  std::ifstream in(std::string(TALLY_SOURCE_DIR) + "/worker/train/testdata/" + name);
  std::map<int64_t, double> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    int64_t step;
    double loss;
    fields >> step >> loss;
    out[step] = loss;
  }
  return out;
}

// CUDA's optimizer (fused AdamW, norm, clipping and skips on the device),
// run on the CPU: the golden losses up to the kernels' rounding, and a
// resume continues its curve exactly.
TEST_F(TrainerTest, TheFusedOptimizerTakesTheSameSteps) {
  TrainConfig c = Tiny();
  c.optimizer.fused_on_cpu = true;
  c.checkpoint_dir = NewDir("fused");
  c.checkpoint_interval_steps = 10;
  Recorder a;
  TrainResult r = Train(c, &a, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  const auto golden = GoldenLosses("golden_losses_tiny.txt");
  for (const StepMetrics& m : a.steps) {
    EXPECT_NEAR(m.train_loss, golden.at(m.step), 1e-3 * golden.at(m.step)) << "step " << m.step;
  }
  TrainConfig resumed = c;
  resumed.checkpoint_dir = NewDir("fused-resumed");
  resumed.resume_path = a.checkpoints[1].path;  // step 20
  Recorder b;
  ASSERT_EQ(Train(resumed, &b, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(b.steps.size(), 10u);
  for (size_t i = 0; i < b.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].train_loss, a.steps[20 + i].train_loss) << "step " << b.steps[i].step;
  }
}

TEST_F(TrainerTest, StopKeepingStateEvaluatesThenCheckpointsTheStopStep) {
  TrainConfig c = Tiny();  // evaluations every 4 steps, a checkpoint only at the end
  c.checkpoint_dir = NewDir("keep");
  StopFlag stop;
  Recorder r;
  r.stop_after = 6;  // asked while step 6 is reported: it stops after step 6
  r.stop = &stop;
  r.stop_kind = StopKind::kKeepState;
  TrainResult result = Train(c, &r, &stop);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kStopped) << result.reason;
  EXPECT_EQ(result.step, 6);
  EXPECT_THAT(r.log, ::testing::ElementsAre("eval 0", "step 1", "step 2", "step 3", "step 4",
                                            "eval 4", "step 5", "step 6", "eval 6",
                                            "checkpoint 6"));
  ASSERT_EQ(r.checkpoints.size(), 1u);
  EXPECT_EQ(r.checkpoints[0].tokens, r.steps.back().tokens);

  // It resumes on the same curve.
  TrainConfig resumed = Tiny();
  resumed.resume_path = r.checkpoints[0].path;
  resumed.resume_sha256 = r.checkpoints[0].sha256;
  Recorder rest;
  TrainResult rr = Train(resumed, &rest, nullptr);
  ASSERT_EQ(rr.outcome, TrainResult::Outcome::kSucceeded) << rr.reason;
  EXPECT_EQ(rest.info.start_step, 6);
  ASSERT_EQ(rest.steps.size(), 24u);
  const auto golden = GoldenLosses("golden_losses_tiny.txt");
  for (const auto& m : rest.steps) {
    ASSERT_TRUE(golden.count(m.step));
    EXPECT_NEAR(m.train_loss, golden.at(m.step), 1e-4 * golden.at(m.step)) << "step " << m.step;
  }

  // Stopped again where it resumed: the latest evaluation and checkpoint are
  // of this step, so there is nothing to add.
  StopFlag at_once;
  at_once.Request(StopKind::kKeepState);
  resumed.checkpoint_dir = NewDir("keep-again");
  Recorder again;
  TrainResult ra = Train(resumed, &again, &at_once);
  EXPECT_EQ(ra.outcome, TrainResult::Outcome::kStopped) << ra.reason;
  EXPECT_EQ(ra.step, 6);
  EXPECT_TRUE(again.log.empty()) << again.log.front();
}

TEST_F(TrainerTest, StopKeepingStateAtACheckpointStepAddsNothing) {
  TrainConfig c = Tiny();
  c.checkpoint_dir = NewDir("keep-at-4");
  c.checkpoint_interval_steps = 4;
  StopFlag stop;
  Recorder r;
  r.stop_after = 4;
  r.stop = &stop;
  r.stop_kind = StopKind::kKeepState;
  TrainResult result = Train(c, &r, &stop);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kStopped) << result.reason;
  EXPECT_EQ(result.step, 4);
  EXPECT_THAT(r.log, ::testing::ElementsAre("eval 0", "step 1", "step 2", "step 3", "step 4",
                                            "eval 4", "checkpoint 4"));
  // Without a checkpoint directory it stops at the step boundary.
  TrainConfig none = Tiny();
  Recorder n;
  StopFlag fresh;
  n.stop_after = 2;
  n.stop = &fresh;
  n.stop_kind = StopKind::kKeepState;
  result = Train(none, &n, &fresh);
  EXPECT_EQ(result.outcome, TrainResult::Outcome::kStopped);
  EXPECT_EQ(result.step, 2);
  EXPECT_TRUE(n.checkpoints.empty());
}

TEST(StopFlagTest, RequestsCombineByPrecedenceNotOrder) {
  StopFlag f;
  EXPECT_EQ(f.requested(), StopKind::kNone);
  f.Request(StopKind::kKeepState);
  EXPECT_EQ(f.requested(), StopKind::kKeepState);
  f.Request(StopKind::kPreempt);  // a preemption skips the evaluation
  EXPECT_EQ(f.requested(), StopKind::kPreempt);
  f.Request(StopKind::kKeepState);
  EXPECT_EQ(f.requested(), StopKind::kPreempt);
  f.Request(StopKind::kNow);  // a cancel wins
  EXPECT_EQ(f.requested(), StopKind::kNow);
  f.Request(StopKind::kPreempt);
  EXPECT_EQ(f.requested(), StopKind::kNow);
}

TEST_F(TrainerTest, PreemptCheckpointsTheStepWithoutEvaluatingAndResumesOnTheSameCurve) {
  TrainConfig c = Tiny();  // evaluations every 4 steps, a checkpoint only at the end
  c.max_steps = 12;
  Recorder full;
  ASSERT_EQ(Train(c, &full, nullptr).outcome, TrainResult::Outcome::kSucceeded);

  c.checkpoint_dir = NewDir("preempt");
  StopFlag stop;
  Recorder r;
  r.stop_after = 8;  // asked while step 8 is reported: it stops after step 8
  r.stop = &stop;
  r.stop_kind = StopKind::kPreempt;
  TrainResult result = Train(c, &r, &stop);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kPreempted) << result.reason;
  EXPECT_EQ(result.step, 8);
  EXPECT_THAT(result.reason, ::testing::HasSubstr("state kept in its checkpoint"));
  // Step 8 is on the evaluation schedule, but a preemption does not spend
  // the time: it checkpoints at once.
  EXPECT_THAT(r.log, ::testing::ElementsAre("eval 0", "step 1", "step 2", "step 3", "step 4",
                                            "eval 4", "step 5", "step 6", "step 7", "step 8",
                                            "checkpoint 8"));
  ASSERT_EQ(r.checkpoints.size(), 1u);
  EXPECT_EQ(r.checkpoints[0].tokens, r.steps.back().tokens);

  // The next attempt makes up the skipped evaluation, then continues the
  // uninterrupted run's curve bit for bit.
  TrainConfig resumed = c;
  resumed.checkpoint_dir = NewDir("preempt-resumed");
  resumed.resume_path = r.checkpoints[0].path;
  resumed.resume_sha256 = r.checkpoints[0].sha256;
  Recorder rest;
  TrainResult rr = Train(resumed, &rest, nullptr);
  ASSERT_EQ(rr.outcome, TrainResult::Outcome::kSucceeded) << rr.reason;
  EXPECT_EQ(rest.info.start_step, 8);
  ASSERT_FALSE(rest.log.empty());
  EXPECT_EQ(rest.log.front(), "eval 8");
  ASSERT_EQ(rest.steps.size(), 4u);
  for (size_t i = 0; i < rest.steps.size(); ++i) {
    EXPECT_EQ(rest.steps[i].step, full.steps[8 + i].step);
    EXPECT_EQ(rest.steps[i].train_loss, full.steps[8 + i].train_loss) << "step " << 9 + i;
    EXPECT_EQ(rest.steps[i].tokens, full.steps[8 + i].tokens);
  }
  ASSERT_EQ(full.evals.size(), 4u);  // 0, 4, 8, 12
  ASSERT_EQ(rest.evals.size(), 2u);  // 8, 12
  EXPECT_EQ(rest.evals[0].val_loss, full.evals[2].val_loss);
  EXPECT_EQ(rest.evals[1].val_loss, full.evals[3].val_loss);

  // Preempted again before its first step: its checkpoint is of this step,
  // so nothing is added.
  StopFlag at_once;
  at_once.Request(StopKind::kPreempt);
  Recorder again;
  rr = Train(resumed, &again, &at_once);
  EXPECT_EQ(rr.outcome, TrainResult::Outcome::kPreempted) << rr.reason;
  EXPECT_EQ(rr.step, 8);
  EXPECT_THAT(again.log, ::testing::ElementsAre("eval 8"));
}

// Asks for `first` then `second` in step 3's report, and notes when step 3
// was reported and when a checkpoint was.
class TwoRequests : public Recorder {
 public:
  TwoRequests(StopFlag* flag, StopKind first, StopKind second) : first_(first), second_(second) {
    stop = flag;
  }
  void OnStep(const StepMetrics& m) override {
    Recorder::OnStep(m);
    if (m.step != 3) return;
    step3_reported = std::chrono::steady_clock::now();
    stop->Request(first_);
    stop->Request(second_);
  }
  void OnCheckpoint(const CheckpointInfo& c) override {
    Recorder::OnCheckpoint(c);
    checkpoint_reported = std::chrono::steady_clock::now();
  }
  std::chrono::steady_clock::time_point step3_reported, checkpoint_reported;

 private:
  const StopKind first_, second_;
};

TEST_F(TrainerTest, PreemptWinsOverKeepingTheStateAndACancelWinsOverPreempt) {
  TrainConfig c = Tiny();
  c.checkpoint_dir = NewDir("preempt-over-keep");
  c.test_preempt_checkpoint_delay_seconds = 0.5;  // before the preemption's checkpoint only
  StopFlag keep_then_preempt;
  TwoRequests r(&keep_then_preempt, StopKind::kKeepState, StopKind::kPreempt);
  TrainResult result = Train(c, &r, &keep_then_preempt);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kPreempted) << result.reason;
  EXPECT_EQ(result.step, 3);
  ASSERT_GE(r.log.size(), 2u);
  EXPECT_THAT(std::vector<std::string>(r.log.end() - 2, r.log.end()),
              ::testing::ElementsAre("step 3", "checkpoint 3"));  // no evaluation
  EXPECT_GE(r.checkpoint_reported - r.step3_reported, std::chrono::milliseconds(500));

  c.checkpoint_dir = NewDir("cancel-over-preempt");
  StopFlag preempt_then_cancel;
  TwoRequests n(&preempt_then_cancel, StopKind::kPreempt, StopKind::kNow);
  result = Train(c, &n, &preempt_then_cancel);
  EXPECT_EQ(result.outcome, TrainResult::Outcome::kStopped) << result.reason;
  EXPECT_EQ(result.step, 3);
  EXPECT_TRUE(n.checkpoints.empty());

  // Without a checkpoint directory nothing can be kept: it stops at the
  // step boundary, still a preemption, and says so.
  c.checkpoint_dir.clear();
  StopFlag preempt;
  TwoRequests p(&preempt, StopKind::kPreempt, StopKind::kPreempt);
  result = Train(c, &p, &preempt);
  EXPECT_EQ(result.outcome, TrainResult::Outcome::kPreempted) << result.reason;
  EXPECT_EQ(result.step, 3);
  EXPECT_THAT(result.reason, ::testing::HasSubstr("no checkpoint could be kept"));
  EXPECT_TRUE(p.checkpoints.empty());
  EXPECT_EQ(p.log.back(), "step 3");
}

// A checkpoint rewritten with one field changed, resealed (a valid
// checksum), so only the trainer's checks stand between it and a resume.
struct Edit {
  std::string name;
  std::function<void(nlohmann::json* meta, std::vector<std::pair<std::string, at::Tensor>>*)> edit;
  std::string want;  // in the failure's reason
};

void ExpectResumeRefused(const TrainConfig& base, const std::string& checkpoint,
                         const std::vector<Edit>& edits, const std::string& dir) {
  auto data = ReadCheckpoint(checkpoint, "");
  ASSERT_TRUE(data.ok()) << data.status();
  int i = 0;
  for (const Edit& e : edits) {
    nlohmann::json meta = nlohmann::json::parse(data->metadata_json);
    CheckpointData bad = *data;
    for (auto& [name, t] : bad.tensors) t = t.clone();
    e.edit(&meta, &bad.tensors);
    bad.metadata_json = meta.is_string() ? meta.get<std::string>() : meta.dump();
    const std::string path = absl::StrCat(dir, "/bad-", i++, ".ckpt");
    auto sha = WriteCheckpoint(path, bad);
    ASSERT_TRUE(sha.ok()) << sha.status();
    TrainConfig c = base;
    c.checkpoint_dir.clear();
    c.resume_path = path;
    c.resume_sha256 = *sha;
    const TrainResult r = Train(c, nullptr, nullptr);
    EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed) << e.name << ": " << r.reason;
    EXPECT_NE(r.reason.find("resume: checkpoint " + path), std::string::npos)
        << e.name << ": " << r.reason;
    EXPECT_NE(r.reason.find(e.want), std::string::npos) << e.name << ": " << r.reason;
  }
}

using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

at::Tensor& Named(Tensors* t, const std::string& name) {
  for (auto& [n, v] : *t) {
    if (n == name) return v;
  }
  ADD_FAILURE() << "no tensor " << name;
  static at::Tensor none;
  return none;
}

TEST_F(TrainerTest, ResumeChecksEveryFieldOfTheCheckpoint) {
  TrainConfig c = Tiny();
  c.max_steps = 3;
  c.checkpoint_dir = NewDir("valid");
  Recorder a;
  ASSERT_EQ(Train(c, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(a.checkpoints.size(), 1u);
  auto set = [](const char* key, nlohmann::json v) {
    return [key, v](nlohmann::json* m, Tensors*) { (*m)[key] = v; };
  };
  const int64_t kHuge = 1000000000000;  // 1e12
  const std::string w = "model.layers.0.wqkv";
  std::vector<Edit> edits = {
      {"cursor row -1", set("cursor_row", -1), "cursor_row is -1 (expected between 0 and "},
      {"cursor row 1e12", set("cursor_row", kHuge), "cursor_row is 1000000000000"},
      {"cursor epoch -1", set("cursor_epoch", -1), "cursor_epoch is -1"},
      {"cursor epoch 1e12", set("cursor_epoch", kHuge), "cursor_epoch is 1000000000000"},
      {"step -1", set("step", -1), "step is -1 (expected >= 0)"},
      {"step past max_steps", set("step", kHuge), "past this job's training.max_steps (3)"},
      {"tokens -1", set("tokens", -1), "tokens is -1"},
      {"padding -1", set("padding_tokens", -1), "padding_tokens is -1"},
      {"tokens 1e12", set("tokens", kHuge), "more than 3 steps of this job's batch"},
      {"padding 1e12", set("padding_tokens", kHuge), "more than 3 steps of this job's batch"},
      {"no tokens", set("tokens", 0), "tokens is 0 after 3 steps"},
      {"optimizer step", set("optimizer_step", 4), "optimizer_step is 4"},
      {"step a string", set("step", "3"), "step is \"3\" (expected a 64-bit integer)"},
      {"step a float", set("step", 2.5), "step is 2.5"},
      {"step beyond int64", set("step", uint64_t{1} << 63), "expected a 64-bit integer"},
      {"step missing", [](nlohmann::json* m, Tensors*) { m->erase("step"); },
       "metadata field step is missing"},
      {"evaluated", set("evaluated", "yes"), "metadata field evaluated"},
      {"not an object", [](nlohmann::json* m, Tensors*) { *m = nlohmann::json::array(); },
       "metadata is not a JSON object"},
      {"not JSON", [](nlohmann::json* m, Tensors*) { *m = "{\"step\": "; },
       "metadata is not valid JSON"},
      {"fingerprint", [](nlohmann::json* m, Tensors*) {
         (*m)["fingerprint"] = absl::StrReplaceAll((*m)["fingerprint"].get<std::string>(),
                                                   {{"d_model=32", "d_model=64"}});
       }, "different job: d_model is 64 there and 32 in this job's spec"},
      {"tensor missing", [&](nlohmann::json*, Tensors* t) {
         t->erase(std::remove_if(t->begin(), t->end(),
                                 [&](const auto& p) { return p.first == "adamw.m." + w.substr(6); }),
                  t->end());
       }, "tensor adamw.m.layers.0.wqkv is missing"},
      {"tensor shape", [&](nlohmann::json*, Tensors* t) { Named(t, w) = at::zeros({3}); },
       "has shape [3] (expected [96, 32]"},
      {"tensor dtype", [&](nlohmann::json*, Tensors* t) { Named(t, w) = Named(t, w).to(at::kDouble); },
       "is Double (expected Float)"},
      {"tensor NaN", [&](nlohmann::json*, Tensors* t) { Named(t, w)[0][0] = NAN; },
       "tensor " + w + " holds NaN or Inf"},
      {"negative second moment",
       [&](nlohmann::json*, Tensors* t) { Named(t, "adamw.v." + w.substr(6))[1][2] = -1; },
       "holds negative values"},
      {"unknown tensor", [](nlohmann::json*, Tensors* t) { t->emplace_back("extra", at::ones({2})); },
       "tensor extra is not part of this model"},
      {"FP8 state in a non-FP8 job",
       [](nlohmann::json*, Tensors* t) { t->emplace_back("fp8.x.input", at::ones({19}, at::kDouble)); },
       "tensor fp8.x.input is not part of this model"},
  };
  ExpectResumeRefused(c, a.checkpoints[0].path, edits, NewDir("invalid"));
  // The same rewrite, unchanged, resumes.
  ExpectResumeRefused(c, a.checkpoints[0].path, {}, NewDir("invalid"));
  TrainConfig ok = c;
  ok.max_steps = 4;
  ok.checkpoint_dir.clear();
  ok.resume_path = a.checkpoints[0].path;
  Recorder b;
  TrainResult rb = Train(ok, &b, nullptr);
  ASSERT_EQ(rb.outcome, TrainResult::Outcome::kSucceeded) << rb.reason;
  EXPECT_EQ(b.info.start_step, 3);
}

TEST_F(TrainerTest, ResumeChecksTheFp8ScalingState) {
  TrainConfig c = Tiny();
  c.fp8 = true;
  c.max_steps = 2;
  c.checkpoint_dir = NewDir("fp8-valid");
  Recorder a;
  ASSERT_EQ(Train(c, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(a.checkpoints.size(), 1u);
  const std::string s = "fp8.layers.0.wqkv.input";
  auto state = [s](std::function<void(at::Tensor*)> f) {
    return [s, f](nlohmann::json*, Tensors* t) { f(&Named(t, s)); };
  };
  // Double[16 + 3]: history, scale, history length, steps.
  std::vector<Edit> edits = {
      {"scale", state([](at::Tensor* t) { (*t)[16] = -1.0; }), "scale is -1"},
      {"scale NaN", state([](at::Tensor* t) { (*t)[16] = NAN; }), "scale is nan"},
      {"amax Inf", state([](at::Tensor* t) { (*t)[0] = INFINITY; }),
       "amax history entry 0 is inf"},
      {"history length", state([](at::Tensor* t) { (*t)[17] = 40.0; }),
       "history length is 40 (expected an integer between 0 and 16)"},
      {"steps", state([](at::Tensor* t) { (*t)[18] = 1e12; }), "steps is 1e+12"},
      {"shape", state([](at::Tensor* t) { *t = at::zeros({7}, at::kDouble); }),
       "is Double [7] (expected Double [19]"},
      {"unknown site",
       [](nlohmann::json*, Tensors* t) { t->emplace_back("fp8.nowhere.input", at::zeros({19}, at::kDouble)); },
       "fp8.nowhere.input is not FP8 scaling state of this model"},
  };
  ExpectResumeRefused(c, a.checkpoints[0].path, edits, NewDir("fp8-invalid"));
}

TEST_F(TrainerTest, TestKnobsForceOverflowsAndACollapseAndValuesCastAreCounted) {
  TrainConfig c = Tiny();
  c.model.moe.num_experts = 4;
  c.model.moe.top_k = 2;
  c.fp8 = true;
  c.max_steps = 4;
  c.eval_interval_steps = 0;
  Recorder plain;
  TrainResult r = Train(c, &plain, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  TrainConfig forced = c;
  forced.fp8_recipe.test_overflow_fraction = 0.01;
  forced.model.moe.test_forced_expert = 0;
  forced.test_fp8_grouped_off = "refused by the test";
  Recorder f;
  r = Train(forced, &f, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(f.steps.size(), plain.steps.size());
  for (size_t i = 0; i < f.steps.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("step ", f.steps[i].step));
    const StepMetrics& p = plain.steps[i];
    const StepMetrics& m = f.steps[i];
    // Every linear casts its input, weight and output gradient: far more
    // values than tokens.
    EXPECT_GT(p.fp8_values, 10 * p.step_tokens);
    EXPECT_LE(p.fp8_overflows, p.fp8_values / 1000);
    // 1% of the inputs, about a third of the values cast: above the
    // alert's 0.1% and below the 1% at which the trainer fails a run.
    const double fraction = static_cast<double>(m.fp8_overflows) / m.fp8_values;
    EXPECT_GT(fraction, 0.002);
    EXPECT_LT(fraction, 0.006);
    for (const auto& layer : m.moe) EXPECT_EQ(layer.tokens_per_expert[0], m.step_tokens);
    EXPECT_DOUBLE_EQ(m.moe_max_over_mean_load, 2.0);  // E/k: the most there is
    // Every step says why grouped expert products are off; none while on.
    EXPECT_EQ(m.fp8_grouped_off, "refused by the test");
    EXPECT_EQ(p.fp8_grouped_off, "");
  }
  EXPECT_LT(plain.steps.back().moe_max_over_mean_load, 2.0);

  TrainConfig bad = forced;
  bad.model.moe.test_forced_expert = 4;
  r = Train(bad, nullptr, nullptr);
  EXPECT_NE(r.reason.find("model.moe.test_forced_expert"), std::string::npos) << r.reason;
  bad = forced;
  bad.fp8_recipe.recipe = precision::Recipe::kRowwise;
  r = Train(bad, nullptr, nullptr);
  EXPECT_NE(r.reason.find("fp8_recipe.test_overflow_fraction"), std::string::npos) << r.reason;
  bad.fp8_recipe.test_overflow_fraction = 1.5;
  r = Train(bad, nullptr, nullptr);
  EXPECT_NE(r.reason.find("between 0 and 1"), std::string::npos) << r.reason;
  // Knobs that do not apply to a job are ignored: a dense FP32 run.
  TrainConfig dense = Tiny();
  dense.max_steps = 2;
  dense.fp8_recipe.test_overflow_fraction = 0.01;
  dense.model.moe.test_forced_expert = 3;
  EXPECT_EQ(Train(dense, nullptr, nullptr).outcome, TrainResult::Outcome::kSucceeded);
}

TEST_F(TrainerTest, FailuresSayWhy) {
  TrainConfig missing = Tiny();
  missing.data.train_path = g_dir + "/nope/train";
  TrainResult r = Train(missing, nullptr, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("data.train_path"), std::string::npos) << r.reason;
  EXPECT_NE(r.reason.find("tally-prep"), std::string::npos) << r.reason;

  TrainConfig full = Tiny();
  full.max_steps = 2;
  full.checkpoint_dir = NewDir("fail");
  Recorder a;
  ASSERT_EQ(Train(full, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  TrainConfig wrong_sha = Tiny();
  wrong_sha.resume_path = a.checkpoints.back().path;
  wrong_sha.resume_sha256 = std::string(64, 'a');
  r = Train(wrong_sha, nullptr, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("but the checkpoint was recorded with"), std::string::npos)
      << r.reason;
  TrainConfig other_model = Tiny();
  other_model.model.d_model = 64;
  other_model.resume_path = a.checkpoints.back().path;
  r = Train(other_model, nullptr, nullptr);
  EXPECT_NE(r.reason.find("different job"), std::string::npos) << r.reason;

  TrainConfig bad = Tiny();
  bad.model.num_heads = 3;
  r = Train(bad, nullptr, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("num_heads"), std::string::npos) << r.reason;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void WriteFileBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST_F(TrainerTest, ADamagedResumeCheckpointIsNamedAndNoOtherFailureIs) {
  TrainConfig c = Tiny();
  c.max_steps = 4;
  c.checkpoint_interval_steps = 2;
  c.checkpoint_dir = NewDir("damage");
  Recorder a;
  ASSERT_EQ(Train(c, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(a.checkpoints.size(), 2u);  // steps 2 and 4
  const CheckpointInfo older = a.checkpoints[0], latest = a.checkpoints[1];
  const std::string original = ReadFileBytes(latest.path);
  // The trainer keeps the whole file's SHA-256 beside it.
  absl::StatusOr<std::string> sidecar = ReadChecksumFile(latest.path);
  ASSERT_TRUE(sidecar.ok()) << sidecar.status();
  EXPECT_EQ(*sidecar, latest.sha256);

  TrainConfig resume = c;
  resume.checkpoint_dir.clear();
  resume.max_steps = 6;
  resume.resume_path = latest.path;
  resume.resume_sha256 = latest.sha256;
  // A resealed rewrite: a valid internal checksum, another SHA-256.
  auto reseal = [&](const std::function<void(nlohmann::json*)>& edit) {
    auto data = ReadCheckpoint(latest.path, "");
    ASSERT_TRUE(data.ok()) << data.status();
    nlohmann::json meta = nlohmann::json::parse(data->metadata_json);
    edit(&meta);
    data->metadata_json = meta.is_string() ? meta.get<std::string>() : meta.dump();
    ASSERT_TRUE(WriteCheckpoint(latest.path, *data).ok());
  };
  struct Damage {
    std::string name;
    std::function<void()> apply;
    std::string want;  // in the reason
  };
  const std::vector<Damage> damages = {
      {"a flipped byte",
       [&] {
         std::string b = original;
         b[b.size() / 2] ^= 0x01;
         WriteFileBytes(latest.path, b);
       },
       "checksum mismatch"},
      {"truncated", [&] { WriteFileBytes(latest.path, original.substr(0, original.size() - 100)); },
       "checksum mismatch"},
      {"cut to nothing", [&] { WriteFileBytes(latest.path, ""); }, "bad magic or truncated"},
      {"deleted", [&] { std::filesystem::remove(latest.path); }, "not found"},
      {"an older file in its place",
       [&] { WriteFileBytes(latest.path, ReadFileBytes(older.path)); },
       absl::StrCat("SHA-256 is ", older.sha256, " but the checkpoint was recorded with ",
                    latest.sha256)},
      {"edited metadata with a valid internal checksum",
       [&] {
         reseal([](nlohmann::json* m) { (*m)["tokens"] = (*m)["tokens"].get<int64_t>() - 1; });
       },
       "but the checkpoint was recorded with " + latest.sha256},
  };
  for (const Damage& d : damages) {
    SCOPED_TRACE(d.name);
    WriteFileBytes(latest.path, original);
    d.apply();
    Recorder b;
    const TrainResult r = Train(resume, &b, nullptr);
    EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed) << r.reason;
    EXPECT_EQ(r.damaged_checkpoint, latest.path);
    EXPECT_THAT(r.reason, ::testing::HasSubstr("resume: checkpoint " + latest.path));
    EXPECT_THAT(r.reason, ::testing::HasSubstr(d.want));
    EXPECT_TRUE(b.steps.empty());
  }
  // Contents inconsistent in themselves, even under a SHA-256 that matches:
  // damaged too.
  WriteFileBytes(latest.path, original);
  reseal([](nlohmann::json* m) { *m = "{\"step\": "; });
  TrainConfig unreadable = resume;
  const std::string resealed = ReadFileBytes(latest.path);
  unreadable.resume_sha256 = data::Sha256Hex(resealed.data(), resealed.size());
  TrainResult r = Train(unreadable, nullptr, nullptr);
  EXPECT_EQ(r.damaged_checkpoint, latest.path) << r.reason;
  EXPECT_THAT(r.reason, ::testing::HasSubstr("metadata is not valid JSON"));

  // Not damage: an intact checkpoint that does not fit the run, this run's
  // own configuration or data, a damaged init_from.
  WriteFileBytes(latest.path, original);
  TrainConfig other_model = resume;
  other_model.model.d_model = 64;
  TrainConfig too_far = resume;
  too_far.max_steps = 3;
  TrainConfig no_data = resume;
  no_data.data.train_path = g_dir + "/nope/train";
  TrainConfig bad_init = Tiny();
  bad_init.max_steps = 1;
  bad_init.init_from_checkpoint = g_dir + "/damage/absent.ckpt";
  for (const auto& [name, config, want] :
       {std::tuple{"another model", other_model, "different job"},
        std::tuple{"past max_steps", too_far, "past this job's training.max_steps"},
        std::tuple{"no data", no_data, "data.train_path"},
        std::tuple{"init_from missing", bad_init, "model.init_from"}}) {
    SCOPED_TRACE(name);
    r = Train(config, nullptr, nullptr);
    EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
    EXPECT_EQ(r.damaged_checkpoint, "");
    EXPECT_THAT(r.reason, ::testing::HasSubstr(want));
  }
  // Restored, it resumes.
  Recorder b;
  r = Train(resume, &b, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  EXPECT_EQ(r.damaged_checkpoint, "");
  EXPECT_EQ(b.info.start_step, 4);
}

TEST_F(TrainerTest, InitialWeightsMustBeFiniteAndOfASaneMagnitude) {
  TrainConfig c = Tiny();
  c.max_steps = 1;
  c.checkpoint_dir = NewDir("init-source");
  Recorder a;
  ASSERT_EQ(Train(c, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  auto data = ReadCheckpoint(a.checkpoints[0].path, "");
  ASSERT_TRUE(data.ok()) << data.status();
  const std::string dir = NewDir("init-weights");
  for (const auto& [value, want] :
       {std::pair{3e38, "layers.0.wqkv holds a weight of magnitude 3e+38, above 1e+06"},
        std::pair{double{NAN}, "tensor model.layers.0.wqkv holds NaN or infinite values"}}) {
    SCOPED_TRACE(want);
    CheckpointData bad = *data;
    for (auto& [name, t] : bad.tensors) {
      t = t.clone();
      if (name == "model.layers.0.wqkv") t[1][2] = value;
    }
    const std::string path = dir + "/bad.ckpt";
    ASSERT_TRUE(WriteCheckpoint(path, bad).ok());
    TrainConfig f = Tiny();
    f.max_steps = 1;
    f.init_from_checkpoint = path;
    Recorder b;
    const TrainResult r = Train(f, &b, nullptr);
    EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
    EXPECT_THAT(r.reason, ::testing::HasSubstr("model.init_from"));
    EXPECT_THAT(r.reason, ::testing::HasSubstr(want));
    EXPECT_TRUE(b.evals.empty());
  }
}

TEST_F(TrainerTest, ANonFiniteEvaluationFailsTheRunAndIsNotReported) {
  TrainConfig c = Tiny();
  c.max_steps = 4;
  c.checkpoint_dir = NewDir("overflow");
  Recorder a;
  ASSERT_EQ(Train(c, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  auto data = ReadCheckpoint(a.checkpoints.back().path, "");
  ASSERT_TRUE(data.ok()) << data.status();
  // Finite weights whose products overflow float32: the output head at
  // +-3e38, and the step's evaluation left to the resumed run.
  nlohmann::json meta = nlohmann::json::parse(data->metadata_json);
  meta["evaluated"] = false;
  data->metadata_json = meta.dump();
  for (auto& [name, t] : data->tensors) {
    if (name == "model.head") t = at::where(at::randn(t.sizes()) > 0, 3e38, -3e38).to(at::kFloat);
  }
  const std::string path = NewDir("overflow-bad") + "/step-00000004.ckpt";
  auto sha = WriteCheckpoint(path, *data);
  ASSERT_TRUE(sha.ok()) << sha.status();
  TrainConfig resumed = Tiny();
  resumed.max_steps = 8;
  resumed.resume_path = path;
  resumed.resume_sha256 = *sha;
  Recorder b;
  const TrainResult r = Train(resumed, &b, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed) << r.reason;
  EXPECT_FALSE(r.retryable);
  EXPECT_EQ(r.damaged_checkpoint, "");
  EXPECT_THAT(r.reason, ::testing::HasSubstr("the evaluation at step 4 gave val_loss "));
  EXPECT_THAT(r.reason, ::testing::HasSubstr("largest magnitude is head (|weight| up to 3e+38)"));
  EXPECT_TRUE(b.evals.empty());  // never reported
  EXPECT_TRUE(b.steps.empty());
}

// Data parallel: ranks as threads of this process, joined by a real Gloo
// group on loopback (worker/dist).
struct RankRun {
  TrainConfig config;
  Recorder events;
  StopFlag stop;
  TrainResult result;
};

// Runs configs[r] as rank r of configs.size(), each on its own thread;
// requested[r], when given, is asked of rank r before the ranks start.
std::vector<std::unique_ptr<RankRun>> TrainRanks(const std::vector<TrainConfig>& configs,
                                                 const std::vector<StopKind>& requested = {}) {
  const std::string address = absl::StrCat("127.0.0.1:", dist::FreeLoopbackPort());
  std::vector<std::unique_ptr<RankRun>> runs;
  for (size_t r = 0; r < configs.size(); ++r) {
    runs.push_back(std::make_unique<RankRun>());
    runs.back()->config = configs[r];
    runs.back()->config.parallel.rank = static_cast<int>(r);
    runs.back()->config.parallel.world_size = static_cast<int>(configs.size());
    runs.back()->config.parallel.rendezvous = address;
    runs.back()->config.parallel.rendezvous_prefix = "test";
    runs.back()->config.parallel.collective_timeout_seconds = 30;
    runs.back()->events.stop = &runs.back()->stop;
    if (r < requested.size()) runs.back()->stop.Request(requested[r]);
  }
  std::vector<std::thread> threads;
  for (auto& run : runs) {
    threads.emplace_back([r = run.get()] { r->result = Train(r->config, &r->events, &r->stop); });
  }
  for (auto& t : threads) t.join();
  return runs;
}

void ExpectSameCurve(const Recorder& one, const Recorder& many, double rel) {
  ASSERT_EQ(one.steps.size(), many.steps.size());
  for (size_t i = 0; i < one.steps.size(); ++i) {
    EXPECT_EQ(one.steps[i].tokens, many.steps[i].tokens);
    EXPECT_EQ(one.steps[i].padding_tokens, many.steps[i].padding_tokens);
    EXPECT_NEAR(many.steps[i].train_loss, one.steps[i].train_loss,
                rel * one.steps[i].train_loss)
        << "step " << one.steps[i].step;
  }
  ASSERT_EQ(one.evals.size(), many.evals.size());
  for (size_t i = 0; i < one.evals.size(); ++i) {
    EXPECT_EQ(one.evals[i].target_tokens, many.evals[i].target_tokens);
    EXPECT_NEAR(many.evals[i].val_loss, one.evals[i].val_loss, rel * one.evals[i].val_loss);
  }
}

TEST_F(TrainerTest, TwoRanksTakeTheStepsOfOneProcess) {
  TrainConfig c = Tiny();
  c.max_steps = 20;
  c.checkpoint_dir = NewDir("dp-one");
  c.checkpoint_interval_steps = 10;
  Recorder one;
  ASSERT_EQ(Train(c, &one, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  c.checkpoint_dir = NewDir("dp-two");
  c.parallel.param_check_interval_steps = 5;
  auto ranks = TrainRanks({c, c});
  for (const auto& r : ranks) {
    ASSERT_EQ(r->result.outcome, TrainResult::Outcome::kSucceeded) << r->result.reason;
  }
  EXPECT_EQ(ranks[0]->events.info.world_size, 2);
  EXPECT_EQ(ranks[0]->events.info.backend, "gloo");
  ExpectSameCurve(one, ranks[0]->events, 1e-5);
  // Rank 0 alone reports and writes checkpoints.
  EXPECT_TRUE(ranks[1]->events.steps.empty());
  EXPECT_TRUE(ranks[1]->events.checkpoints.empty());
  ASSERT_EQ(ranks[0]->events.checkpoints.size(), 2u);

  // Its checkpoint resumes in a single process on the same curve.
  TrainConfig resumed = c;
  resumed.checkpoint_dir = NewDir("dp-resumed");
  resumed.resume_path = ranks[0]->events.checkpoints[0].path;
  Recorder rest;
  ASSERT_EQ(Train(resumed, &rest, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(rest.steps.size(), 10u);
  for (size_t i = 0; i < rest.steps.size(); ++i) {
    EXPECT_NEAR(rest.steps[i].train_loss, one.steps[10 + i].train_loss,
                1e-5 * one.steps[10 + i].train_loss);
  }
}

TEST_F(TrainerTest, TwoRanksWithMoeAndFp8) {
  TrainConfig c = Tiny();
  c.max_steps = 10;
  c.global_batch_tokens = 2048;  // four micro-batches, two per rank
  c.model.moe.num_experts = 4;
  c.model.moe.top_k = 2;
  c.optimizer.moe_aux_loss_coef = 0.01;
  c.optimizer.moe_bias_balancing = true;
  c.fp8 = true;
  Recorder one;
  ASSERT_EQ(Train(c, &one, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  c.parallel.param_check_interval_steps = 1;  // biases and FP8 scales must agree too
  auto ranks = TrainRanks({c, c});
  for (const auto& r : ranks) {
    ASSERT_EQ(r->result.outcome, TrainResult::Outcome::kSucceeded) << r->result.reason;
  }
  ExpectSameCurve(one, ranks[0]->events, 1e-3);
  // Loads are summed over ranks: the same tokens the single process routed.
  const auto& a = one.steps.back().moe[0].tokens_per_expert;
  const auto& b = ranks[0]->events.steps.back().moe[0].tokens_per_expert;
  EXPECT_EQ(std::accumulate(a.begin(), a.end(), int64_t{0}),
            std::accumulate(b.begin(), b.end(), int64_t{0}));
  EXPECT_DOUBLE_EQ(ranks[0]->events.steps.back().fp8_product_fraction, 1.0);
}

TEST_F(TrainerTest, ExpertParallelRanksTakeTheStepsOfOneProcess) {
  TrainConfig c = Tiny();
  c.max_steps = 10;
  c.global_batch_tokens = 2048;
  c.eval_tokens = 4800;  // an uneven number of chunks for two ranks
  c.model.moe.num_experts = 4;
  c.model.moe.top_k = 2;
  c.optimizer.moe_aux_loss_coef = 0.01;
  c.optimizer.moe_bias_balancing = true;
  c.model.moe.capacity_factor = 1.25;  // drops are decided per rank and micro-batch
  c.checkpoint_dir = NewDir("ep-one");
  c.checkpoint_interval_steps = 5;
  Recorder one;
  ASSERT_EQ(Train(c, &one, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  c.parallel.expert_parallel = true;
  c.parallel.param_check_interval_steps = 1;
  std::string sharded_checkpoint;  // step 5 of the FP32 run
  for (bool fp8 : {false, true}) {
    c.fp8 = fp8;
    c.checkpoint_dir = NewDir(fp8 ? "ep-fp8" : "ep-two");
    Recorder reference;
    if (fp8) {
      TrainConfig single = c;
      single.parallel.expert_parallel = false;
      ASSERT_EQ(Train(single, &reference, nullptr).outcome, TrainResult::Outcome::kSucceeded);
    }
    auto ranks = TrainRanks({c, c});
    for (const auto& r : ranks) {
      ASSERT_EQ(r->result.outcome, TrainResult::Outcome::kSucceeded) << r->result.reason;
    }
    EXPECT_TRUE(ranks[0]->events.info.expert_parallel);
    ExpectSameCurve(fp8 ? reference : one, ranks[0]->events, fp8 ? 1e-3 : 1e-5);
    const auto& got = ranks[0]->events.steps.back().moe[0].tokens_per_expert;
    const auto& want = (fp8 ? reference : one).steps.back().moe[0].tokens_per_expert;
    // The same routing, token for token, in FP32. In FP8 an expert scales
    // its first inputs from both ranks' tokens at once, so routing (and what
    // capacity drops) drifts apart, within the loss tolerance above.
    if (!fp8) EXPECT_EQ(got, want);
    // Each rank holds its two experts of four, and their optimizer state.
    // Two experts' weights fewer per MoE layer: as many as a token skips
    // with top-2 of four, so what a rank holds is what a token uses.
    const RunInfo& info = ranks[0]->events.info;
    EXPECT_EQ(info.num_parameters, one.info.num_parameters);
    EXPECT_EQ(info.num_resident_parameters, one.info.num_active_parameters);
    EXPECT_EQ(one.info.num_resident_parameters, one.info.num_parameters);
    if (!fp8) {
      ASSERT_FALSE(ranks[0]->events.checkpoints.empty());
      sharded_checkpoint = ranks[0]->events.checkpoints[0].path;
    }
  }

  // Checkpoints hold the whole model, so either side resumes the other's.
  TrainConfig single = c;
  single.fp8 = false;
  single.parallel.expert_parallel = false;
  single.checkpoint_dir = NewDir("ep-single-resumed");
  single.resume_path = sharded_checkpoint;
  Recorder rest;
  ASSERT_EQ(Train(single, &rest, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  TrainConfig sharded = c;
  sharded.fp8 = false;
  sharded.checkpoint_dir = NewDir("ep-two-resumed");
  sharded.resume_path = one.checkpoints[0].path;
  auto ranks = TrainRanks({sharded, sharded});
  ASSERT_EQ(ranks[0]->result.outcome, TrainResult::Outcome::kSucceeded) << ranks[0]->result.reason;
  for (const Recorder* r : {&rest, &ranks[0]->events}) {
    ASSERT_EQ(r->steps.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_NEAR(r->steps[i].train_loss, one.steps[5 + i].train_loss,
                  1e-5 * one.steps[5 + i].train_loss);
    }
  }
}

TEST_F(TrainerTest, RanksStopTogether) {
  TrainConfig c = Tiny();
  std::vector<TrainConfig> cs = {c, c};
  // Only rank 1 is told to stop (after its step 3 ends): both stop at the
  // end of the next step, which neither applies.
  const std::string address = absl::StrCat("127.0.0.1:", dist::FreeLoopbackPort());
  RankRun r0, r1;
  for (auto* r : {&r0, &r1}) {
    r->config = c;
    r->config.parallel.world_size = 2;
    r->config.parallel.rendezvous = address;
  }
  r1.config.parallel.rank = 1;
  std::thread t0([&] { r0.result = Train(r0.config, &r0.events, &r0.stop); });
  std::thread t1([&] {
    // Rank 1 reports nothing, so stop it from rank 0's reports.
    while (r0.events.steps.size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    r1.stop.Request(StopKind::kNow);
  });
  std::thread t2([&] { r1.result = Train(r1.config, &r1.events, &r1.stop); });
  t0.join();
  t1.join();
  t2.join();
  EXPECT_EQ(r0.result.outcome, TrainResult::Outcome::kStopped) << r0.result.reason;
  EXPECT_EQ(r1.result.outcome, TrainResult::Outcome::kStopped) << r1.result.reason;
  EXPECT_EQ(r0.result.step, r1.result.step);
  EXPECT_LT(r0.result.step, c.max_steps);
}

TEST_F(TrainerTest, RanksStopTogetherKeepingTheState) {
  TrainConfig c = Tiny();
  c.checkpoint_dir = NewDir("dp-keep");
  // Rank 1 alone is asked to keep the state, rank 0 to stop at once, in the
  // same step: keeping the state wins, both finish that step, evaluate it and
  // checkpoint it together, and rank 0 writes. Both requests are made before
  // the ranks start: each rank reads its own request once per step, so
  // requests made while they run can land in different steps (rank 0's
  // "now" a step before rank 1's "keep"), and then "now" rightly wins.
  const std::string address = absl::StrCat("127.0.0.1:", dist::FreeLoopbackPort());
  RankRun r0, r1;
  for (auto* r : {&r0, &r1}) {
    r->config = c;
    r->config.parallel.world_size = 2;
    r->config.parallel.rendezvous = address;
  }
  r1.config.parallel.rank = 1;
  r1.stop.Request(StopKind::kKeepState);
  r0.stop.Request(StopKind::kNow);
  std::thread t0([&] { r0.result = Train(r0.config, &r0.events, &r0.stop); });
  std::thread t1([&] { r1.result = Train(r1.config, &r1.events, &r1.stop); });
  t0.join();
  t1.join();
  ASSERT_EQ(r0.result.outcome, TrainResult::Outcome::kStopped) << r0.result.reason;
  ASSERT_EQ(r1.result.outcome, TrainResult::Outcome::kStopped) << r1.result.reason;
  const int64_t step = r0.result.step;
  EXPECT_EQ(r1.result.step, step);
  EXPECT_GE(step, 1);
  EXPECT_LT(step, c.max_steps);
  ASSERT_GE(r0.events.log.size(), 3u);
  const std::vector<std::string> tail(r0.events.log.end() - 3, r0.events.log.end());
  EXPECT_EQ(tail[0], absl::StrCat("step ", step));
  if (step % c.eval_interval_steps != 0) {
    EXPECT_EQ(tail[1], absl::StrCat("eval ", step));
  }
  EXPECT_EQ(tail[2], absl::StrCat("checkpoint ", step));
  EXPECT_TRUE(r1.events.log.empty());
  ASSERT_EQ(r0.events.checkpoints.size(), 1u);
  // One process resumes it where the ranks stopped.
  TrainConfig resumed = Tiny();
  resumed.max_steps = step + 1;
  resumed.resume_path = r0.events.checkpoints[0].path;
  resumed.resume_sha256 = r0.events.checkpoints[0].sha256;
  Recorder rest;
  TrainResult rr = Train(resumed, &rest, nullptr);
  ASSERT_EQ(rr.outcome, TrainResult::Outcome::kSucceeded) << rr.reason;
  EXPECT_EQ(rest.info.start_step, step);
}

TEST_F(TrainerTest, OneRanksPreemptionCheckpointsEveryRankAndResumesOnTheSameCurve) {
  TrainConfig c = Tiny();
  c.max_steps = 6;
  c.eval_interval_steps = 1;  // so that step 1 has an evaluation to skip
  auto full = TrainRanks({c, c});
  for (const auto& r : full) {
    ASSERT_EQ(r->result.outcome, TrainResult::Outcome::kSucceeded) << r->result.reason;
  }
  // Only rank 1 is preempted, before the ranks start (each reads its own
  // flag once per step, so a request made while they run lands in whatever
  // step it lands in): both finish step 1, skip its evaluation, checkpoint
  // it together (rank 0 writes) and stop as preempted.
  c.checkpoint_dir = NewDir("dp-preempt");
  auto ranks = TrainRanks({c, c}, {StopKind::kNone, StopKind::kPreempt});
  for (const auto& r : ranks) {
    ASSERT_EQ(r->result.outcome, TrainResult::Outcome::kPreempted) << r->result.reason;
    EXPECT_EQ(r->result.step, 1);
    EXPECT_THAT(r->result.reason, ::testing::HasSubstr("state kept in its checkpoint"));
  }
  EXPECT_THAT(ranks[0]->events.log, ::testing::ElementsAre("eval 0", "step 1", "checkpoint 1"));
  EXPECT_TRUE(ranks[1]->events.log.empty());
  ASSERT_EQ(ranks[0]->events.checkpoints.size(), 1u);

  // Two ranks resume it: the skipped evaluation first, then the
  // uninterrupted run's curve.
  TrainConfig resumed = c;
  resumed.checkpoint_dir = NewDir("dp-preempt-resumed");
  resumed.resume_path = ranks[0]->events.checkpoints[0].path;
  resumed.resume_sha256 = ranks[0]->events.checkpoints[0].sha256;
  auto rest = TrainRanks({resumed, resumed});
  ASSERT_EQ(rest[0]->result.outcome, TrainResult::Outcome::kSucceeded) << rest[0]->result.reason;
  const Recorder& want = full[0]->events;
  const Recorder& got = rest[0]->events;
  EXPECT_EQ(got.info.start_step, 1);
  ASSERT_FALSE(got.log.empty());
  EXPECT_EQ(got.log.front(), "eval 1");
  ASSERT_EQ(got.steps.size(), 5u);
  for (size_t i = 0; i < got.steps.size(); ++i) {
    EXPECT_EQ(got.steps[i].step, want.steps[1 + i].step);
    EXPECT_EQ(got.steps[i].train_loss, want.steps[1 + i].train_loss) << "step " << 2 + i;
  }
  ASSERT_EQ(want.evals.size(), 7u);  // 0, 1, ..., 6
  ASSERT_EQ(got.evals.size(), 6u);   // 1, ..., 6
  for (size_t i = 0; i < got.evals.size(); ++i) {
    EXPECT_EQ(got.evals[i].val_loss, want.evals[1 + i].val_loss) << "eval " << 1 + i;
  }
}

TEST_F(TrainerTest, ALostRankFailsTheOthersRetryably) {
  // Rank 1 joins the group and leaves at once, as a killed process would
  // (its connections close): rank 0's first collective fails.
  TrainConfig c = Tiny();
  c.parallel.world_size = 2;
  c.parallel.rendezvous = absl::StrCat("127.0.0.1:", dist::FreeLoopbackPort());
  c.parallel.rendezvous_prefix = "lost";
  std::thread leaver([&] {
    dist::GroupOptions o;
    o.rank = 1;
    o.world_size = 2;
    o.store_address = c.parallel.rendezvous;
    o.prefix = c.parallel.rendezvous_prefix;
    auto g = dist::Group::Create(o);
    EXPECT_TRUE(g.ok()) << g.status();
  });
  TrainResult r = Train(c, nullptr, nullptr);
  leaver.join();
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_TRUE(r.retryable);
  EXPECT_NE(r.reason.find("a rank was lost"), std::string::npos) << r.reason;
}

TEST_F(TrainerTest, DataParallelConfigErrorsNameTheField) {
  TrainConfig c = Tiny();
  c.parallel.world_size = 3;  // two micro-batches a step do not split three ways
  c.parallel.rendezvous = "127.0.0.1:1";
  TrainResult r = Train(c, nullptr, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("global_batch_tokens"), std::string::npos) << r.reason;
  c.parallel.world_size = 2;
  c.parallel.rendezvous.clear();
  r = Train(c, nullptr, nullptr);
  EXPECT_NE(r.reason.find("rendezvous"), std::string::npos) << r.reason;
  c.parallel.rendezvous = "127.0.0.1:1";
  c.parallel.collective_timeout_seconds = 1;
  r = Train(c, nullptr, nullptr);  // rank 0 cannot bind port 1 (or nobody joins)
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("rendezvous"), std::string::npos) << r.reason;
  EXPECT_TRUE(r.retryable);
}

}  // namespace
}  // namespace tally::train
