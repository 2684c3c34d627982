// The trainer end to end on a real corpus (fortunes, installed by
// scripts/setup.sh): golden losses, exact resume, failures with reasons.
#include "worker/train/trainer.h"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset.h"
#include "worker/data/tokenizer.h"
#include "worker/dist/free_port.h"
#include "worker/dist/group.h"

namespace tally::train {
namespace {

std::string g_dir;

class Recorder : public TrainEvents {
 public:
  void OnStart(const RunInfo& i) override { info = i; }
  void OnStep(const StepMetrics& m) override {
    steps.push_back(m);
    if (stop_after > 0 && m.step >= stop_after && stop) stop->store(true);
  }
  void OnEval(const EvalMetrics& e) override { evals.push_back(e); }
  void OnCheckpoint(const CheckpointInfo& c) override { checkpoints.push_back(c); }
  RunInfo info;
  std::vector<StepMetrics> steps;
  std::vector<EvalMetrics> evals;
  std::vector<CheckpointInfo> checkpoints;
  int64_t stop_after = 0;
  std::atomic<bool>* stop = nullptr;
};

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);  // the golden file is for one thread
    char dir[] = "/tmp/tally_trainer_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    g_dir = dir;
    const std::string fortunes = "/usr/share/games/fortunes/";
    auto write = [&](const std::string& prefix, std::vector<std::string> files) {
      auto w = data::DatasetWriter::Create(prefix);
      ASSERT_TRUE(w.ok()) << w.status();
      for (const auto& f : files) {
        absl::Status s = data::ReadCorpusFile(
            fortunes + f, {}, [&](absl::string_view text, const data::DocumentSource&) {
              std::vector<uint16_t> t;
              data::ByteTokenizer::Encode(text, &t);
              return (*w)->Add(t);
            });
        ASSERT_TRUE(s.ok()) << s << " (scripts/setup.sh installs the fortunes package)";
      }
      ASSERT_TRUE((*w)->Finish("").ok());
    };
    write(g_dir + "/train", {"fortunes.u8", "science.u8", "literature.u8"});
    write(g_dir + "/val", {"people.u8"});
  }

  static TrainConfig Tiny() {
    TrainConfig c;
    c.num_layers = 2;
    c.d_model = 32;
    c.num_heads = 2;
    c.train_path = g_dir + "/train";
    c.seq_len = 128;
    c.micro_batch_rows = 4;
    c.global_batch_tokens = 1024;  // two micro-batches a step
    c.max_steps = 30;
    c.lr = 3e-3;
    c.warmup_steps = 3;
    c.grad_clip = 1.0;
    c.weight_decay = 0.1;
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

  for (Fp8Recipe recipe : {Fp8Recipe::kCurrent, Fp8Recipe::kRowwise}) {
    TrainConfig other = fp8;
    other.fp8_recipe = recipe;
    Recorder c;
    ASSERT_EQ(Train(other, &c, nullptr).outcome, TrainResult::Outcome::kSucceeded);
    EXPECT_LT(std::abs(c.evals.back().val_loss - v32) / v32, 0.015);
    EXPECT_DOUBLE_EQ(c.steps.back().fp8_product_fraction, 1.0);
  }
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
  c.moe_num_experts = 4;
  c.moe_top_k = 2;
  c.moe_aux_loss_coef = 0.01;
  c.moe_z_loss_coef = 1e-3;
  c.moe_bias_balancing = true;
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
    c.packing = mode;
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
  std::atomic<bool> stop{false};
  Recorder r;
  r.stop_after = 3;
  r.stop = &stop;
  TrainResult result = Train(Tiny(), &r, &stop);
  EXPECT_EQ(result.outcome, TrainResult::Outcome::kStopped);
  EXPECT_EQ(result.step, 3);
  EXPECT_EQ(r.steps.size(), 3u);
}

TEST_F(TrainerTest, FailuresSayWhy) {
  TrainConfig missing = Tiny();
  missing.train_path = g_dir + "/nope/train";
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
  EXPECT_NE(r.reason.find("tallyd recorded"), std::string::npos) << r.reason;
  TrainConfig other_model = Tiny();
  other_model.d_model = 64;
  other_model.resume_path = a.checkpoints.back().path;
  r = Train(other_model, nullptr, nullptr);
  EXPECT_NE(r.reason.find("different job"), std::string::npos) << r.reason;

  TrainConfig bad = Tiny();
  bad.num_heads = 3;
  r = Train(bad, nullptr, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("num_heads"), std::string::npos) << r.reason;
}

// Data parallel: ranks as threads of this process, joined by a real Gloo
// group on loopback (worker/dist).
struct RankRun {
  TrainConfig config;
  Recorder events;
  std::atomic<bool> stop{false};
  TrainResult result;
};

// Runs configs[r] as rank r of configs.size(), each on its own thread.
std::vector<std::unique_ptr<RankRun>> TrainRanks(const std::vector<TrainConfig>& configs) {
  const std::string address = absl::StrCat("127.0.0.1:", dist::FreeLoopbackPort());
  std::vector<std::unique_ptr<RankRun>> runs;
  for (size_t r = 0; r < configs.size(); ++r) {
    runs.push_back(std::make_unique<RankRun>());
    runs.back()->config = configs[r];
    runs.back()->config.rank = static_cast<int>(r);
    runs.back()->config.world_size = static_cast<int>(configs.size());
    runs.back()->config.rendezvous = address;
    runs.back()->config.rendezvous_prefix = "test";
    runs.back()->config.collective_timeout_seconds = 30;
    runs.back()->events.stop = &runs.back()->stop;
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
  c.param_check_interval_steps = 5;
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
  c.moe_num_experts = 4;
  c.moe_top_k = 2;
  c.moe_aux_loss_coef = 0.01;
  c.moe_bias_balancing = true;
  c.fp8 = true;
  Recorder one;
  ASSERT_EQ(Train(c, &one, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  c.param_check_interval_steps = 1;  // biases and FP8 scales must agree too
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
  c.moe_num_experts = 4;
  c.moe_top_k = 2;
  c.moe_aux_loss_coef = 0.01;
  c.moe_bias_balancing = true;
  c.moe_capacity_factor = 1.25;  // drops are decided per rank and micro-batch
  c.checkpoint_dir = NewDir("ep-one");
  c.checkpoint_interval_steps = 5;
  Recorder one;
  ASSERT_EQ(Train(c, &one, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  c.moe_expert_parallel = true;
  c.param_check_interval_steps = 1;
  std::string sharded_checkpoint;  // step 5 of the FP32 run
  for (bool fp8 : {false, true}) {
    c.fp8 = fp8;
    c.checkpoint_dir = NewDir(fp8 ? "ep-fp8" : "ep-two");
    Recorder reference;
    if (fp8) {
      TrainConfig single = c;
      single.moe_expert_parallel = false;
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
  single.moe_expert_parallel = false;
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
    r->config.world_size = 2;
    r->config.rendezvous = address;
  }
  r1.config.rank = 1;
  std::thread t0([&] { r0.result = Train(r0.config, &r0.events, &r0.stop); });
  std::thread t1([&] {
    // Rank 1 reports nothing, so stop it from rank 0's reports.
    while (r0.events.steps.size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    r1.stop.store(true);
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

TEST_F(TrainerTest, ALostRankFailsTheOthersRetryably) {
  // Rank 1 joins the group and leaves at once, as a killed process would
  // (its connections close): rank 0's first collective fails.
  TrainConfig c = Tiny();
  c.world_size = 2;
  c.rendezvous = absl::StrCat("127.0.0.1:", dist::FreeLoopbackPort());
  c.rendezvous_prefix = "lost";
  std::thread leaver([&] {
    dist::GroupOptions o;
    o.rank = 1;
    o.world_size = 2;
    o.store_address = c.rendezvous;
    o.prefix = c.rendezvous_prefix;
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
  c.world_size = 3;  // two micro-batches a step do not split three ways
  c.rendezvous = "127.0.0.1:1";
  TrainResult r = Train(c, nullptr, nullptr);
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("global_batch_tokens"), std::string::npos) << r.reason;
  c.world_size = 2;
  c.rendezvous.clear();
  r = Train(c, nullptr, nullptr);
  EXPECT_NE(r.reason.find("rendezvous"), std::string::npos) << r.reason;
  c.rendezvous = "127.0.0.1:1";
  c.collective_timeout_seconds = 1;
  r = Train(c, nullptr, nullptr);  // rank 0 cannot bind port 1 (or nobody joins)
  EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
  EXPECT_NE(r.reason.find("rendezvous"), std::string::npos) << r.reason;
  EXPECT_TRUE(r.retryable);
}

}  // namespace
}  // namespace tally::train
