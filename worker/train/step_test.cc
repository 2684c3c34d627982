// The pieces of one training step (step.h) on their own: which micro-batches
// a rank builds, what ForwardBackward sums and the gradients it leaves, and
// the step's MoE and FP8 reports.
#include "worker/train/step.h"

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/test_fortunes.h"

namespace tally::train {
namespace {

class StepTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    at::set_num_threads(1);
    char dir[] = "/tmp/tally_step_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    prefix_ = new std::string(std::string(dir) + "/train");
    data::WriteFortunes(*prefix_, {"people.u8"});
  }

  void SetUp() override {
    auto d = data::Dataset::Open(*prefix_, 0);
    ASSERT_TRUE(d.ok()) << d.status();
    dataset_ = std::move(*d);
    c_.data.seq_len = 64;
    c_.micro_batch_rows = 2;
    c_.model.num_layers = 1;
    c_.model.d_model = 16;
    c_.model.num_heads = 2;
  }

  data::RowStream Rows() const {
    data::PackOptions pack;
    pack.seq_len = c_.data.seq_len;
    pack.seed = 1;
    return data::RowStream(dataset_.get(), pack);
  }

  model::ModelConfig Model() const {
    model::ModelConfig m = c_.model;
    m.vocab_size = dataset_->metadata().vocab_size;
    return m;
  }

  static std::string* prefix_;
  std::unique_ptr<data::Dataset> dataset_;
  TrainConfig c_;
};

std::string* StepTest::prefix_ = nullptr;

// Every rank walks every micro-batch of the step (the cursor stays global)
// and builds its own, the i-th going to rank i % world_size; the step's
// targets and attended pairs are every rank's.
TEST_F(StepTest, EachRankBuildsItsShareOfTheStep) {
  data::RowStream all = Rows();
  const StepBatch one = NextStepBatch(c_, 4, *dataset_, &all);
  ASSERT_EQ(one.micro.size(), 4u);
  int64_t targets = 0, real = 0;
  for (const auto& mb : one.micro) targets += mb.num_targets, real += mb.real_tokens;
  EXPECT_EQ(one.targets, targets);
  EXPECT_EQ(one.real_tokens, real);
  EXPECT_GT(one.attended_keys, 0);

  TrainConfig two = c_;
  two.parallel.world_size = 2;
  for (int rank : {0, 1}) {
    two.parallel.rank = rank;
    data::RowStream rows = Rows();
    const StepBatch b = NextStepBatch(two, 4, *dataset_, &rows);
    ASSERT_EQ(b.micro.size(), 2u);
    EXPECT_EQ(b.micro[0].tokens, one.micro[rank].tokens);
    EXPECT_EQ(b.micro[1].tokens, one.micro[rank + 2].tokens);
    EXPECT_EQ(b.targets, one.targets);  // the whole step's
    EXPECT_EQ(b.attended_keys, one.attended_keys);
    EXPECT_EQ(rows.cursor().row, all.cursor().row);
  }
}

// ForwardBackward's loss is the cross-entropy summed over the step; its
// gradients are those of the mean over the step's targets, accumulated over
// the micro-batches; a stop before a micro-batch computes nothing more.
TEST_F(StepTest, ForwardBackwardSumsTheStepAndLeavesTheMeanLossGradient) {
  data::RowStream rows = Rows();
  const StepBatch batch = NextStepBatch(c_, 3, *dataset_, &rows);
  model::Transformer m(Model(), 1, at::kCPU);
  const StepModel sm{&m, at::kCPU, model::AttentionKernel::kMaskedSdpa, nullptr};
  auto totals = ForwardBackward(c_, 3, batch, sm, [] { return false; });
  ASSERT_TRUE(totals.has_value());
  EXPECT_EQ(totals->real_tokens, batch.real_tokens);
  EXPECT_EQ(totals->distill_kl_sum, 0);
  std::vector<at::Tensor> grads;
  for (auto& p : m.parameters()) grads.push_back(p.value.grad().clone());

  // By hand: the same passes, one loss.
  model::Transformer ref(Model(), 1, at::kCPU);
  double sum = 0;
  at::Tensor loss = at::zeros({});
  for (const auto& mb : batch.micro) {
    const Losses l = LossSum(ref, ToDevice(mb, at::kCPU), model::AttentionKernel::kMaskedSdpa);
    sum += l.ce_sum.item<double>();
    loss = loss + l.ce_sum;
  }
  (loss / static_cast<double>(batch.targets)).backward();
  EXPECT_NEAR(totals->loss_sum, sum, 1e-6 * sum);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor want = ref.parameters()[i].value.grad();
    EXPECT_TRUE(at::allclose(grads[i], want, 1e-4, 1e-7)) << ref.parameters()[i].name;
  }

  int calls = 0;
  model::Transformer stopped(Model(), 1, at::kCPU);
  const StepModel ss{&stopped, at::kCPU, model::AttentionKernel::kMaskedSdpa, nullptr};
  EXPECT_FALSE(ForwardBackward(c_, 3, batch, ss, [&] { return ++calls > 1; }).has_value());
  EXPECT_EQ(calls, 2);
}

// With a teacher, ForwardBackward adds alpha * KL * T^2 to the loss it
// differentiates and reports the KL; the reported cross-entropy is the
// student's own.
TEST_F(StepTest, ATeachersKlIsReportedAndWeighted) {
  data::RowStream rows = Rows();
  const StepBatch batch = NextStepBatch(c_, 1, *dataset_, &rows);
  model::Transformer student(Model(), 1, at::kCPU), teacher(Model(), 2, at::kCPU);
  for (auto& p : teacher.parameters()) p.value.set_requires_grad(false);
  StepModel sm{&student, at::kCPU, model::AttentionKernel::kMaskedSdpa, nullptr};
  sm.teacher = &teacher;
  sm.temperature = 2;
  sm.alpha = 1;
  auto totals = ForwardBackward(c_, 1, batch, sm, [] { return false; });
  ASSERT_TRUE(totals.has_value());
  const DeviceBatch d = ToDevice(batch.micro[0], at::kCPU);
  at::NoGradGuard no_grad;
  const Losses l = LossSum(student, d, model::AttentionKernel::kMaskedSdpa);
  const at::Tensor t = teacher.Forward(d.input, model::AttentionKernel::kMaskedSdpa);
  const double kl =
      DistillKlSum(l.logits_NV, t.reshape({-1, t.size(-1)}), d.targets_N, 2).item<double>();
  EXPECT_GT(kl, 0);
  EXPECT_NEAR(totals->distill_kl_sum, kl, 1e-6 * kl);
  EXPECT_NEAR(totals->loss_sum, l.ce_sum.item<double>(), 1e-6 * totals->loss_sum);
  // alpha 1: the gradient is the KL's alone; the teacher gets none.
  for (const auto& p : teacher.parameters()) EXPECT_FALSE(p.value.grad().defined()) << p.name;
}

TEST(StepReportsTest, MoeLoadsAndFp8Health) {
  std::map<int64_t, dist::MoeLayerLoad> moe;
  moe[1] = {{30, 10, 0, 0}, 0.5, 40, 4};
  moe[3] = {{10, 10, 10, 10}, 1.3, 40, 0};
  StepMetrics m;
  ReportMoeLoads(moe, &m);
  ASSERT_EQ(m.moe.size(), 2u);
  EXPECT_DOUBLE_EQ(m.moe[0].max_over_mean_load, 3.0);  // 30 over a mean of 10
  EXPECT_DOUBLE_EQ(m.moe[0].dropped_fraction, 0.1);
  EXPECT_DOUBLE_EQ(m.moe[1].max_over_mean_load, 1.0);
  EXPECT_DOUBLE_EQ(m.moe_max_over_mean_load, 3.0);

  precision::Fp8Stats st;
  st.elements = 1000;
  st.overflows = 10;  // 1%: still sound
  st.fp8_products = 3;
  st.total_products = 4;
  st.amax["ffn.input"] = 2.5;
  StepMetrics f;
  EXPECT_TRUE(Fp8Report(st, &f).good());
  EXPECT_DOUBLE_EQ(f.fp8_product_fraction, 0.75);
  st.overflows = 11;
  EXPECT_FALSE(Fp8Report(st, &f).good());
  st.overflows = 0;
  st.amax["attention.grad"] = std::nan("");
  EXPECT_FALSE(Fp8Report(st, &f).good());
}

}  // namespace
}  // namespace tally::train
