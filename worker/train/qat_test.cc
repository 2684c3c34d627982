// Quantization-aware training and the quantized evaluation through the
// trainer on a real corpus: the loss of the quantized model at every
// evaluation, training left alone by a post-training evaluation, exact
// resume, composition with MoE and BF16, and the refusals.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/test_fortunes.h"
#include "worker/train/model_io.h"
#include "worker/train/trainer.h"

namespace tally::train {
namespace {

using ::testing::HasSubstr;

class Recorder : public TrainEvents {
 public:
  void OnStep(const StepMetrics& m) override { steps.push_back(m); }
  void OnEval(const EvalMetrics& e) override { evals.push_back(e); }
  void OnCheckpoint(const CheckpointInfo& c) override { checkpoints.push_back(c); }
  std::vector<StepMetrics> steps;
  std::vector<EvalMetrics> evals;
  std::vector<CheckpointInfo> checkpoints;
};

class QatTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/tally_qat_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    data::WriteFortunes(dir_ + "/train", {"fortunes.u8", "science.u8"});
    data::WriteFortunes(dir_ + "/val", {"people.u8"});
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }

  static TrainConfig Tiny() {
    TrainConfig c;
    c.model.num_layers = 2;
    c.model.d_model = 32;
    c.model.num_heads = 2;
    c.data.train_path = dir_ + "/train";
    c.data.seq_len = 128;
    c.micro_batch_rows = 4;
    c.global_batch_tokens = 1024;
    c.max_steps = 8;
    c.optimizer.lr = 3e-3;
    c.optimizer.warmup_steps = 3;
    c.optimizer.grad_clip = 1.0;
    c.eval_interval_steps = 4;
    c.eval_tokens = 2048;
    c.seed = 3;
    return c;
  }
  static model::WeightQuantization Q(model::GgmlQuant f, model::QuantLayers l) {
    model::WeightQuantization q;
    q.format = f;
    q.layers = l;
    return q;
  }
  static std::string NewDir(const std::string& name) {
    const std::string d = dir_ + "/" + name;
    std::filesystem::create_directories(d);
    return d;
  }
  static std::string dir_;
};
std::string QatTest::dir_;

TEST_F(QatTest, EveryEvaluationReportsTheQuantizedLossAndAResumeContinuesExactly) {
  TrainConfig c = Tiny();
  c.qat = c.eval_quantized = Q(model::GgmlQuant::kQ4_0, model::QuantLayers::kAllLinear);
  c.checkpoint_dir = NewDir("qat");
  c.checkpoint_interval_steps = 4;
  Recorder a;
  TrainResult r = Train(c, &a, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(a.evals.size(), 3u);  // 0, 4, 8
  for (const EvalMetrics& e : a.evals) {
    ASSERT_TRUE(e.quantized_val_loss.has_value()) << "step " << e.step;
    EXPECT_TRUE(std::isfinite(*e.quantized_val_loss));
    EXPECT_NE(*e.quantized_val_loss, e.val_loss) << "step " << e.step;
  }
  EXPECT_LT(*a.evals.back().quantized_val_loss, *a.evals.front().quantized_val_loss - 0.5);

  // The checkpoint says what the model was trained for (tally-export's
  // default format).
  auto m = ReadCheckpointModel(a.checkpoints.back().path);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(m->qat.has_value());
  EXPECT_TRUE(*m->qat == *c.qat);

  // QAT trains another function than plain training does.
  TrainConfig plain = Tiny();
  Recorder p;
  ASSERT_EQ(Train(plain, &p, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  EXPECT_EQ(p.steps[0].train_loss == a.steps[0].train_loss, false);
  EXPECT_FALSE(p.evals.back().quantized_val_loss.has_value());

  // Resumed from step 4: the same curve, bit for bit.
  TrainConfig resumed = c;
  resumed.checkpoint_dir = NewDir("qat-resumed");
  resumed.resume_path = a.checkpoints[0].path;
  Recorder b;
  r = Train(resumed, &b, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_EQ(b.steps.size(), 4u);
  for (size_t i = 0; i < b.steps.size(); ++i) {
    EXPECT_EQ(b.steps[i].train_loss, a.steps[4 + i].train_loss) << "step " << b.steps[i].step;
  }
  EXPECT_EQ(*b.evals.back().quantized_val_loss, *a.evals.back().quantized_val_loss);

  // Another QAT (or none) is another run: refused, naming it.
  for (const auto& other : std::vector<std::optional<model::WeightQuantization>>{
           Q(model::GgmlQuant::kQ8_0, model::QuantLayers::kAllLinear), std::nullopt}) {
    TrainConfig wrong = resumed;
    wrong.qat = wrong.eval_quantized = other;
    Recorder w;
    r = Train(wrong, &w, nullptr);
    EXPECT_EQ(r.outcome, TrainResult::Outcome::kFailed);
    EXPECT_THAT(r.reason, HasSubstr("qat is q4_0/all_linear there"));
  }
}

TEST_F(QatTest, APostTrainingQuantizedEvaluationLeavesTrainingAlone) {
  TrainConfig plain = Tiny();
  Recorder a;
  ASSERT_EQ(Train(plain, &a, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  TrainConfig ptq = Tiny();
  ptq.eval_quantized = Q(model::GgmlQuant::kQ4_0, model::QuantLayers::kFfn);
  Recorder b;
  ASSERT_EQ(Train(ptq, &b, nullptr).outcome, TrainResult::Outcome::kSucceeded);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_EQ(a.steps[i].train_loss, b.steps[i].train_loss);
  ASSERT_EQ(a.evals.size(), b.evals.size());
  for (size_t i = 0; i < a.evals.size(); ++i) {
    EXPECT_EQ(a.evals[i].val_loss, b.evals[i].val_loss);
    ASSERT_TRUE(b.evals[i].quantized_val_loss.has_value());
    // Four bits cost something, not everything.
    EXPECT_NE(*b.evals[i].quantized_val_loss, b.evals[i].val_loss);
    EXPECT_NEAR(*b.evals[i].quantized_val_loss, b.evals[i].val_loss, 0.05 * b.evals[i].val_loss);
  }
}

TEST_F(QatTest, ComposesWithMoeAndBf16) {
  TrainConfig c = Tiny();
  c.model.moe.num_experts = 4;
  c.model.moe.top_k = 2;
  c.optimizer.moe_aux_loss_coef = 0.01;
  c.bf16 = true;
  c.qat = c.eval_quantized = Q(model::GgmlQuant::kQ8_0, model::QuantLayers::kFfn);
  Recorder a;
  TrainResult r = Train(c, &a, nullptr);
  ASSERT_EQ(r.outcome, TrainResult::Outcome::kSucceeded) << r.reason;
  ASSERT_TRUE(a.evals.back().quantized_val_loss.has_value());
  EXPECT_LT(*a.evals.back().quantized_val_loss, *a.evals.front().quantized_val_loss - 0.3);
  // Q8_0 is close to the high-precision weights.
  EXPECT_NEAR(*a.evals.back().quantized_val_loss, a.evals.back().val_loss, 0.01);
}

TEST_F(QatTest, RefusesWhatItCannotTrainNamingTheField) {
  TrainConfig fp8 = Tiny();
  fp8.fp8 = true;
  fp8.qat = fp8.eval_quantized = Q(model::GgmlQuant::kQ4_0, model::QuantLayers::kFfn);
  EXPECT_THAT(fp8.Validate().message(), HasSubstr("training.qat: cannot be combined with FP8"));
  TrainConfig odd = Tiny();
  odd.model.d_model = 48;
  odd.model.num_heads = 2;
  odd.eval_quantized = Q(model::GgmlQuant::kQ8_0, model::QuantLayers::kFfn);
  EXPECT_THAT(odd.Validate().message(),
              HasSubstr("training.eval_quantized: quantizes blocks of 32 weights"));
  TrainConfig mixed = Tiny();
  mixed.qat = Q(model::GgmlQuant::kQ4_0, model::QuantLayers::kFfn);
  mixed.eval_quantized = Q(model::GgmlQuant::kQ8_0, model::QuantLayers::kFfn);
  EXPECT_THAT(mixed.Validate().message(), HasSubstr("training.eval_quantized: with training.qat"));
}

}  // namespace
}  // namespace tally::train
