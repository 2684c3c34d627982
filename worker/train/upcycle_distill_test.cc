// Changing the model, not just the recipe: sparse upcycling (a dense model's
// weights become a Mixture-of-Experts model's, model.init_from.upcycle) and
// distillation (a teacher's softened predictions in the loss,
// training.distill), on the model alone and through the trainer on a real
// corpus.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/model/transformer.h"
#include "worker/train/checkpoint.h"
#include "worker/train/model_io.h"
#include "worker/train/step.h"
#include "worker/data/test_fortunes.h"
#include "worker/train/trainer.h"

namespace tally::train {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// ---- Upcycling on the model alone ----

model::ModelConfig Dense() {
  model::ModelConfig c;
  c.num_layers = 3;
  c.d_model = 32;
  c.num_heads = 2;
  c.vocab_size = 258;
  return c;
}

model::ModelInput Batch() {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  const int64_t B = 2, T = 24;
  model::ModelInput in;
  in.tokens_BT = at::randint(0, 258, {B, T}, gen, at::kLong);
  // Two documents in the first row, one in the second.
  in.positions_BT = at::arange(T, at::kLong).repeat({B, 1});
  in.positions_BT[0].narrow(0, 10, T - 10).copy_(at::arange(T - 10, at::kLong));
  in.segments_BT = at::zeros({B, T}, at::kLong);
  in.segments_BT[0].narrow(0, 10, T - 10).fill_(1);
  in.real_BT = at::ones({B, T}, at::kBool);
  return in;
}

// A trained-looking dense model: its seeded init, with the norm gains moved
// off 1 so that a copy that missed them would show.
InitialWeights DenseWeights(const model::Transformer& dense) {
  InitialWeights w;
  w.source = "dense.ckpt";
  w.config = dense.config();
  for (const auto& p : dense.parameters()) w.parameters[p.name] = p.value.detach().clone();
  return w;
}

// Builds `target` and copies `w` into it, leaving keep_init alone.
at::Tensor UpcycledLogits(const model::ModelConfig& target, const InitialWeights& w) {
  model::Transformer moe(target, /*seed=*/5, at::kCPU);
  at::NoGradGuard no_grad;
  for (auto& p : moe.parameters()) {
    if (w.keep_init.count(p.name)) continue;
    p.value.copy_(w.parameters.at(p.name));
  }
  return moe.Forward(Batch(), model::AttentionKernel::kMaskedSdpa);
}

// With noise 0 every expert is the dense feed-forward and a token's gates
// sum to 1, so the upcycled model computes the dense model's logits, for
// every layer pattern, top-k and router upcycling allows.
TEST(UpcycleTest, LogitsEqualTheDenseModelsAtStepZero) {
  model::Transformer dense(Dense(), /*seed=*/3, at::kCPU);
  {
    at::NoGradGuard no_grad;
    for (auto& p : dense.parameters()) {
      if (p.name.find("norm") != std::string::npos) p.value.uniform_(0.5, 1.5);
    }
  }
  const at::Tensor want = dense.Forward(Batch(), model::AttentionKernel::kMaskedSdpa);
  for (int64_t every : {1, 2, 3}) {
    for (int64_t top_k : {2, 4}) {
      for (bool sigmoid : {false, true}) {
        SCOPED_TRACE(absl::StrCat("every_n_layers ", every, ", top_k ", top_k,
                                  sigmoid ? ", sigmoid" : ", softmax"));
        model::ModelConfig target = Dense();
        target.d_ff = 0;
        target.moe.num_experts = 4;
        target.moe.top_k = top_k;
        target.moe.every_n_layers = every;
        target.moe.sigmoid_router = sigmoid;
        InitialWeights w = DenseWeights(dense);
        ASSERT_TRUE(UpcycleWeights(0.0, 1, &target, &w).ok());
        EXPECT_EQ(target.d_ff, dense.config().d_ff);
        // Routers keep the MoE model's own init; no dense FFN weight is left
        // on an MoE layer.
        for (int64_t l = 0; l < 3; ++l) {
          const bool moe_layer = l % every == every - 1;
          EXPECT_EQ(w.keep_init.count(absl::StrCat("layers.", l, ".router")), moe_layer ? 1u : 0u);
          EXPECT_EQ(w.parameters.count(absl::StrCat("layers.", l, ".w1")), moe_layer ? 0u : 1u);
        }
        const at::Tensor got = UpcycledLogits(target, w);
        const double diff = (got - want).abs().max().item<double>();
        EXPECT_LT(diff, 1e-5 * std::max(1.0, want.abs().max().item<double>()));
        EXPECT_EQ(w.provenance["upcycled"]["num_experts"], 4);
      }
    }
  }
}

// Noise breaks the experts' symmetry, and moves the logits in proportion to
// its size.
TEST(UpcycleTest, NoiseMovesTheLogitsInProportion) {
  model::Transformer dense(Dense(), /*seed=*/3, at::kCPU);
  const at::Tensor want = dense.Forward(Batch(), model::AttentionKernel::kMaskedSdpa);
  std::vector<double> diffs;
  for (double noise : {1e-3, 1e-2}) {
    model::ModelConfig target = Dense();
    target.moe.num_experts = 4;
    target.moe.top_k = 2;
    InitialWeights w = DenseWeights(dense);
    ASSERT_TRUE(UpcycleWeights(noise, 1, &target, &w).ok());
    const at::Tensor w1 = w.parameters.at("layers.0.experts.w1");
    EXPECT_FALSE(at::equal(w1[0], w1[1])) << "experts differ";
    at::Tensor dense_w1;
    for (const auto& p : dense.parameters()) {
      if (p.name == "layers.0.w1") dense_w1 = p.value.detach();
    }
    const double spread = (w1[0] - dense_w1).std().item<double>();
    EXPECT_NEAR(spread, noise, 0.1 * noise);
    diffs.push_back((UpcycledLogits(target, w) - want).abs().max().item<double>());
  }
  EXPECT_GT(diffs[0], 0);
  const double ratio = diffs[1] / diffs[0];
  EXPECT_GT(ratio, 5) << diffs[0] << " " << diffs[1];
  EXPECT_LT(ratio, 20) << diffs[0] << " " << diffs[1];
}

TEST(UpcycleTest, RefusesWhatCannotBeUpcycledNamingBothShapes) {
  model::Transformer dense(Dense(), 3, at::kCPU);
  {
    model::ModelConfig target = Dense();
    target.d_model = 64;
    target.moe.num_experts = 4;
    target.moe.top_k = 2;
    InitialWeights w = DenseWeights(dense);
    absl::Status s = UpcycleWeights(0, 1, &target, &w);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("model.init_from.upcycle"), HasSubstr("d_model=32"),
                                   HasSubstr("d_model=64"), HasSubstr("model.d_model")));
  }
  {
    model::ModelConfig already = Dense();
    already.moe.num_experts = 4;
    already.moe.top_k = 2;
    model::Transformer moe(already, 3, at::kCPU);
    model::ModelConfig target = already;
    target.moe.num_experts = 8;
    InitialWeights w = DenseWeights(moe);
    absl::Status s = UpcycleWeights(0, 1, &target, &w);
    EXPECT_THAT(s.message(), AllOf(HasSubstr("already Mixture-of-Experts"),
                                   HasSubstr("moe=4x2"), HasSubstr("moe=8x2")));
  }
  {
    model::ModelConfig target = Dense();
    target.moe.num_experts = 4;
    target.moe.top_k = 1;
    InitialWeights w = DenseWeights(dense);
    EXPECT_THAT(UpcycleWeights(0, 1, &target, &w).message(), HasSubstr("top_k >= 2"));
  }
}

TEST(DistillKlTest, IsZeroForEqualLogitsAndMatchesTheDefinition) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor s = at::randn({5, 7}, gen, at::kFloat);
  const at::Tensor t = at::randn({5, 7}, gen, at::kFloat);
  const at::Tensor targets = at::tensor(std::vector<int64_t>{1, 2, -100, 3, 4}, at::kLong);
  EXPECT_EQ(DistillKlSum(s, s, targets, 2.0).item<double>(), 0.0);
  // By hand, at T = 2, the third row (no target) left out.
  double want = 0;
  for (int64_t i : {0, 1, 3, 4}) {
    const at::Tensor pt = at::softmax(t[i] / 2.0, -1), ps = at::softmax(s[i] / 2.0, -1);
    want += (pt * (pt.log() - ps.log())).sum().item<double>();
  }
  EXPECT_NEAR(DistillKlSum(s, t, targets, 2.0).item<double>(), want, 1e-5);
}

// ---- Through the trainer, on fortunes ----

std::string g_dir;

class Recorder : public TrainEvents {
 public:
  void OnStart(const RunInfo& i) override { info = i; }
  void OnStep(const StepMetrics& m) override { steps.push_back(m); }
  void OnEval(const EvalMetrics& e) override { evals.push_back(e); }
  void OnCheckpoint(const CheckpointInfo& c) override { checkpoints.push_back(c); }
  RunInfo info;
  std::vector<StepMetrics> steps;
  std::vector<EvalMetrics> evals;
  std::vector<CheckpointInfo> checkpoints;
};

class GrowTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    char dir[] = "/tmp/tally_grow_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    g_dir = dir;
    data::WriteFortunes(g_dir + "/train", {"fortunes.u8", "science.u8"});
    data::WriteFortunes(g_dir + "/val", {"people.u8"});
    // The dense model everything here starts from: 2 layers, 20 steps.
    TrainConfig c = Base();
    c.max_steps = 20;
    c.eval_interval_steps = 20;
    c.checkpoint_dir = g_dir + "/dense";
    Recorder r;
    TrainResult result = Train(c, &r, nullptr);
    ASSERT_EQ(result.outcome, TrainResult::Outcome::kSucceeded) << result.reason;
    dense_ = r.checkpoints.back();
    dense_val_loss_ = r.evals.back().val_loss;
  }

  static TrainConfig Base() {
    TrainConfig c;
    c.model.num_layers = 2;
    c.model.d_model = 32;
    c.model.num_heads = 2;
    c.data.train_path = g_dir + "/train";
    c.data.val_path = g_dir + "/val";
    c.data.seq_len = 128;
    c.micro_batch_rows = 4;
    c.max_steps = 6;
    c.optimizer.lr = 3e-3;
    c.optimizer.warmup_steps = 2;
    c.optimizer.grad_clip = 1.0;
    c.eval_interval_steps = 3;
    c.eval_tokens = 4096;
    c.seed = 1;
    return c;
  }

  static TrainConfig Upcycled() {
    TrainConfig c = Base();
    c.init_from_checkpoint = dense_.path;
    c.upcycle = true;
    c.model.moe.num_experts = 4;
    c.model.moe.top_k = 2;
    c.optimizer.moe_aux_loss_coef = 0.01;
    return c;
  }

  static nlohmann::json Metadata(const std::string& path) {
    auto data = ReadCheckpoint(path, "");
    EXPECT_TRUE(data.ok()) << data.status();
    return data.ok() ? nlohmann::json::parse(data->metadata_json) : nlohmann::json();
  }

  // A copy of the dense checkpoint with `edit` applied to its metadata and
  // tensors.
  template <typename Edit>
  static std::string EditedDense(const std::string& name, Edit edit) {
    auto data = ReadCheckpoint(dense_.path, "");
    EXPECT_TRUE(data.ok()) << data.status();
    nlohmann::json meta = nlohmann::json::parse(data->metadata_json);
    edit(&meta, &data->tensors);
    data->metadata_json = meta.dump();
    const std::string path = g_dir + "/" + name;
    EXPECT_TRUE(WriteCheckpoint(path, *data).ok());
    return path;
  }

  static CheckpointInfo dense_;
  static double dense_val_loss_;
};

CheckpointInfo GrowTest::dense_;
double GrowTest::dense_val_loss_ = 0;

// The upcycled job starts where the dense one ended (its step-0 evaluation
// is the dense model's last), records where its weights came from in every
// checkpoint (resumed ones too), and exports as Mixtral.
TEST_F(GrowTest, UpcycledJobStartsAsTheDenseModelAndRecordsItsSource) {
  TrainConfig c = Upcycled();
  c.checkpoint_dir = g_dir + "/up";
  c.checkpoint_interval_steps = 3;
  c.max_steps = 3;
  Recorder r;
  TrainResult result = Train(c, &r, nullptr);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kSucceeded) << result.reason;
  ASSERT_FALSE(r.evals.empty());
  EXPECT_EQ(r.evals.front().step, 0);
  EXPECT_NEAR(r.evals.front().val_loss, dense_val_loss_, 1e-5 * dense_val_loss_);
  EXPECT_GT(r.info.num_parameters, r.info.num_active_parameters);
  ASSERT_FALSE(r.checkpoints.empty());
  const nlohmann::json meta = Metadata(r.checkpoints.back().path);
  EXPECT_EQ(meta["init_from"]["kind"], "checkpoint");
  EXPECT_EQ(meta["init_from"]["path"], dense_.path);
  EXPECT_EQ(meta["init_from"]["sha256"], dense_.sha256);
  EXPECT_EQ(meta["init_from"]["step"], 20);
  EXPECT_EQ(meta["init_from"]["upcycled"]["step"], 0);
  EXPECT_EQ(meta["init_from"]["upcycled"]["num_experts"], 4);
  EXPECT_EQ(meta["model"]["moe"]["num_experts"], 4);

  // A resumed attempt keeps the record.
  TrainConfig resumed = c;
  resumed.resume_path = r.checkpoints.back().path;
  resumed.max_steps = 6;
  resumed.checkpoint_dir = g_dir + "/up2";
  Recorder r2;
  result = Train(resumed, &r2, nullptr);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kSucceeded) << result.reason;
  EXPECT_EQ(Metadata(r2.checkpoints.back().path)["init_from"]["upcycled"]["step"], 0);

  auto model = ReadCheckpointModel(r2.checkpoints.back().path);
  ASSERT_TRUE(model.ok()) << model.status();
  auto exported = ExportHf(*model, g_dir + "/up-hf", {});
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->architecture, "MixtralForCausalLM");

  // An MoE checkpoint is not upcycled again.
  TrainConfig again = Upcycled();
  again.init_from_checkpoint = r2.checkpoints.back().path;
  again.model.moe.num_experts = 8;
  Recorder r3;
  result = Train(again, &r3, nullptr);
  EXPECT_EQ(result.outcome, TrainResult::Outcome::kFailed);
  EXPECT_THAT(result.reason, AllOf(HasSubstr("already Mixture-of-Experts"), HasSubstr("moe=4x2"),
                                   HasSubstr("moe=8x2")));
}

TrainConfig Student(const std::string& teacher) {
  TrainConfig c = GrowTest::Base();
  c.model.num_layers = 1;
  c.distill.teacher_checkpoint = teacher;
  c.distill.temperature = 2;
  return c;
}

// alpha 0: the teacher runs (and is counted) but the loss is plain
// cross-entropy, bit for bit.
TEST_F(GrowTest, AlphaZeroTrainsExactlyAsWithoutATeacher) {
  TrainConfig plain = Student("");
  plain.distill = {};
  TrainConfig zero = Student(dense_.path);
  zero.distill.alpha = 0;
  Recorder a, b;
  ASSERT_EQ(Train(plain, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  TrainResult r = Train(zero, &b, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].train_loss, b.steps[i].train_loss) << "step " << i + 1;
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm) << "step " << i + 1;
    EXPECT_GT(b.steps[i].distill_kl, 0);
  }
  ASSERT_EQ(a.evals.size(), b.evals.size());
  for (size_t i = 0; i < a.evals.size(); ++i) EXPECT_EQ(a.evals[i].val_loss, b.evals[i].val_loss);
  // The teacher's forward pass counts: a third of its training FLOPs.
  EXPECT_EQ(a.info.teacher_parameters, 0);
  EXPECT_GT(b.info.teacher_parameters, b.info.num_parameters);
  EXPECT_GT(b.info.teacher_flops_per_token, 0);
  EXPECT_DOUBLE_EQ(b.info.flops_per_token, a.info.flops_per_token + b.info.teacher_flops_per_token);
  // The memory estimate holds the teacher's weights (no gradients, no
  // optimizer state for it).
  EXPECT_EQ(a.info.state_bytes, 16 * a.info.num_resident_parameters);
  EXPECT_EQ(b.info.state_bytes, 16 * b.info.num_resident_parameters + 4 * b.info.teacher_parameters);
}

// A student that starts from the teacher's own weights, at T = 1, has
// nothing to learn from it at step 0; then it moves away and the KL grows.
TEST_F(GrowTest, KlIsZeroAtStepZeroForTheTeachersOwnWeights) {
  TrainConfig c = Student(dense_.path);
  c.model.num_layers = 2;
  c.init_from_checkpoint = dense_.path;
  c.distill.temperature = 1;
  c.distill.alpha = 0.5;
  c.max_steps = 3;
  Recorder r;
  TrainResult result = Train(c, &r, nullptr);
  ASSERT_EQ(result.outcome, TrainResult::Outcome::kSucceeded) << result.reason;
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_LT(std::abs(r.steps[0].distill_kl), 1e-7);  // the first step's forward: step-0 weights
  EXPECT_GT(r.steps[2].distill_kl, 1e-6);
}

TEST_F(GrowTest, RefusesABadTeacherNamingTheField) {
  const std::string nan = EditedDense("nan.ckpt", [](nlohmann::json*, auto* tensors) {
    for (auto& [name, t] : *tensors) {
      if (name == "model.layers.0.wo") t[0][0] = std::nan("");
    }
  });
  const std::string other_vocab = EditedDense("vocab.ckpt", [](nlohmann::json* meta, auto*) {
    (*meta)["tokenizer"]["vocab_size"] = 300;
  });
  const std::string wider = EditedDense("wider.ckpt", [](nlohmann::json* meta, auto*) {
    (*meta)["model"]["d_ff"] = 128;  // the tensors are still the file's own width (96)
  });
  TrainConfig declared = Student(dense_.path);
  declared.distill.declared = model::ModelConfig{};
  declared.distill.declared->num_layers = 2;
  declared.distill.declared->d_model = 64;
  declared.distill.declared->num_heads = 2;
  declared.distill.declared->moe.num_experts = 0;
  struct Case {
    const char* name;
    TrainConfig config;
    std::vector<std::string> want;
  };
  for (const Case& c : {
           Case{"NaN weights", Student(nan), {"training.distill.teacher", "NaN"}},
           Case{"another vocabulary",
                Student(other_vocab),
                {"training.distill.teacher", "\"vocab_size\":300", "\"vocab_size\":258",
                 "vocab_size differs"}},
           Case{"declared shape",
                declared,
                {"training.distill.teacher.model.d_model is 64", "d_model=32"}},
           Case{"missing file", Student(g_dir + "/absent.ckpt"), {"training.distill.teacher"}},
           Case{"tensors unlike the metadata",
                Student(wider),
                {"training.distill.teacher", "the model its metadata describes has"}},
       }) {
    SCOPED_TRACE(c.name);
    Recorder r;
    TrainResult result = Train(c.config, &r, nullptr);
    EXPECT_EQ(result.outcome, TrainResult::Outcome::kFailed);
    EXPECT_FALSE(result.retryable);
    for (const std::string& w : c.want) EXPECT_THAT(result.reason, HasSubstr(w));
    EXPECT_TRUE(r.steps.empty());
  }
}

}  // namespace
}  // namespace tally::train
